// CPU backend: exact and multithreaded. Counting sort into cells of size >= R, then each thread
// takes slices of particles and scans the 27 cells around each one (as 9 runs of 3 cells, which
// are contiguous in memory). Buffers are members, reused across calls; nothing is allocated per
// point or per neighbor.
#include "Backend.h"
#include "OperationPlan.h"
#include "Parallel.h"
#include "Timer.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <numeric>
#include <thread>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

class CpuBackend final : public BackendImplementation
{
public:
  explicit CpuBackend(int threads) : threads_(std::max(1, threads)) {}

  void prepareCoordinates(const Points& points, int threads, Problem& problem) override
  {
    coordinates_.resize(static_cast<std::size_t>(3 * points.count));
    prepareCoordinatesOnHost(points, threads, coordinates_.data(), problem.extent);
    problem.xyz = coordinates_.data();
  }

  void run(const Problem& problem, Report& report) override
  {
    problem_ = &problem;
    report_ = &report;
    const std::int64_t n = problem.count;
    const ProgressReporter& progress = *problem.progress;
    progressStep_ = 0;
    progressSteps_ = passCount(problem) + 1;

    // Counting Sort is the CPU's fast method; Brute Force is there for validation.
    method_ = problem.method == Method::BruteForce ? Method::BruteForce : Method::CountingSort;
    report.method = method_;
    Timer timer;
    ordered_.resize(n);
    orderToInput_.clear();
    if (method_ == Method::BruteForce)
    {
      for (std::int64_t i = 0; i < n; ++i)
      {
        ordered_[i] = particleAt(i);
      }
    }
    else
    {
      sortIntoCells();
    }
    addStage(report, "sort", timer.milliseconds());
    progress(nextProgress(), "sort");

    runOperation(*this, problem);

    report.backend = Backend::CPU;
    report.device = "CPU (" + std::to_string(threads_) + " threads)";
    report.extraDeviceBytes = 0;
  }

  // --- executor primitives (OperationPlan.h) -------------------------------------------------
  void setWeights(WeightMode mode)
  {
    for (std::int64_t s = 0; s < problem_->count; ++s)
    {
      ordered_[s].w = mode == WeightMode::One ? 1.0f : massAt(inputIndex(s));
    }
  }
  void divideWeightsByDensity(const float* orderedDensity)
  {
    for (std::int64_t s = 0; s < problem_->count; ++s)
    {
      ordered_[s].w /= orderedDensity[s];
    }
  }
  std::int32_t* countOutput() { return problem_->neighborCount; }
  float* densityOutput() { return problem_->density; }
  float* orderedDensity()
  {
    orderedDensity_.resize(problem_->count);
    return orderedDensity_.data();
  }
  const float* gatherValues(std::size_t array, int first, int count)
  {
    const SmoothedArray& source = (*problem_->smoothed)[array];
    gathered_.resize(static_cast<std::size_t>(problem_->count) * count);
    for (std::int64_t s = 0; s < problem_->count; ++s)
    {
      const float* from = source.values + inputIndex(s) * source.components + first;
      std::copy(from, from + count, gathered_.data() + s * count);
    }
    return gathered_.data();
  }
  float* smoothingOutput(std::size_t array) { return (*problem_->smoothed)[array].output; }
  void finishOutputs()
  {
    if (problem_->operation == Operation::NeighborCount)
    {
      std::int64_t pairs = 0;
      for (std::int64_t i = 0; i < problem_->count; ++i)
      {
        pairs += problem_->neighborCount[i];
      }
      report_->neighborPairs = pairs;
    }
  }

  template <class Op>
  void search(const Op& op, const char* stage)
  {
    Timer timer;
    const double from = nextProgress();
    const double to = from + 1.0 / progressSteps_;
    const float r2max = problem_->radiusSquared;
    const Particle* particles = ordered_.data();
    const std::int64_t n = problem_->count;
    if (method_ == Method::BruteForce)
    {
      parallelFor(threads_, n, 256, problem_->progress, from, to, stage,
        [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i)
          {
            const Particle pi = particles[i];
            RegisterSums<Op> acc;
            for (std::int64_t j = 0; j < n; ++j)
            {
              const float r2 = squaredDistance(pi, particles[j]);
              if (r2 <= r2max)
              {
                acc.add(op, static_cast<int>(j), particles[j], r2);
              }
            }
            acc.finish(op, static_cast<int>(i), static_cast<int>(i));
          }
        });
    }
    else
    {
      const Grid grid = grid_;
      const int* cellStart = cellStart_.data();
      const int* orderToInput = orderToInput_.data();
      parallelFor(threads_, n, 2048, problem_->progress, from, to, stage,
        [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t s = begin; s < end; ++s)
          {
            const Particle pi = particles[s];
            const int cx = grid.cellX(pi), cy = grid.cellY(pi), cz = grid.cellZ(pi);
            const int x0 = std::max(cx - 1, 0), x1 = std::min(cx + 1, grid.dimX - 1);
            RegisterSums<Op> acc;
            for (int z = std::max(cz - 1, 0); z <= std::min(cz + 1, grid.dimZ - 1); ++z)
            {
              for (int y = std::max(cy - 1, 0); y <= std::min(cy + 1, grid.dimY - 1); ++y)
              {
                // Cells x0..x1 of one row are consecutive: one run of particles.
                const int first = cellStart[grid.cellIndex(x0, y, z)];
                const int last = cellStart[grid.cellIndex(x1, y, z) + 1];
                for (int j = first; j < last; ++j)
                {
                  const float r2 = squaredDistance(pi, particles[j]);
                  if (r2 <= r2max)
                  {
                    acc.add(op, j, particles[j], r2);
                  }
                }
              }
            }
            acc.finish(op, static_cast<int>(s), orderToInput[s]);
          }
        });
    }
    addStage(*report_, stage, timer.milliseconds());
  }

private:
  static int passCount(const Problem& p)
  {
    if (p.operation != Operation::Smoothing)
    {
      return 1;
    }
    int passes = p.normalization == Normalization::SPH ? 1 : 0;
    for (const auto& array : *p.smoothed)
    {
      passes += (array.components + maxComponentsPerPass - 1) / maxComponentsPerPass;
    }
    return passes;
  }
  double nextProgress() { return double(progressStep_++) / progressSteps_; }

  Particle particleAt(std::int64_t i) const
  {
    const float* p = problem_->xyz + 3 * i;
    return Particle{ p[0], p[1], p[2], 1.0f };
  }
  float massAt(std::int64_t i) const
  {
    return problem_->mass ? problem_->mass[i] : problem_->constantMass;
  }
  std::int64_t inputIndex(std::int64_t s) const { return orderToInput_.empty() ? s : orderToInput_[s]; }

  void sortIntoCells()
  {
    const std::int64_t n = problem_->count;
    grid_ = makeGrid(problem_->extent, problem_->radius, std::max<std::int64_t>(n, 1 << 16) * 2);
    const std::int64_t cells = grid_.cellCount();
    cellOfPoint_.resize(n);
    for (std::int64_t i = 0; i < n; ++i)
    {
      cellOfPoint_[i] = grid_.cellOf(particleAt(i));
    }
    cellStart_.assign(cells + 1, 0);
    for (std::int64_t i = 0; i < n; ++i)
    {
      ++cellStart_[cellOfPoint_[i] + 1];
    }
    std::partial_sum(cellStart_.begin(), cellStart_.end(), cellStart_.begin());
    // Stable scatter: points keep their input order inside a cell, so results are repeatable.
    cursor_.assign(cellStart_.begin(), cellStart_.end() - 1);
    orderToInput_.resize(n);
    for (std::int64_t i = 0; i < n; ++i)
    {
      const int s = cursor_[cellOfPoint_[i]]++;
      ordered_[s] = particleAt(i);
      orderToInput_[s] = static_cast<int>(i);
    }
  }

  int threads_;
  Method method_ = Method::CountingSort;
  const Problem* problem_ = nullptr;
  Report* report_ = nullptr;
  int progressStep_ = 0;
  int progressSteps_ = 1;
  Grid grid_;
  std::vector<float> coordinates_;
  std::vector<Particle> ordered_;
  std::vector<int> orderToInput_;
  std::vector<int> cellOfPoint_;
  std::vector<int> cellStart_;
  std::vector<int> cursor_;
  std::vector<float> orderedDensity_;
  std::vector<float> gathered_;
};

} // namespace

std::unique_ptr<BackendImplementation> makeCpuBackend(int threads)
{
  return std::make_unique<CpuBackend>(threads);
}

} // namespace detail
} // namespace neighborgrid
