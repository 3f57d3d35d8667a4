// CUDA backend. Methods:
//  - Counting Sort (Hoetzlein 2013): atomic cell counts with per-point offsets, an exclusive scan
//    (CUB), a scatter into cell order, then one thread per particle over the 27 cells around it;
//    results are written straight to input order.
//  - Brute Force: every pair, tiled through shared memory; for validation.
// All device memory lives in DeviceBuffer members and is reused across calls.
#include "Backend.h"
#include "CudaSupport.h"
#include "OperationPlan.h"
#include "Timer.h"

#include <cub/device/device_scan.cuh>

#include <cstring>
#include <mutex>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

constexpr int threadsPerBlock = 256;

int blocksFor(std::int64_t count)
{
  return static_cast<int>((count + threadsPerBlock - 1) / threadsPerBlock);
}

__device__ __forceinline__ Particle loadPoint(const float* __restrict__ xyz, int i)
{
  return Particle{ xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2], 1.0f };
}

// --- Counting sort ----------------------------------------------------------------------------
__global__ void assignCells(const float* __restrict__ xyz, int n, Grid grid, int* __restrict__ cellCount,
  int* __restrict__ cellOfPoint, int* __restrict__ offsetInCell)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
  {
    return;
  }
  const int cell = grid.cellOf(loadPoint(xyz, i));
  cellOfPoint[i] = cell;
  offsetInCell[i] = atomicAdd(cellCount + cell, 1);
}

__global__ void scatterToCells(const float* __restrict__ xyz, int n, const int* __restrict__ cellStart,
  const int* __restrict__ cellOfPoint, const int* __restrict__ offsetInCell, Particle* __restrict__ ordered,
  int* __restrict__ orderToInput)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
  {
    return;
  }
  const int s = cellStart[cellOfPoint[i]] + offsetInCell[i];
  ordered[s] = loadPoint(xyz, i);
  orderToInput[s] = i;
}

__global__ void makeParticles(const float* __restrict__ xyz, int n, Particle* __restrict__ particles)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    particles[i] = loadPoint(xyz, i);
  }
}

// --- Weights and gathers ----------------------------------------------------------------------
__global__ void setWeightsKernel(Particle* __restrict__ particles, int n, const int* __restrict__ orderToInput,
  const float* __restrict__ mass, float constantWeight)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    particles[s].w = mass ? mass[orderToInput ? orderToInput[s] : s] : constantWeight;
  }
}

__global__ void divideWeightsKernel(Particle* __restrict__ particles, int n, const float* __restrict__ density)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    particles[s].w /= density[s];
  }
}

__global__ void gatherKernel(const float* __restrict__ values, int components, int first, int count, int n,
  const int* __restrict__ orderToInput, float* __restrict__ gathered)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const std::int64_t i = orderToInput ? orderToInput[s] : s;
  for (int c = 0; c < count; ++c)
  {
    gathered[std::int64_t(s) * count + c] = values[i * components + first + c];
  }
}

// --- Searches ---------------------------------------------------------------------------------
/// Hoetzlein's search: one thread per particle in cell order, 27 cell lookups.
template <class Op>
__global__ void gridSearch(Grid grid, const Particle* __restrict__ particles, const int* __restrict__ cellStart,
  const int* __restrict__ orderToInput, int n, float r2max, Op op)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const Particle pi = particles[s];
  const int cx = grid.cellX(pi), cy = grid.cellY(pi), cz = grid.cellZ(pi);
  RegisterSums<Op> acc;
  for (int z = max(cz - 1, 0); z <= min(cz + 1, grid.dimZ - 1); ++z)
  {
    for (int y = max(cy - 1, 0); y <= min(cy + 1, grid.dimY - 1); ++y)
    {
      for (int x = max(cx - 1, 0); x <= min(cx + 1, grid.dimX - 1); ++x)
      {
        const int cell = grid.cellIndex(x, y, z);
        const int end = cellStart[cell + 1];
        for (int j = cellStart[cell]; j < end; ++j)
        {
          const Particle pj = particles[j];
          const float r2 = squaredDistance(pi, pj);
          if (r2 <= r2max)
          {
            acc.add(op, j, pj, r2);
          }
        }
      }
    }
  }
  acc.finish(op, s, orderToInput[s]);
}

/// Every pair; particles in input order, tiles of the block size staged in shared memory.
template <class Op>
__global__ void bruteForceSearch(const Particle* __restrict__ particles, int n, float r2max, Op op)
{
  __shared__ Particle tile[threadsPerBlock];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = i < n;
  const Particle pi = active ? particles[i] : Particle{ 0, 0, 0, 0 };
  RegisterSums<Op> acc;
  for (int base = 0; base < n; base += threadsPerBlock)
  {
    const int j = base + threadIdx.x;
    if (j < n)
    {
      tile[threadIdx.x] = particles[j];
    }
    __syncthreads();
    const int tileSize = min(threadsPerBlock, n - base);
    if (active)
    {
      for (int k = 0; k < tileSize; ++k)
      {
        const float r2 = squaredDistance(pi, tile[k]);
        if (r2 <= r2max)
        {
          acc.add(op, base + k, tile[k], r2);
        }
      }
    }
    __syncthreads();
  }
  if (active)
  {
    acc.finish(op, i, i);
  }
}

struct DeviceInfo
{
  bool usable = false;
  std::string why;
};

const DeviceInfo& probeDevice()
{
  static DeviceInfo info;
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess)
    {
      (void)cudaGetLastError();
      info.why = std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
      return;
    }
    if (count == 0)
    {
      info.why = "no CUDA device found";
      return;
    }
    int device = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    {
      (void)cudaGetLastError();
      info.why = "the CUDA device could not be queried";
      return;
    }
    if (prop.major < 8)
    {
      info.why = std::string("the CUDA device ") + prop.name + " has compute capability " +
        std::to_string(prop.major) + "." + std::to_string(prop.minor) +
        "; this build has code for 8.0 and newer";
      return;
    }
    info.usable = true;
  });
  return info;
}

class CudaBackend final : public BackendImplementation
{
public:
  CudaBackend()
  {
    NG_CUDA_CHECK(cudaGetDevice(&device_), "cudaGetDevice");
    cudaDeviceProp prop{};
    NG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    deviceName_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    NG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaBackend() override
  {
    for (cudaEvent_t e : events_)
    {
      cudaEventDestroy(e);
    }
    if (stream_)
    {
      cudaStreamDestroy(stream_);
    }
  }

  float* coordinateStaging(std::int64_t count) override
  {
    return coordinates_.ensure(static_cast<std::size_t>(3 * count), "coordinate staging (pinned host memory)");
  }

  void run(const Problem& problem, Report& report) override
  {
    problem_ = &problem;
    report_ = &report;
    stageMarks_.clear();
    eventsUsed_ = 0;
    const int n = static_cast<int>(problem.count);
    const ProgressReporter& progress = *problem.progress;

    // Upload: coordinates from their pinned staging; mass and smoothed arrays through pinned
    // staging as well (a pageable copy runs at a fraction of PCIe bandwidth).
    cudaEvent_t start = mark();
    float* xyz = deviceXyz_.ensure(3 * std::size_t(n), "coordinates");
    NG_CUDA_CHECK(cudaMemcpyAsync(xyz, problem.xyz, 3 * sizeof(float) * n, cudaMemcpyHostToDevice, stream_),
      "uploading coordinates");
    uploadArrays();
    cudaEvent_t uploaded = mark();
    stage("upload", start, uploaded);
    progress(0.1, "upload");

    if (problem.method == Method::BruteForce)
    {
      particles_ = inputOrderParticles_.ensure(n, "particles");
      orderToInput_ = nullptr;
      makeParticles<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(xyz, n, particles_);
      NG_CUDA_CHECK_LAUNCH("makeParticles");
      report.extraDeviceBytes = inputOrderParticles_.bytes();
    }
    else
    {
      countingSort(xyz, n);
    }
    stage("sort", uploaded, mark());
    progress(0.2, "sort");

    runOperation(*this, problem);

    report.device = deviceName_;
    collectStageTimes(report);
  }

  // --- executor primitives (OperationPlan.h) -------------------------------------------------
  void setWeights(WeightMode mode)
  {
    const int n = static_cast<int>(problem_->count);
    const bool mass = mode == WeightMode::Mass;
    setWeightsKernel<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(particles_, n, orderToInput_,
      mass && problem_->mass ? deviceMass_.get() : nullptr, mass ? problem_->constantMass : 1.0f);
    NG_CUDA_CHECK_LAUNCH("setWeights");
  }
  void divideWeightsByDensity(const float* orderedDensity)
  {
    const int n = static_cast<int>(problem_->count);
    divideWeightsKernel<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(particles_, n, orderedDensity);
    NG_CUDA_CHECK_LAUNCH("divideWeightsByDensity");
  }
  std::int32_t* countOutput() { return deviceCount_.ensure(problem_->count, "neighbor counts"); }
  float* densityOutput()
  {
    return problem_->density ? deviceDensity_.ensure(problem_->count, "density") : nullptr;
  }
  float* orderedDensity() { return orderedDensity_.ensure(problem_->count, "density (cell order)"); }
  const float* gatherValues(std::size_t array, int first, int count)
  {
    const int n = static_cast<int>(problem_->count);
    const SmoothedArray& a = (*problem_->smoothed)[array];
    float* gathered = gathered_.ensure(std::size_t(n) * count, "smoothing values (cell order)");
    gatherKernel<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(
      deviceValues_.get() + valueOffsets_[array], a.components, first, count, n, orderToInput_, gathered);
    NG_CUDA_CHECK_LAUNCH("gatherValues");
    return gathered;
  }
  float* smoothingOutput(std::size_t array) { return deviceSmoothed_.get() + valueOffsets_[array]; }

  template <class Op>
  void search(const Op& op, const char* stageName)
  {
    const int n = static_cast<int>(problem_->count);
    cudaEvent_t begin = mark();
    if (problem_->method == Method::BruteForce)
    {
      bruteForceSearch<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(particles_, n, problem_->radiusSquared, op);
    }
    else
    {
      gridSearch<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(
        grid_, particles_, cellStart_.get(), orderToInput_, n, problem_->radiusSquared, op);
    }
    NG_CUDA_CHECK_LAUNCH(stageName);
    stage(stageName, begin, mark());
    // Progress and abort between passes: the GPU cannot be interrupted inside a kernel.
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), stageName);
    (*problem_->progress)(0.9, stageName);
  }

  void finishOutputs()
  {
    const Problem& p = *problem_;
    const std::size_t n = static_cast<std::size_t>(p.count);
    cudaEvent_t begin = mark();
    // Device -> pinned staging -> caller's arrays.
    struct Download
    {
      const void* device;
      void* host;
      std::size_t bytes;
    };
    std::vector<Download> downloads;
    if (p.operation == Operation::NeighborCount)
    {
      downloads.push_back({ deviceCount_.get(), p.neighborCount, n * sizeof(std::int32_t) });
    }
    if (p.density && p.operation != Operation::NeighborCount)
    {
      downloads.push_back({ deviceDensity_.get(), p.density, n * sizeof(float) });
    }
    if (p.operation == Operation::Smoothing)
    {
      for (std::size_t a = 0; a < p.smoothed->size(); ++a)
      {
        downloads.push_back({ deviceSmoothed_.get() + valueOffsets_[a], (*p.smoothed)[a].output,
          n * (*p.smoothed)[a].components * sizeof(float) });
      }
    }
    std::size_t total = 0;
    for (const auto& d : downloads)
    {
      total += d.bytes;
    }
    char* staging = staging_.ensure(total, "result staging (pinned host memory)");
    std::size_t offset = 0;
    for (const auto& d : downloads)
    {
      NG_CUDA_CHECK(cudaMemcpyAsync(staging + offset, d.device, d.bytes, cudaMemcpyDeviceToHost, stream_),
        "downloading results");
      offset += d.bytes;
    }
    cudaEvent_t end = mark();
    stage("download", begin, end);
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "waiting for the results");
    Timer copyTimer;
    offset = 0;
    for (const auto& d : downloads)
    {
      std::memcpy(d.host, staging + offset, d.bytes);
      offset += d.bytes;
    }
    addStage(*report_, "copy to caller", copyTimer.milliseconds());
    if (p.operation == Operation::NeighborCount)
    {
      std::int64_t pairs = 0;
      for (std::size_t i = 0; i < n; ++i)
      {
        pairs += p.neighborCount[i];
      }
      report_->neighborPairs = pairs;
    }
  }

private:
  void countingSort(const float* xyz, int n)
  {
    grid_ = makeGrid(problem_->extent, problem_->radius, std::max<std::int64_t>(2 * std::int64_t(n), 1 << 20));
    const int cells = static_cast<int>(grid_.cellCount());
    int* cellCount = cellCount_.ensure(cells + 1, "cell counts");
    int* cellStart = cellStart_.ensure(cells + 1, "cell starts");
    int* cellOfPoint = cellOfPoint_.ensure(n, "cell of each point");
    int* offsetInCell = offsetInCell_.ensure(n, "offset of each point in its cell");
    particles_ = ordered_.ensure(n, "particles (cell order)");
    orderToInput_ = orderToInputBuffer_.ensure(n, "cell order to input order");

    NG_CUDA_CHECK(cudaMemsetAsync(cellCount, 0, sizeof(int) * (cells + 1), stream_), "clearing cell counts");
    assignCells<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(xyz, n, grid_, cellCount, cellOfPoint, offsetInCell);
    NG_CUDA_CHECK_LAUNCH("assignCells");
    std::size_t scratchBytes = 0;
    NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scratchBytes, cellCount, cellStart, cells + 1, stream_),
      "sizing the cell scan");
    void* scratch = scanScratch_.ensure(scratchBytes, "scan scratch");
    NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch, scratchBytes, cellCount, cellStart, cells + 1, stream_),
      "scanning cell counts");
    scatterToCells<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(
      xyz, n, cellStart, cellOfPoint, offsetInCell, particles_, orderToInput_);
    NG_CUDA_CHECK_LAUNCH("scatterToCells");
    report_->extraDeviceBytes = std::int64_t(sizeof(int)) * 2 * (cells + 1) + std::int64_t(sizeof(int)) * 3 * n +
      std::int64_t(sizeof(Particle)) * n + std::int64_t(scratchBytes);
  }

  void uploadArrays()
  {
    const Problem& p = *problem_;
    const std::size_t n = static_cast<std::size_t>(p.count);
    const bool usesMass = p.operation == Operation::Density ||
      (p.operation == Operation::Smoothing && p.normalization == Normalization::SPH);
    std::size_t total = (usesMass && p.mass) ? n : 0;
    valueOffsets_.clear();
    std::size_t values = 0;
    if (p.operation == Operation::Smoothing)
    {
      for (const auto& a : *p.smoothed)
      {
        valueOffsets_.push_back(values);
        values += n * a.components;
      }
    }
    total += values;
    if (total == 0)
    {
      return;
    }
    // The previous call's downloads have completed (it synchronized), so staging is free.
    char* staging = staging_.ensure(total * sizeof(float), "upload staging (pinned host memory)");
    float* cursor = reinterpret_cast<float*>(staging);
    if (usesMass && p.mass)
    {
      std::memcpy(cursor, p.mass, n * sizeof(float));
      NG_CUDA_CHECK(cudaMemcpyAsync(deviceMass_.ensure(n, "masses"), cursor, n * sizeof(float),
                      cudaMemcpyHostToDevice, stream_),
        "uploading masses");
      cursor += n;
    }
    if (values)
    {
      float* deviceValues = deviceValues_.ensure(values, "arrays to smooth");
      deviceSmoothed_.ensure(values, "smoothed arrays");
      for (std::size_t a = 0; a < p.smoothed->size(); ++a)
      {
        const std::size_t count = n * (*p.smoothed)[a].components;
        std::memcpy(cursor, (*p.smoothed)[a].values, count * sizeof(float));
        NG_CUDA_CHECK(cudaMemcpyAsync(deviceValues + valueOffsets_[a], cursor, count * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
          "uploading arrays to smooth");
        cursor += count;
      }
    }
    // Downloads reuse the staging buffer: wait until the uploads have left it.
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "uploading arrays");
  }

  cudaEvent_t mark()
  {
    if (eventsUsed_ == events_.size())
    {
      cudaEvent_t e;
      NG_CUDA_CHECK(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    cudaEvent_t e = events_[eventsUsed_++];
    NG_CUDA_CHECK(cudaEventRecord(e, stream_), "cudaEventRecord");
    return e;
  }
  void stage(const char* name, cudaEvent_t begin, cudaEvent_t end) { stageMarks_.push_back({ name, begin, end }); }
  void collectStageTimes(Report& report)
  {
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "finishing");
    for (const auto& s : stageMarks_)
    {
      float ms = 0.0f;
      NG_CUDA_CHECK(cudaEventElapsedTime(&ms, s.begin, s.end), "reading stage times");
      addStage(report, s.name, ms);
    }
  }

  struct StageMark
  {
    std::string name;
    cudaEvent_t begin, end;
  };

  int device_ = 0;
  std::string deviceName_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::size_t eventsUsed_ = 0;
  std::vector<StageMark> stageMarks_;
  const Problem* problem_ = nullptr;
  Report* report_ = nullptr;
  Grid grid_;
  Particle* particles_ = nullptr;
  int* orderToInput_ = nullptr;
  std::vector<std::size_t> valueOffsets_;

  PinnedBuffer<float> coordinates_;
  PinnedBuffer<char> staging_;
  DeviceBuffer<float> deviceXyz_;
  DeviceBuffer<float> deviceMass_;
  DeviceBuffer<float> deviceValues_;
  DeviceBuffer<float> deviceSmoothed_;
  DeviceBuffer<float> deviceDensity_;
  DeviceBuffer<std::int32_t> deviceCount_;
  DeviceBuffer<float> orderedDensity_;
  DeviceBuffer<float> gathered_;
  DeviceBuffer<Particle> inputOrderParticles_;
  DeviceBuffer<Particle> ordered_;
  DeviceBuffer<int> cellCount_;
  DeviceBuffer<int> cellStart_;
  DeviceBuffer<int> cellOfPoint_;
  DeviceBuffer<int> offsetInCell_;
  DeviceBuffer<int> orderToInputBuffer_;
  DeviceBuffer<unsigned char> scanScratch_;
};

} // namespace

bool cudaDeviceUsable(std::string* why)
{
  const DeviceInfo& info = probeDevice();
  if (!info.usable && why)
  {
    *why = info.why;
  }
  return info.usable;
}

std::unique_ptr<BackendImplementation> makeCudaBackend()
{
  return std::make_unique<CudaBackend>();
}

} // namespace detail
} // namespace neighborgrid
