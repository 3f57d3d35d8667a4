// CPU backend: exact and multithreaded.
//
// Counting Sort: points are sorted by the key of their cell (CellGrid.h: cells of size R keyed by
// their integer coordinates, occupied cells only), with a stable LSD radix sort, one counting sort
// per 8 bits of key (keys wider than 64 bits: a comparison sort). A hash table finds a cell from
// its key. The search takes the cells in parallel. Each cell finds the 27 cells around it once
// (neighbor keys by key arithmetic) and copies their points into one block of arrays x, y, z (w)
// in its own frame; then all of its points test the whole block in branch-free loops that the
// compiler vectorizes (CpuPairLoops.h: SSE2, AVX2 or AVX-512 as the processor allows). The few
// pairs within rounding of R are decided in double (PairTest.h). Separate queries (probe points,
// grids) still look up the 27 cells around each query.
// Brute Force: every pair, in double; for validation.
// Buffers are members, or per chunk of cells in the search; nothing is allocated per point or per
// neighbor.
#include "Backend.h"
#include "CpuKthNeighbor.h"
#include "CpuPairLoops.h"
#include "HostSort.h"
#include "OperationPlan.h"
#include "Parallel.h"
#include "Slabs.h"
#include "Timer.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <sstream>
#include <numeric>
#include <type_traits>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// A search chunk's buffers for one cell at a time: its neighborhood and the float test's results
/// per point.
struct CellScratch
{
  Neighborhood around;
  std::vector<std::int32_t> counts;
  std::vector<float> sums, carries, distances;
  std::vector<std::uint8_t> band;
  std::vector<std::int32_t> uncertain; // a point's pairs within rounding of R (listUncertain)

  void resize(std::int64_t points)
  {
    const std::size_t n = static_cast<std::size_t>(points);
    if (band.size() < n)
    {
      counts.resize(n);
      sums.resize(n);
      carries.resize(n);
      band.resize(n);
    }
  }
};

class CpuBackend final : public BackendImplementation
{
public:
  CpuBackend(int threads, std::int64_t memoryLimit) : threads_(std::max(1, threads)), memoryLimit_(memoryLimit) {}

  /// Upper bounds of the search's buffers: per point its ordered copy (16 bytes), index (4),
  /// key (8, or 24 when keys are wider than 64 bits), cell start and coordinates (32 at one cell
  /// per point) and lookup slots (32); Brute Force: its copy and the coordinates in double. Not
  /// counted: each search thread's copy of one cell's neighborhood (16 bytes per point of 27
  /// cells), which could only matter for cells so full that their pairs would take hours first.
  std::int64_t bytesNeeded(const Problem& p) override
  {
    const std::int64_t n = p.count;
    std::int64_t bytes = 0;
    if (p.operation == Operation::SmoothingLength)
    {
      return 48 * n; // key, order, cell start and hash slots per point (CpuKthNeighbor.cxx)
    }
    if (p.method == Method::BruteForce)
    {
      bytes = 40 * n;
    }
    else
    {
      const KeyLayout layout = makeKeyLayout(p.lo, p.hi, cellSizeFor(p.radius, 1));
      bytes = n * (16 + 4 + (layout.mode == KeyMode::Wide ? 24 : 8) + 32 + 32);
    }
    if (p.operation == Operation::Smoothing)
    {
      int widest = 0;
      for (const auto& a : *p.smoothed)
      {
        widest = std::max(widest, std::min(a.components, maxComponentsPerPass));
      }
      bytes += 4 * n * widest;
      if (p.normalization == Normalization::SPH)
      {
        bytes += 4 * n;
      }
    }
    return bytes;
  }

  std::int64_t bytesAvailable() override
  {
    return memoryLimit_ > 0 ? memoryLimit_ : std::numeric_limits<std::int64_t>::max();
  }

  void prepareCoordinates(const Points& points, int threads, Problem& problem) override
  {
    findBoundsOnHost(points, threads, problem.lo, problem.hi);
  }

  void run(const Problem& problem, Report& report) override
  {
    if (memoryLimit_ > 0)
    {
      const std::int64_t needed = bytesNeeded(problem);
      if (needed > memoryLimit_)
      {
        std::ostringstream s;
        s << "NeighborGrid: " << problem.count << " points need " << needed
          << " bytes of working memory for the CPU search, but the engine's memory limit is " << memoryLimit_
          << " bytes";
        throw DoesNotFit(s.str(), needed, memoryLimit_);
      }
    }
    problem_ = &problem;
    report_ = &report;
    const ProgressReporter& progress = *problem.progress;
    if (problem.operation == Operation::SmoothingLength)
    {
      runSmoothingLength(problem, report);
      return;
    }
    progressStep_ = 0;
    progressSteps_ = searchPassCount(problem) + 1;
    decidedInDouble_ = 0;

    // Counting Sort is the CPU's fast method; Brute Force is there for validation.
    method_ = problem.method == Method::BruteForce ? Method::BruteForce : Method::CountingSort;
    report.method = method_;
    cellSize_ = cellSizeFor(problem.radius, 1);
    const InputPoints input{ problem.input.xyz, problem.input.type == ScalarType::Float64 };
    pairTest_ = makePairTest(problem.radius, cellSize_, 2.0, input);
    Timer timer;
    if (method_ == Method::BruteForce)
    {
      prepareBruteForce();
    }
    else
    {
      sortIntoCells();
    }
    addStage(report, "sort", timer.milliseconds());
    progress(nextProgress(), "sort");

    if (problem.radiusPass)
    {
      runRadiusPass();
    }
    else
    {
      runOperation(*this, problem);
    }

    report.backend = Backend::CPU;
    report.device = "CPU (" + std::to_string(threads_) + " threads)";
    report.extraDeviceBytes = 0;
    report.pairsDecidedInDouble = decidedInDouble_;
  }

  /// Smoothing Length: its own grids and search (CpuKthNeighbor.h).
  void runSmoothingLength(const Problem& problem, Report& report)
  {
    Timer timer;
    report.radiusLevels = kthNeighborDistancesOnHost(problem.input, problem.kthQueries, problem.neighborTarget, problem.lo, problem.hi,
      threads_, *problem.progress, problem.supportRadius);
    addStage(report, "smoothing length", timer.milliseconds());
    report.method = Method::CountingSort;
    report.backend = Backend::CPU;
    report.device = "CPU (" + std::to_string(threads_) + " threads)";
    report.extraDeviceBytes = 0;
  }

  // --- executor primitives (OperationPlan.h) -------------------------------------------------
  KernelParams kernel() const { return problem_->frameKernel(cellSize_); }
  void setWeights(WeightMode mode)
  {
    parallelSlices(threads_, problem_->count, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t s = begin; s < end; ++s)
      {
        ordered_[s].w = mode == WeightMode::One ? 1.0f : massAt(inputIndex(s));
      }
    });
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
    parallelSlices(threads_, problem_->count, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t s = begin; s < end; ++s)
      {
        const float* from = source.values + inputIndex(s) * source.components + first;
        std::copy(from, from + count, gathered_.data() + s * count);
      }
    });
    return gathered_.data();
  }
  float* smoothingOutput(std::size_t array) { return (*problem_->smoothed)[array].output; }
  std::uint8_t* validOutput() { return problem_->valid; }
  void finishOutputs()
  {
    if (problem_->operation == Operation::NeighborCount)
    {
      std::int64_t pairs = 0;
      for (std::int64_t i = 0; i < problem_->resultCount(); ++i)
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
    std::atomic<std::int64_t> decided{ 0 };
    if (method_ == Method::BruteForce)
    {
      searchBruteForce(op, stage, from, to, decided);
    }
    else
    {
      searchCells(op, stage, from, to, decided);
    }
    decidedInDouble_ += decided.load();
    addStage(*report_, stage, timer.milliseconds());
  }

  /// Every query (Problem::queries) against the particles: the 27 cells of size R around the
  /// query's own cell (or every particle, Brute Force).
  template <class Op>
  void searchQueries(const Op& op, const char* stage)
  {
    const Particle* particles = ordered_.data();
    const PairTest test = pairTest_;
    forEachQuery(stage, [&](std::int64_t q, const double x[3], std::int64_t& decidedHere) {
      RegisterSums<Op> acc;
      forEachCandidate(x, [&](std::int64_t j, float r2, double exactSquared, const float*) {
        if (exactSquared >= 0.0) // Brute Force: decided in double
        {
          if (exactSquared <= test.radiusSquared)
          {
            acc.add(op, static_cast<int>(j), particles[j], r2);
          }
          return;
        }
        const int verdict = test.classify(r2);
        if (verdict == 0)
        {
          return;
        }
        if (verdict < 0)
        {
          ++decidedHere;
          if (!test.exactQuery(x, orderToInput_[j], r2))
          {
            return;
          }
        }
        acc.add(op, static_cast<int>(j), particles[j], r2);
      });
      acc.finish(op, static_cast<int>(q), static_cast<int>(q));
    });
  }

  /// A search of the radius layer (Problem::radiusPass): every query against the particles,
  /// each pair decided by its own radius (RadiusOperations.h).
  void runRadiusPass()
  {
    const RadiusPass& pass = *problem_->radiusPass;
    const std::int64_t n = problem_->count;
    setWeights(WeightMode::Mass);
    const float* orderedRadii = nullptr;
    if (pass.sourceRadii)
    {
      orderedRadii_.resize(static_cast<std::size_t>(n));
      parallelSlices(threads_, n, [&](int, std::int64_t begin, std::int64_t end) {
        for (std::int64_t s = begin; s < end; ++s)
        {
          orderedRadii_[s] = pass.sourceRadii[inputIndex(s)];
        }
      });
      orderedRadii = orderedRadii_.data();
    }
    const float* orderedValues = nullptr;
    if (pass.sum == RadiusSum::Smoothing || pass.sum == RadiusSum::Gradient)
    {
      const int c = pass.components;
      gathered_.resize(static_cast<std::size_t>(n) * c);
      parallelSlices(threads_, n, [&](int, std::int64_t begin, std::int64_t end) {
        for (std::int64_t s = begin; s < end; ++s)
        {
          std::copy(pass.sourceValues + inputIndex(s) * c, pass.sourceValues + (inputIndex(s) + 1) * c,
            gathered_.data() + s * c);
        }
      });
      orderedValues = gathered_.data();
    }
    const InputPoints input{ problem_->input.xyz, problem_->input.type == ScalarType::Float64 };
    withRadiusOperation(pass, problem_->kernelType, problem_->dimension, [&](auto op) {
      using Op = decltype(op);
      setRadiusFrame(op.rule, pairTest_, cellSize_, input, orderToInput_.empty() ? nullptr : orderToInput_.data());
      op.rule.queryRadii = pass.queryRadii;
      op.rule.sourceRadii = orderedRadii;
      op.values = orderedValues;
      op.queryValues = pass.queryValues;
      if constexpr (std::is_integral<typename Op::Value>::value)
      {
        op.output = pass.counts;
      }
      else
      {
        op.output = pass.sums;
      }
      const Particle* particles = ordered_.data();
      forEachQuery("search", [&](std::int64_t q, const double x[3], std::int64_t& decidedHere) {
        const typename Op::Query state = op.query(q);
        RegisterSums<Op> acc;
        unsigned decided = 0;
        forEachCandidate(x, [&](std::int64_t j, float r2, double, const float* d) {
          if (op.rule.takes(state.radius, x, static_cast<int>(j), r2, decided))
          {
            typename Op::Value t[Op::Terms];
            op.pair(t, state, static_cast<int>(j), particles[j], r2, d);
            acc.addTerms(t);
          }
        });
        decidedHere += decided;
        acc.finish(op, static_cast<int>(q), static_cast<int>(q));
      });
    });
  }

private:
  /// visit(q, x, decidedHere) for every query, in parallel, with progress.
  template <class Visit>
  void forEachQuery(const char* stage, Visit visit)
  {
    Timer timer;
    if (method_ != Method::BruteForce)
    {
      ensureLookup();
    }
    const double from = nextProgress();
    const double to = from + 1.0 / progressSteps_;
    std::atomic<std::int64_t> decided{ 0 };
    const QuerySet& queries = problem_->queries;
    const std::int64_t grain = method_ == Method::BruteForce ? 16 : 1024;
    parallelFor(threads_, queries.count, grain, problem_->progress, from, to, stage,
      [&](std::int64_t begin, std::int64_t end) {
        std::int64_t decidedHere = 0;
        for (std::int64_t q = begin; q < end; ++q)
        {
          double x[3];
          queries.get(q, x);
          visit(q, x, decidedHere);
        }
        decided += decidedHere;
      });
    decidedInDouble_ += decided.load();
    addStage(*report_, stage, timer.milliseconds());
  }

  /// visit(j, r2, exactSquared, d) for every particle j in the 27 cells of size R around x (every
  /// particle, Brute Force): r2 the float squared distance in frame units, exactSquared the double
  /// one in input units where known (Brute Force) or -1, d = x - x_j in input units.
  template <class Visit>
  void forEachCandidate(const double x[3], Visit visit) const
  {
    const Particle* particles = ordered_.data();
    if (method_ == Method::BruteForce)
    {
      const double frameScale = 1.0 / (cellSize_ * cellSize_);
      const double* p = inputDouble_.data();
      for (std::int64_t j = 0; j < problem_->count; ++j)
      {
        const double r2 = exactSquaredDistance(x[0], x[1], x[2], p[3 * j], p[3 * j + 1], p[3 * j + 2]);
        const float d[3] = { float(x[0] - p[3 * j]), float(x[1] - p[3 * j + 1]), float(x[2] - p[3 * j + 2]) };
        visit(j, static_cast<float>(r2 * frameScale), r2, d);
      }
      return;
    }
    const double inverse = 1.0 / cellSize_;
    const float size = static_cast<float>(cellSize_);
    double c[3];
    float f[3];
    for (int a = 0; a < 3; ++a)
    {
      c[a] = cellCoordinate(x[a], cellSize_);
      f[a] = frameCoordinate(x[a], c[a], cellSize_, inverse);
    }
    for (int dz = -1; dz <= 1; ++dz)
    {
      for (int dy = -1; dy <= 1; ++dy)
      {
        for (int dx = -1; dx <= 1; ++dx)
        {
          double neighbor[3];
          if (!offsetCell(c, dx, dy, dz, neighbor))
          {
            continue;
          }
          const int cell = lookup_.find(layout_, neighbor);
          if (cell < 0)
          {
            continue;
          }
          const Particle pq{ f[0] - float(dx), f[1] - float(dy), f[2] - float(dz), 0.0f };
          for (std::int64_t j = cellStart_[cell]; j < cellStart_[cell + 1]; ++j)
          {
            const Particle& pj = particles[j];
            const float d[3] = { (pq.x - pj.x) * size, (pq.y - pj.y) * size, (pq.z - pj.z) * size };
            visit(j, squaredDistance(pq, pj), -1.0, d);
          }
        }
      }
    }
  }

  double nextProgress() { return double(progressStep_++) / progressSteps_; }

  float massAt(std::int64_t i) const { return problem_->mass ? problem_->mass[i] : problem_->constantMass; }
  std::int64_t inputIndex(std::int64_t s) const { return orderToInput_.empty() ? s : orderToInput_[s]; }

  void inputPoint(std::int64_t i, double p[3]) const
  {
    pairTest_.points.get(i, p[0], p[1], p[2]);
  }

  void cellOf(std::int64_t i, double c[3]) const
  {
    double p[3];
    inputPoint(i, p);
    for (int a = 0; a < 3; ++a)
    {
      c[a] = cellCoordinate(p[a], cellSize_);
    }
  }

  /// Brute force: the points in input order, in double (the definition of a neighbor itself).
  void prepareBruteForce()
  {
    const std::int64_t n = problem_->count;
    ordered_.resize(n);
    orderToInput_.clear();
    inputDouble_.resize(3 * static_cast<std::size_t>(n));
    parallelSlices(threads_, n, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        inputPoint(i, &inputDouble_[3 * i]);
        ordered_[i] = Particle{ 0.0f, 0.0f, 0.0f, 1.0f };
      }
    });
  }

  /// Keys per point, a stable sort by key, the runs of equal keys (the cells), a lookup table,
  /// and the points in cell order with frame coordinates.
  void sortIntoCells()
  {
    const std::int64_t n = problem_->count;
    layout_ = makeKeyLayout(problem_->lo, problem_->hi, cellSize_);
    orderToInput_.resize(n);
    if (layout_.mode != KeyMode::Wide)
    {
      keys_.resize(n);
      parallelSlices(threads_, n, [&](int, std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i)
        {
          double c[3];
          cellOf(i, c);
          layout_.bitsKey(c, keys_[i]);
          orderToInput_[i] = static_cast<std::int32_t>(i);
        }
      });
      radixSortPairs(keys_, orderToInput_, layout_.bits, threads_);
    }
    else
    {
      wideKeys_.resize(n);
      parallelSlices(threads_, n, [&](int, std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i)
        {
          double c[3];
          cellOf(i, c);
          wideKeys_[i] = layout_.wideKey(c);
          orderToInput_[i] = static_cast<std::int32_t>(i);
        }
      });
      parallelStableSort(orderToInput_, threads_, [&](std::int32_t a, std::int32_t b) {
        const WideKey& ka = wideKeys_[a];
        const WideKey& kb = wideKeys_[b];
        for (int w = 0; w < 3; ++w)
        {
          if (ka.word[w] != kb.word[w])
          {
            return ka.word[w] < kb.word[w];
          }
        }
        return false;
      });
    }

    // Cells: runs of equal keys, in key order.
    auto sameCell = [&](std::int64_t s) {
      return layout_.mode != KeyMode::Wide ? keys_[s] == keys_[s - 1]
                                           : wideKeys_[orderToInput_[s]] == wideKeys_[orderToInput_[s - 1]];
    };
    cellStart_.clear();
    for (std::int64_t s = 0; s < n; ++s)
    {
      if (s == 0 || !sameCell(s))
      {
        cellStart_.push_back(s);
      }
    }
    const std::int64_t cells = static_cast<std::int64_t>(cellStart_.size());
    cellStart_.push_back(n);
    cellCoordinates_.resize(3 * static_cast<std::size_t>(cells));
    parallelSlices(threads_, cells, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        cellOf(orderToInput_[cellStart_[k]], &cellCoordinates_[3 * k]);
      }
    });
    lookupBuilt_ = false; // built where a search needs it (ensureLookup)

    // The points in cell order, in frame coordinates of their cell.
    ordered_.resize(n);
    const double inverse = 1.0 / cellSize_;
    parallelSlices(threads_, cells, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        const double* c = &cellCoordinates_[3 * k];
        for (std::int64_t s = cellStart_[k]; s < cellStart_[k + 1]; ++s)
        {
          double p[3];
          inputPoint(orderToInput_[s], p);
          ordered_[s] = Particle{ frameCoordinate(p[0], c[0], cellSize_, inverse),
            frameCoordinate(p[1], c[1], cellSize_, inverse), frameCoordinate(p[2], c[2], cellSize_, inverse), 1.0f };
        }
      }
    });
  }

  /// The lookup table, for the searches that find cells by key: queries, and the particles'
  /// search with wide keys. Built once per sort, before the parallel search; the particles'
  /// search with Bits keys walks the cells in order instead (forEachNeighborCellInOrder), and
  /// skipping the table saves its serial build (4M points, one a cell: sort 466 -> 386 ms on 2 cores).
  void ensureLookup()
  {
    if (!lookupBuilt_)
    {
      buildLookup(static_cast<std::int64_t>(cellStart_.size()) - 1);
      lookupBuilt_ = true;
    }
  }

  void buildLookup(std::int64_t cells)
  {
    lookup_ = CellLookup{};
    lookup_.mode = layout_.mode;
    sizeLookup(layout_.mode, layout_.bits, cells, lookup_.log2Slots, lookup_.identity);
    const std::size_t slots = std::size_t(1) << lookup_.log2Slots;
    lookup_.mask = slots - 1;
    if (layout_.mode != KeyMode::Wide)
    {
      bitsSlots_.assign(slots, BitsSlot{ emptyKey, -1, 0 });
      for (std::int64_t k = 0; k < cells; ++k)
      {
        const std::uint64_t key = keys_[cellStart_[k]];
        std::uint64_t s = lookup_.home(key);
        while (bitsSlots_[s].key != emptyKey)
        {
          s = (s + 1) & lookup_.mask;
        }
        bitsSlots_[s] = BitsSlot{ key, static_cast<std::int32_t>(k), 0 };
      }
      lookup_.bitsSlots = bitsSlots_.data();
    }
    else
    {
      wideSlots_.assign(slots, WideSlot{ { { 0, 0, 0 } }, -1, 0 });
      for (std::int64_t k = 0; k < cells; ++k)
      {
        const WideKey& key = wideKeys_[orderToInput_[cellStart_[k]]];
        std::uint64_t s = lookup_.home(key);
        while (wideSlots_[s].cell >= 0)
        {
          s = (s + 1) & lookup_.mask;
        }
        wideSlots_[s] = WideSlot{ key, static_cast<std::int32_t>(k), 0 };
      }
      lookup_.wideSlots = wideSlots_.data();
    }
  }

  /// The cells in parallel: each gathers its neighborhood once, then all of its points test all
  /// of it in the vectorized loops (CpuPairLoops.h).
  template <class Op>
  void searchCells(const Op& op, const char* stage, double from, double to, std::atomic<std::int64_t>& decided)
  {
    const std::int64_t cells = static_cast<std::int64_t>(cellStart_.size()) - 1;
    if (layout_.mode == KeyMode::Wide)
    {
      ensureLookup();
    }
    const std::int64_t perCell = std::max<std::int64_t>(1, problem_->count / std::max<std::int64_t>(1, cells));
    const std::int64_t grain = std::max<std::int64_t>(1, 2048 / perCell);
    parallelFor(threads_, cells, grain, problem_->progress, from, to, stage,
      [&](std::int64_t begin, std::int64_t end) {
        CellScratch scratch;
        RowCursors rows;
        std::int64_t decidedHere = 0;
        for (std::int64_t k = begin; k < end; ++k)
        {
          gatherNeighborhood(k, std::is_same<Op, DensityOperation>::value, scratch.around, rows);
          decidedHere += sumCell(op, k, scratch);
        }
        decided += decidedHere;
      });
  }

  /// Where each of the 9 rows of cells (dy, dz) around the last cell visited begins in the cells'
  /// key order; valid for cells visited in increasing order (RowCursors::next).
  struct RowCursors
  {
    std::int64_t at[9] = { 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    bool found[9] = { false, false, false, false, false, false, false, false, false };
    std::int64_t last = -1; // the cell they were last moved for
  };

  /// The points of the 27 cells around cell k (those that exist), in k's frame; their weights
  /// where the vectorized loop reads them (density).
  void gatherNeighborhood(std::int64_t k, bool weights, Neighborhood& around, RowCursors& rows) const
  {
    around.clear(weights);
    auto append = [&](std::int64_t cell, int dx, int dy, int dz) {
      around.append(ordered_.data(), cellStart_[cell], cellStart_[cell + 1], float(dx), float(dy), float(dz));
    };
    if (layout_.mode == KeyMode::Wide)
    {
      forEachNeighborCellByLookup(k, append);
    }
    else
    {
      forEachNeighborCellInOrder(k, rows, append);
    }
    around.pad();
  }

  std::uint64_t cellKey(std::int64_t cell) const { return keys_[cellStart_[cell]]; }

  /// The same for Bits keys, in the same order, without the lookup table: the cells
  /// are in key order (x in the lowest bits), so the three cells of a row (dy, dz) around k are
  /// consecutive there, and as k grows each row's first cell only moves forward. A cursor per row
  /// finds them by comparing keys; the table's 27 random probes a cell cost about 2 us of cache
  /// misses on sparse data (4M points at 0.05 neighbors: 3.6 s of search on 2 cores).
  template <class Visit>
  void forEachNeighborCellInOrder(std::int64_t k, RowCursors& rows, Visit visit) const
  {
    const std::int64_t cells = static_cast<std::int64_t>(cellStart_.size()) - 1;
    const std::uint64_t key = cellKey(k);
    std::int64_t field[3], span[3];
    std::uint64_t unit[3];
    const int next[3] = { layout_.shift[1], layout_.shift[2], layout_.bits };
    for (int a = 0; a < 3; ++a)
    {
      const int width = next[a] - layout_.shift[a];
      unit[a] = std::uint64_t(1) << layout_.shift[a];
      field[a] = static_cast<std::int64_t>((key >> layout_.shift[a]) & ((std::uint64_t(1) << width) - 1));
      span[a] = static_cast<std::int64_t>(layout_.span[a]);
    }
    if (!(rows.last >= 0 && rows.last < k))
    {
      std::fill(rows.found, rows.found + 9, false); // not visited in increasing order: search again
    }
    rows.last = k;
    for (int dz = -1; dz <= 1; ++dz)
    {
      for (int dy = -1; dy <= 1; ++dy)
      {
        if (field[1] + dy < 0 || field[1] + dy >= span[1] || field[2] + dz < 0 || field[2] + dz >= span[2])
        {
          continue; // beyond the bounds' cells: no point there
        }
        const std::uint64_t centre = key + static_cast<std::uint64_t>(static_cast<std::int64_t>(dy)) * unit[1] +
          static_cast<std::uint64_t>(static_cast<std::int64_t>(dz)) * unit[2];
        const std::uint64_t low = field[0] > 0 ? centre - unit[0] : centre;
        const std::uint64_t high = field[0] + 1 < span[0] ? centre + unit[0] : centre;
        const int row = (dy + 1) + 3 * (dz + 1);
        std::int64_t& c = rows.at[row];
        if (!rows.found[row])
        {
          rows.found[row] = true;
          std::int64_t lo = 0, hi = cells; // the first cell whose key is at least `low`
          while (lo < hi)
          {
            const std::int64_t mid = lo + (hi - lo) / 2;
            (cellKey(mid) < low ? lo = mid + 1 : hi = mid);
          }
          c = lo;
        }
        while (c < cells && cellKey(c) < low)
        {
          ++c;
        }
        for (std::int64_t m = c; m < cells && cellKey(m) <= high; ++m)
        {
          const int dx = cellKey(m) < centre ? -1 : cellKey(m) > centre ? 1 : 0;
          visit(m, dx, dy, dz);
        }
      }
    }
  }

  /// visit(cell, dx, dy, dz) for each existing cell at offset (dx, dy, dz) from cell k, wide
  /// keys: through their coordinates and the lookup table.
  template <class Visit>
  void forEachNeighborCellByLookup(std::int64_t k, Visit visit) const
  {
    const double* c = &cellCoordinates_[3 * k];
    forEachOffset([&](int dx, int dy, int dz) {
      double neighbor[3];
      const int cell = offsetCell(c, dx, dy, dz, neighbor) ? lookup_.find(layout_, neighbor) : -1;
      if (cell >= 0)
      {
        visit(cell, dx, dy, dz);
      }
    });
  }

  template <class Visit>
  static void forEachOffset(Visit visit)
  {
    for (int dz = -1; dz <= 1; ++dz)
    {
      for (int dy = -1; dy <= 1; ++dy)
      {
        for (int dx = -1; dx <= 1; ++dx)
        {
          visit(dx, dy, dz);
        }
      }
    }
  }

  /// Cell k's points against its gathered neighborhood: the float test in the vectorized loops
  /// (count and density; other operations through their pair terms), then the pairs within
  /// rounding of R in double. Returns the pairs decided in double.
  template <class Op>
  std::int64_t sumCell(const Op& op, std::int64_t k, CellScratch& scratch) const
  {
    constexpr bool isCount = std::is_same<Op, CountOperation>::value;
    constexpr bool isDensity = std::is_same<Op, DensityOperation>::value;
    const std::int64_t first = cellStart_[k];
    const std::int64_t count = cellStart_[k + 1] - first;
    scratch.resize(count);
    const CellPairs cell{ &scratch.around, ordered_.data() + first, count, pairTest_.accept, pairTest_.reject,
      scratch.band.data() };
    if constexpr (isCount)
    {
      countClearlyInside(cell, scratch.counts.data());
    }
    else if constexpr (isDensity)
    {
      densityClearlyInside(cell, op.kernel, scratch.sums.data(), scratch.carries.data());
    }
    std::int64_t decided = 0;
    for (std::int64_t i = 0; i < count; ++i)
    {
      const std::int64_t s = first + i;
      RegisterSums<Op> acc;
      if constexpr (isCount)
      {
        acc.sum[0] = scratch.counts[i];
      }
      else if constexpr (isDensity)
      {
        acc.sum[0] = scratch.sums[i];
        acc.carry[0] = scratch.carries[i];
      }
      else
      {
        scratch.band[i] = addClearlyInside(op, s, scratch, acc);
      }
      if (scratch.band[i])
      {
        decided += addUncertainPairs(op, s, scratch.around, scratch.uncertain, acc);
      }
      acc.finish(op, static_cast<int>(s), orderToInput_[s]);
    }
    return decided;
  }

  /// Operations other than count and density: the pair terms of the pairs of point s clearly
  /// inside R. Returns whether any pair needs the double decision.
  template <class Op>
  bool addClearlyInside(const Op& op, std::int64_t s, CellScratch& scratch, RegisterSums<Op>& acc) const
  {
    const Neighborhood& around = scratch.around;
    scratch.distances.resize(static_cast<std::size_t>(around.padded));
    const float* r2 = scratch.distances.data();
    squaredDistances(around, ordered_[s], scratch.distances.data());
    bool band = false;
    around.forEachPoint([&](std::int64_t j, std::int64_t t) {
      if (r2[j] < pairTest_.accept)
      {
        acc.add(op, static_cast<int>(t), ordered_[t], r2[j]);
      }
      band |= uncertain(r2[j], pairTest_);
    });
    return band;
  }

  /// The pairs of point s that the float test left open, decided in double (rare: a few per
  /// million pairs, or every pair of a point in a huge cell; every point of a lattice with R on
  /// a neighbor shell). They are found by the vectorized test (listUncertain): found pair by pair,
  /// a 4M lattice's count took 792-800 ms on 2 cores, 388-416 so, against about 240 with the
  /// float test alone (RESULTS.md, issue 22).
  template <class Op>
  std::int64_t addUncertainPairs(const Op& op, std::int64_t s, const Neighborhood& around,
    std::vector<std::int32_t>& positions, RegisterSums<Op>& acc) const
  {
    const Particle& p = ordered_[s];
    positions.resize(static_cast<std::size_t>(around.padded));
    const std::int32_t listed = listUncertain(around, p, pairTest_.accept, pairTest_.reject, positions.data());
    int run = 0;
    std::int64_t decided = 0;
    for (std::int32_t k = 0; k < listed; ++k, ++decided)
    {
      const std::int64_t j = positions[k];
      if (j >= around.size)
      {
        break; // padding: far away, and only a NaN frame coordinate puts it in the band
      }
      const std::int64_t t = around.sortedAt(j, run);
      float r2 = frameSquared(p.x - around.x[j], p.y - around.y[j], p.z - around.z[j]);
      if (pairTest_.exact(orderToInput_[s], orderToInput_[t], r2))
      {
        acc.add(op, static_cast<int>(t), ordered_[t], r2);
      }
    }
    return decided;
  }

  template <class Op>
  void searchBruteForce(const Op& op, const char* stage, double from, double to, std::atomic<std::int64_t>&)
  {
    const std::int64_t n = problem_->count;
    const double radiusSquared = pairTest_.radiusSquared;
    const double frameScale = 1.0 / (cellSize_ * cellSize_);
    const double* x = inputDouble_.data();
    parallelFor(threads_, n, 256, problem_->progress, from, to, stage, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        RegisterSums<Op> acc;
        for (std::int64_t j = 0; j < n; ++j)
        {
          const double r2 = exactSquaredDistance(x[3 * i], x[3 * i + 1], x[3 * i + 2], x[3 * j], x[3 * j + 1], x[3 * j + 2]);
          if (r2 <= radiusSquared)
          {
            acc.add(op, static_cast<int>(j), ordered_[j], static_cast<float>(r2 * frameScale));
          }
        }
        acc.finish(op, static_cast<int>(i), static_cast<int>(i));
      }
    });
  }

  int threads_;
  std::int64_t memoryLimit_;
  Method method_ = Method::CountingSort;
  const Problem* problem_ = nullptr;
  Report* report_ = nullptr;
  int progressStep_ = 0;
  int progressSteps_ = 1;
  std::int64_t decidedInDouble_ = 0;
  double cellSize_ = 1.0;
  PairTest pairTest_;
  KeyLayout layout_;
  CellLookup lookup_;
  bool lookupBuilt_ = false;
  std::vector<std::uint64_t> keys_;
  std::vector<WideKey> wideKeys_;
  std::vector<BitsSlot> bitsSlots_;
  std::vector<WideSlot> wideSlots_;
  std::vector<std::int64_t> cellStart_;
  std::vector<double> cellCoordinates_;
  std::vector<double> inputDouble_;
  std::vector<Particle> ordered_;
  std::vector<std::int32_t> orderToInput_;
  std::vector<float> orderedDensity_;
  std::vector<float> gathered_;
  std::vector<float> orderedRadii_;
};

} // namespace

std::unique_ptr<BackendImplementation> makeCpuBackend(int threads, std::int64_t memoryLimit)
{
  return std::make_unique<CpuBackend>(threads, memoryLimit);
}

} // namespace detail
} // namespace neighborgrid
