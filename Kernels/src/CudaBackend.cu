// CUDA backend. Methods:
//  - Counting Sort (Hoetzlein 2013): atomic cell counts with per-point offsets, an exclusive scan
//    (CUB), a scatter into cell order, then one thread per particle over the 27 cells around it;
//    results are written straight to input order.
//  - Radix Sort (Green 2008/2012): (cell hash, index) pairs sorted with CUB's radix sort, cell
//    start/end from the sorted hashes, reordered positions, the same 27-cell search.
//  - FENNS (Groß et al. 2019) and CLAWS (Groß et al. 2020): Fenns.cuh.
//  - Brute Force: every pair, tiled through shared memory; for validation.
// All device memory lives in DeviceBuffer members and is reused across calls.
#include "Backend.h"
#include "CudaSupport.h"
#include "OperationPlan.h"
#include "Parallel.h"
#include "Timer.h"

#include "Fenns.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
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

// --- Coordinates: bounds, the non-finite check and the relative float copy, on the GPU -------
constexpr int boundsThreads = 256;

template <class T>
__global__ void coordinateBoundsPartial(const T* __restrict__ raw, std::int64_t n, double* __restrict__ partial,
  unsigned long long* __restrict__ firstBad)
{
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
  {
    const double v[3] = { double(raw[3 * i]), double(raw[3 * i + 1]), double(raw[3 * i + 2]) };
    if (!(isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2])))
    {
      atomicMin(firstBad, static_cast<unsigned long long>(i));
      continue;
    }
    for (int a = 0; a < 3; ++a)
    {
      lo[a] = fmin(lo[a], v[a]);
      hi[a] = fmax(hi[a], v[a]);
    }
  }
  using Reduce = cub::BlockReduce<double, boundsThreads>;
  __shared__ typename Reduce::TempStorage storage;
  for (int a = 0; a < 3; ++a)
  {
    const double blockLo = Reduce(storage).Reduce(lo[a], [](double x, double y) { return fmin(x, y); });
    __syncthreads();
    const double blockHi = Reduce(storage).Reduce(hi[a], [](double x, double y) { return fmax(x, y); });
    __syncthreads();
    if (threadIdx.x == 0)
    {
      partial[6 * blockIdx.x + a] = blockLo;
      partial[6 * blockIdx.x + 3 + a] = blockHi;
    }
  }
}

__global__ void coordinateBoundsFinal(const double* __restrict__ partial, int blocks, double* __restrict__ bounds)
{
  if (threadIdx.x < 6)
  {
    const bool isLo = threadIdx.x < 3;
    double v = isLo ? HUGE_VAL : -HUGE_VAL;
    for (int b = 0; b < blocks; ++b)
    {
      v = isLo ? fmin(v, partial[6 * b + threadIdx.x]) : fmax(v, partial[6 * b + threadIdx.x]);
    }
    bounds[threadIdx.x] = v;
  }
}

template <class T>
__global__ void makeRelative(const T* __restrict__ raw, std::int64_t values, const double* __restrict__ bounds,
  float* __restrict__ xyz)
{
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < values;
       k += std::int64_t(gridDim.x) * blockDim.x)
  {
    xyz[k] = static_cast<float>(double(raw[k]) - bounds[k % 3]);
  }
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

// --- Radix sort (Green) -----------------------------------------------------------------------
__global__ void hashCells(const float* __restrict__ xyz, int n, Grid grid, unsigned* __restrict__ hash,
  int* __restrict__ index)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    hash[i] = static_cast<unsigned>(grid.cellOf(loadPoint(xyz, i)));
    index[i] = i;
  }
}

/// Cell start and end from the sorted hashes: a particle whose hash differs from its
/// predecessor's starts a cell and ends the previous one. Empty cells keep start = end = 0.
__global__ void findCellRanges(const unsigned* __restrict__ sortedHash, int n, int* __restrict__ cellStart,
  int* __restrict__ cellEnd)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const unsigned hash = sortedHash[s];
  if (s == 0 || sortedHash[s - 1] != hash)
  {
    cellStart[hash] = s;
    if (s > 0)
    {
      cellEnd[sortedHash[s - 1]] = s;
    }
  }
  if (s == n - 1)
  {
    cellEnd[hash] = n;
  }
}

__global__ void gatherParticles(const float* __restrict__ xyz, int n, const int* __restrict__ orderToInput,
  Particle* __restrict__ ordered)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    ordered[s] = loadPoint(xyz, orderToInput[s]);
  }
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
  const int* __restrict__ cellEnd, const int* __restrict__ orderToInput, int n, float r2max, Op op)
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
        const int end = cellEnd[cell];
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
    sharedMemoryPerBlock_ = static_cast<int>(prop.sharedMemPerBlockOptin);
    multiprocessors_ = prop.multiProcessorCount;
    // Benchmarking knob: average particles per FENNS coarse cell.
    if (const char* target = std::getenv("NEIGHBORGRID_FENNS_TARGET"))
    {
      fennsTargetPerCell_ = std::max(1, std::atoi(target));
    }
    // Benchmarking knob: the paper's lookup direction (scatter with shared-memory atomics).
    if (const char* variant = std::getenv("NEIGHBORGRID_FENNS_VARIANT"))
    {
      fennsScatter_ = std::string(variant) == "scatter";
    }
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

  /// The caller's coordinates travel as they are, in slices: a slice is copied into pinned memory
  /// (on several threads) while the previous one crosses PCIe. The GPU then finds the bounds,
  /// checks for non-finite values and writes float coordinates relative to the minimum.
  void prepareCoordinates(const Points& points, int /*threads*/, Problem& problem) override
  {
    const std::int64_t n = points.count;
    const std::size_t element = points.type == ScalarType::Float32 ? sizeof(float) : sizeof(double);
    const std::size_t bytes = 3 * std::size_t(n) * element;
    char* pinned = rawStaging_.ensure(bytes, "coordinate staging (pinned host memory)");
    char* raw = deviceRaw_.ensure(bytes, "coordinates as given");
    const char* source = static_cast<const char*>(points.xyz);
    constexpr std::size_t slice = std::size_t(16) << 20;
    for (std::size_t offset = 0; offset < bytes; offset += slice)
    {
      const std::size_t length = std::min(slice, bytes - offset);
      parallelSlices(copyThreads_, std::int64_t(copyThreads_), [&](int, std::int64_t begin, std::int64_t end) {
        const std::size_t from = offset + length * std::size_t(begin) / copyThreads_;
        const std::size_t to = offset + length * std::size_t(end) / copyThreads_;
        std::memcpy(pinned + from, source + from, to - from);
      });
      NG_CUDA_CHECK(cudaMemcpyAsync(raw + offset, pinned + offset, length, cudaMemcpyHostToDevice, stream_),
        "uploading coordinates");
    }
    const int blocks = static_cast<int>(std::min<std::int64_t>(4 * multiprocessors_, (n + boundsThreads - 1) / boundsThreads));
    double* partial = boundsPartial_.ensure(6 * std::size_t(blocks) + 6, "coordinate bounds");
    double* bounds = partial + 6 * blocks;
    unsigned long long* firstBad = firstBad_.ensure(1, "non-finite check");
    NG_CUDA_CHECK(cudaMemsetAsync(firstBad, 0xff, sizeof(unsigned long long), stream_), "clearing the non-finite check");
    float* xyz = deviceXyz_.ensure(3 * std::size_t(n), "coordinates");
    const std::int64_t values = 3 * n;
    const int convertBlocks = static_cast<int>(std::min<std::int64_t>(32 * multiprocessors_, (values + 255) / 256));
    if (element == sizeof(float))
    {
      coordinateBoundsPartial<<<blocks, boundsThreads, 0, stream_>>>(reinterpret_cast<const float*>(raw), n, partial, firstBad);
    }
    else
    {
      coordinateBoundsPartial<<<blocks, boundsThreads, 0, stream_>>>(reinterpret_cast<const double*>(raw), n, partial, firstBad);
    }
    NG_CUDA_CHECK_LAUNCH("coordinateBoundsPartial");
    coordinateBoundsFinal<<<1, 32, 0, stream_>>>(partial, blocks, bounds);
    NG_CUDA_CHECK_LAUNCH("coordinateBoundsFinal");
    struct BoundsResult
    {
      double bounds[6];
      unsigned long long firstBad;
    };
    auto* result = reinterpret_cast<BoundsResult*>(boundsHost_.ensure(sizeof(BoundsResult), "bounds (pinned host memory)"));
    NG_CUDA_CHECK(cudaMemcpyAsync(result->bounds, bounds, 6 * sizeof(double), cudaMemcpyDeviceToHost, stream_),
      "reading the bounds");
    NG_CUDA_CHECK(cudaMemcpyAsync(&result->firstBad, firstBad, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_),
      "reading the non-finite check");
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "finding the bounds");
    if (result->firstBad != ~0ull)
    {
      failNonFinitePoint(points, static_cast<std::int64_t>(result->firstBad));
    }
    for (int a = 0; a < 3; ++a)
    {
      // Kept an upper bound of every relative coordinate, as on the host.
      problem.extent[a] = std::nextafter(static_cast<float>(result->bounds[3 + a] - result->bounds[a]), HUGE_VALF);
    }
    if (element == sizeof(float))
    {
      makeRelative<<<convertBlocks, 256, 0, stream_>>>(reinterpret_cast<const float*>(raw), values, bounds, xyz);
    }
    else
    {
      makeRelative<<<convertBlocks, 256, 0, stream_>>>(reinterpret_cast<const double*>(raw), values, bounds, xyz);
    }
    NG_CUDA_CHECK_LAUNCH("makeRelative");
    problem.xyz = nullptr; // the coordinates live on the device (deviceXyz_)
  }

  void run(const Problem& problem, Report& report) override
  {
    problem_ = &problem;
    report_ = &report;
    stageMarks_.clear();
    eventsUsed_ = 0;
    const int n = static_cast<int>(problem.count);
    const ProgressReporter& progress = *problem.progress;

    // Upload: the coordinates are on the device already (prepareCoordinates); masses and arrays
    // to smooth go through pinned staging (a pageable copy runs at a fraction of PCIe bandwidth).
    cudaEvent_t start = mark();
    const float* xyz = deviceXyz_.get(); // prepareCoordinates put them there
    uploadArrays();
    cudaEvent_t uploaded = mark();
    stage("upload", start, uploaded);
    progress(0.1, "upload");

    method_ = problem.method == Method::Auto ? chooseMethod(problem) : problem.method;
    report.method = method_;
    switch (method_)
    {
      case Method::BruteForce:
        particles_ = inputOrderParticles_.ensure(n, "particles");
        orderToInput_ = nullptr;
        makeParticles<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(xyz, n, particles_);
        NG_CUDA_CHECK_LAUNCH("makeParticles");
        report.extraDeviceBytes = inputOrderParticles_.bytes();
        break;
      case Method::RadixSort:
        radixSort(xyz, n);
        break;
      case Method::FENNS:
      case Method::CLAWS:
        flags_ = method_ == Method::CLAWS ? clawsFlags() : SearchFlags{};
        fennsSort(xyz, n);
        break;
      case Method::CountingSort:
      default:
        countingSort(xyz, n);
        break;
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
    switch (method_)
    {
      case Method::BruteForce:
        bruteForceSearch<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(particles_, n, problem_->radiusSquared, op);
        break;
      case Method::FENNS:
      case Method::CLAWS:
        launchFenns(op);
        break;
      case Method::RadixSort:
        gridSearch<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(
          grid_, particles_, cellStart_.get(), cellCount_.get(), orderToInput_, n, problem_->radiusSquared, op);
        break;
      case Method::CountingSort:
      default:
        gridSearch<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(
          grid_, particles_, cellStart_.get(), cellStart_.get() + 1, orderToInput_, n, problem_->radiusSquared, op);
        break;
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
      // Pinned staging to the caller's pageable memory: a plain memcpy, split over threads.
      const char* from = staging + offset;
      char* to = static_cast<char*>(d.host);
      parallelSlices(copyThreads_, static_cast<std::int64_t>(d.bytes / (1 << 20)) + 1,
        [&](int, std::int64_t begin, std::int64_t end) {
          const std::size_t first = std::size_t(begin) << 20;
          const std::size_t last = std::min(d.bytes, std::size_t(end) << 20);
          if (first < last)
          {
            std::memcpy(to + first, from + first, last - first);
          }
        });
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
  template <class Op>
  void launchFenns(const Op& op)
  {
    const int cells = static_cast<int>(fenns_.coarse.cellCount());
    const float r2 = problem_->radiusSquared;
    if (method_ == Method::FENNS && fennsScatter_)
    {
      const std::size_t bytes = fennsScatterSharedBytes<Op>(fenns_.fineCells);
      NG_CUDA_CHECK(cudaFuncSetAttribute(fennsSearchScatter<Op>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                      static_cast<int>(bytes)),
        "raising the FENNS search's shared-memory limit");
      fennsSearchScatter<<<cells, fennsScatterBlockSize, bytes, stream_>>>(
        fenns_, particles_, cellStart_.get(), cellCount_.get(), orderToInput_, r2, op);
      return;
    }
    const std::size_t bytes = fennsSharedBytes<Op>(fenns_.fineCells);
    NG_CUDA_CHECK(cudaFuncSetAttribute(fennsSearch<Op>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
      "raising the FENNS search's shared-memory limit");
    fennsSearch<<<cells, fennsThreads, bytes, stream_>>>(fenns_, particles_, layout_, orderToInput_, r2, op, flags_);
  }

  /// CLAWS's ideas, all on unless NEIGHBORGRID_CLAWS_DISABLE names some of them (a comma-separated
  /// list of symmetric, reorder, merged, warps): a benchmarking knob to show what each one buys.
  static SearchFlags clawsFlags()
  {
    SearchFlags flags;
    flags.symmetric = flags.clawsLayout = flags.merged = flags.balancedWarps = true;
    if (const char* disabled = std::getenv("NEIGHBORGRID_CLAWS_DISABLE"))
    {
      const std::string list = std::string(",") + disabled + ",";
      flags.symmetric = list.find(",symmetric,") == std::string::npos;
      flags.clawsLayout = list.find(",reorder,") == std::string::npos;
      flags.merged = list.find(",merged,") == std::string::npos;
      flags.balancedWarps = list.find(",warps,") == std::string::npos;
    }
    return flags;
  }

  /// Auto's rule, fitted to Testing/Benchmarks/results-H100.csv (every row of FENNS Tables 1-3 and
  /// CLAWS Tables 1-2 on an H100; Testing/Benchmarks/RESULTS.md):
  ///  - With cells of size R, Counting Sort and Radix Sort share one search and differ in the sort.
  ///    Below about 1.5M points Counting Sort's atomic counting is the cheaper sort (524k points:
  ///    0.11 against 0.15 ms); from 2M on the radix sort wins (4M: 3.24 against 3.43 ms).
  ///  - FENNS and CLAWS (CLAWS is faster than FENNS on every row) pay off only where the
  ///    baselines' grid is far coarser than R: FENNS Table 2, where the baselines are held to the
  ///    18^3 grid (4M points: CLAWS 1.4 ms against 41 ms). The model: a baseline costs about
  ///    6e-10 ms per candidate pair (27 cells' worth per point) plus 0.04 ms; CLAWS costs 2.5 times
  ///    a baseline on a grid of cell size R, and never less than 0.6 ms (per-block set-up of its
  ///    shared-memory grids). Auto takes CLAWS where that estimate is below 80% of the baseline's.
  Method chooseMethod(const Problem& p) const
  {
    const double n = double(p.count);
    const Grid baseline = baselineGrid(static_cast<int>(p.count));
    double volume = 1.0;
    const double fineCell = p.radius * cellMargin;
    for (int a = 0; a < 3; ++a)
    {
      volume *= std::max(double(p.extent[a]), fineCell);
    }
    constexpr double msPerCandidate = 6e-10;
    const double baselineMs = msPerCandidate * n * 27.0 * n / double(baseline.cellCount()) + 0.04;
    const double radiusGridMs = msPerCandidate * n * 27.0 * n / volume * fineCell * fineCell * fineCell;
    const double clawsMs = std::max(0.6, 2.5 * radiusGridMs);
    if (clawsMs < 0.8 * baselineMs)
    {
      return Method::CLAWS;
    }
    return p.count >= 1500000 ? Method::RadixSort : Method::CountingSort;
  }

  /// The uniform grid of Counting Sort and Radix Sort: cells of size R (and at most about 2n
  /// cells). Benchmarking knob: NEIGHBORGRID_BASELINE_CELL_SIZE sets a larger cell size, to repeat
  /// FENNS Table 2, where every method uses the same 18^3 grid.
  Grid baselineGrid(int n) const
  {
    double radius = problem_->radius;
    const float* extent = problem_->extent;
    if (const char* size = std::getenv("NEIGHBORGRID_BASELINE_CELL_SIZE"))
    {
      radius = std::max(radius, std::atof(size) / cellMargin);
    }
    return makeGrid(extent, radius, std::max<std::int64_t>(2 * std::int64_t(n), 1 << 20));
  }

  /// Green: sort (cell hash, index) pairs, find cell ranges, gather positions in cell order.
  void radixSort(const float* xyz, int n)
  {
    grid_ = baselineGrid(n);
    const int cells = static_cast<int>(grid_.cellCount());
    unsigned* hash = hash_.ensure(n, "cell hashes");
    unsigned* sortedHash = sortedHash_.ensure(n, "sorted cell hashes");
    int* index = index_.ensure(n, "particle indices");
    orderToInput_ = orderToInputBuffer_.ensure(n, "cell order to input order");
    int* cellStart = cellStart_.ensure(cells, "cell starts");
    int* cellEnd = cellCount_.ensure(cells, "cell ends");
    particles_ = ordered_.ensure(n, "particles (cell order)");

    hashCells<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(xyz, n, grid_, hash, index);
    NG_CUDA_CHECK_LAUNCH("hashCells");
    int bits = 1;
    while (bits < 31 && (1u << bits) < static_cast<unsigned>(cells))
    {
      ++bits;
    }
    std::size_t scratchBytes = 0;
    NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratchBytes, hash, sortedHash, index, orderToInput_, n,
                    0, bits, stream_),
      "sizing the radix sort");
    void* scratch = scanScratch_.ensure(scratchBytes, "radix sort scratch");
    NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, scratchBytes, hash, sortedHash, index, orderToInput_, n,
                    0, bits, stream_),
      "radix-sorting cell hashes");
    NG_CUDA_CHECK(cudaMemsetAsync(cellStart, 0, sizeof(int) * cells, stream_), "clearing cell starts");
    NG_CUDA_CHECK(cudaMemsetAsync(cellEnd, 0, sizeof(int) * cells, stream_), "clearing cell ends");
    findCellRanges<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(sortedHash, n, cellStart, cellEnd);
    NG_CUDA_CHECK_LAUNCH("findCellRanges");
    gatherParticles<<<blocksFor(n), threadsPerBlock, 0, stream_>>>(xyz, n, orderToInput_, particles_);
    NG_CUDA_CHECK_LAUNCH("gatherParticles");
    report_->extraDeviceBytes = std::int64_t(sizeof(unsigned)) * 2 * n + std::int64_t(sizeof(int)) * 2 * n +
      std::int64_t(sizeof(int)) * 2 * cells + std::int64_t(sizeof(Particle)) * n + std::int64_t(scratchBytes);
  }

  /// FENNS grid sizes from the radius, the point count and the device's shared memory:
  ///  - coarse cells are a whole number k of fine cells wide, fine cells R (+ margin) wide, so the
  ///    fine grid over a coarse cell widened by R on each side has exactly k + 2 cells per axis
  ///    and a lookup of 27 fine cells tests as few candidates as a grid of cell size R;
  ///  - k (at most 10) is the largest for which coarse cells hold at most fennsTargetPerCell_
  ///    particles on average (a chunk is fennsChunk = 1024: most cells then fit one chunk), and
  ///    the grid has at most as many cells as a block can keep counters for in shared memory
  ///    (the sort counts per cell there);
  ///  - the fine grid has at most 12 cells per axis and must fit in shared memory.
  FennsGrid planFenns(const Problem& p, int n) const
  {
    const float* e = p.extent;
    const double extentMax = std::max({ double(e[0]), double(e[1]), double(e[2]) });
    // Cell assignment rounds at the scale of the coordinates: keep the border and the fine cells
    // wider than R by that much, so a neighbor is never classed inner or two fine cells away.
    const double slack = extentMax * std::ldexp(1.0, -20);
    const double minCell = p.radius * cellMargin + slack;
    // The sort counts per cell (FENNS) or per inner and border section (CLAWS) in shared memory.
    const int countersPerCell = flags_.clawsLayout ? 2 : 1;
    const std::int64_t maxCells =
      std::max<std::int64_t>(1, sharedMemoryPerBlock_ / (sizeof(int) * countersPerCell) - 64);
    auto cellsFor = [&](double size) {
      std::int64_t total = 1;
      for (int a = 0; a < 3; ++a)
      {
        total *= static_cast<std::int64_t>(std::floor(double(e[a]) / size)) + 1;
      }
      return total;
    };
    int k = 1;
    while (k < 10 && cellsFor((k + 1) * minCell) > 1 &&
      double(n) / double(cellsFor((k + 1) * minCell)) <= fennsTargetPerCell_)
    {
      ++k;
    }
    double cell = k * minCell;
    while (cellsFor(cell) > maxCells)
    {
      cell *= 1.05; // the shared-memory counters bound the coarse grid
    }
    FennsGrid g;
    g.coarse = makeGrid(e, cell / cellMargin, maxCells);
    g.coarseCellSize = static_cast<float>(g.coarse.cellSize());
    g.border = static_cast<float>(minCell);
    g.fineOffset = g.border;
    const double span = double(g.coarseCellSize) + 2.0 * double(g.border);
    // Sparse data ask for large coarse cells; a fine grid of more than 12^3 cells would then cost
    // more to clear and scan per batch than its lookups save.
    int f = std::max(1, std::min(12, static_cast<int>(std::floor(span / minCell + 1e-9))));
    while (f > 1 &&
      std::max(fennsSharedBytes<SmoothingOperation<4>>(f * f * f), fennsScatterSharedBytes<SmoothingOperation<4>>(f * f * f)) +
          4096 > static_cast<std::size_t>(sharedMemoryPerBlock_))
    {
      --f;
    }
    g.fineDim = f;
    g.fineCells = f * f * f;
    g.inverseFineCellSize = static_cast<float>(f / span);
    return g;
  }

  /// FENNS sort parts 1 and 2 (Fenns.cuh): cellStart_ ends up holding each cell's start (cells + 1
  /// entries, the last n) and cellCount_ each cell's inner start. With the CLAWS layout, cellStart_
  /// holds the starts of the 2 * cells sections (inner sections, then border sections) and n.
  void fennsSort(const float* xyz, int n)
  {
    fenns_ = planFenns(*problem_, n);
    const int cells = static_cast<int>(fenns_.coarse.cellCount());
    const int sections = flags_.clawsLayout ? 2 * cells : cells;
    int* counts = cellStart_.ensure(sections + 1, "coarse cell counts and starts");
    int* innerStart = cellCount_.ensure(cells + 1, "coarse cell inner starts");
    particles_ = ordered_.ensure(n, "particles (cell order)");
    orderToInput_ = orderToInputBuffer_.ensure(n, "cell order to input order");
    const std::size_t sharedBytes = sizeof(int) * sections;
    auto countKernel = flags_.clawsLayout ? clawsCount : fennsCount;
    NG_CUDA_CHECK(cudaFuncSetAttribute(countKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sharedBytes)),
      "raising the coarse count's shared-memory limit");
    NG_CUDA_CHECK(cudaFuncSetAttribute(fennsReorder, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sharedBytes)),
      "raising the FENNS reorder's shared-memory limit");
    // A grid-stride loop over all particles with as many resident blocks as fit: each block
    // flushes its shared counters once, so fewer, fuller blocks mean fewer global atomics.
    int perSm = 0;
    NG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, countKernel, 1024, sharedBytes),
      "coarse count occupancy");
    const int blocks = std::max(1, std::min(blocksFor(n) / 4 + 1, std::max(1, perSm) * multiprocessors_));

    NG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * (sections + 1), stream_), "clearing coarse counts");
    countKernel<<<blocks, 1024, sharedBytes, stream_>>>(xyz, n, fenns_, counts);
    NG_CUDA_CHECK_LAUNCH("coarse count");
    std::size_t exclusiveBytes = 0, inclusiveBytes = 0;
    NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, exclusiveBytes, counts, innerStart, cells + 1, stream_),
      "sizing the coarse scan");
    NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, inclusiveBytes, counts, counts, sections + 1, stream_),
      "sizing the coarse scan");
    void* scratch = scanScratch_.ensure(std::max(exclusiveBytes, inclusiveBytes), "scan scratch");
    if (flags_.clawsLayout)
    {
      // CLAWS: one inclusive scan gives every section's end; particles fill sections from the end.
      NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch, inclusiveBytes, counts, counts, sections + 1, stream_),
        "inclusive scan of section counts");
      const int reorderBlocks = std::min(blocksFor(n), 32 * multiprocessors_);
      clawsReorder<<<reorderBlocks, threadsPerBlock, 0, stream_>>>(xyz, n, fenns_, counts, particles_, orderToInput_);
      NG_CUDA_CHECK_LAUNCH("clawsReorder");
      layout_ = CellLayout{ counts, nullptr, cells, true };
      report_->extraDeviceBytes = std::int64_t(sizeof(int)) * (sections + 1) + std::int64_t(sizeof(Particle)) * n +
        std::int64_t(sizeof(int)) * n + std::int64_t(inclusiveBytes);
      return;
    }
    // FENNS: exclusive sums (border sections fill from each cell's start) and inclusive sums
    // (inner sections fill from each cell's end), as in the paper.
    NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch, exclusiveBytes, counts, innerStart, cells + 1, stream_),
      "exclusive scan of coarse counts");
    NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch, inclusiveBytes, counts, counts, cells + 1, stream_),
      "inclusive scan of coarse counts");
    int* borderCount = borderCount_.ensure(cells, "coarse cell border counts");
    NG_CUDA_CHECK(cudaMemsetAsync(borderCount, 0, sizeof(int) * cells, stream_), "clearing border counts");
    fennsReorder<<<blocks, 1024, sharedBytes, stream_>>>(
      xyz, n, fenns_, counts, innerStart, borderCount, particles_, orderToInput_);
    NG_CUDA_CHECK_LAUNCH("fennsReorder");
    fennsCellStarts<<<blocksFor(cells), threadsPerBlock, 0, stream_>>>(cells, borderCount, counts);
    NG_CUDA_CHECK_LAUNCH("fennsCellStarts");
    layout_ = CellLayout{ counts, innerStart, cells, false };
    report_->extraDeviceBytes = std::int64_t(sizeof(int)) * (3 * cells + 2) + std::int64_t(sizeof(Particle)) * n +
      std::int64_t(sizeof(int)) * n + std::int64_t(std::max(exclusiveBytes, inclusiveBytes));
  }

  void countingSort(const float* xyz, int n)
  {
    grid_ = baselineGrid(n);
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
  int copyThreads_ = static_cast<int>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  int sharedMemoryPerBlock_ = 48 * 1024;
  int multiprocessors_ = 1;
  int fennsTargetPerCell_ = fennsChunk * 3 / 5;
  bool fennsScatter_ = false;
  Method method_ = Method::CountingSort;
  FennsGrid fenns_;
  SearchFlags flags_;
  CellLayout layout_;
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

  PinnedBuffer<char> rawStaging_;
  PinnedBuffer<char> boundsHost_;
  DeviceBuffer<char> deviceRaw_;
  DeviceBuffer<double> boundsPartial_;
  DeviceBuffer<unsigned long long> firstBad_;
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
  DeviceBuffer<int> cellCount_; // counts (Counting Sort), cell ends (Radix Sort), inner starts (FENNS)
  DeviceBuffer<int> borderCount_;
  DeviceBuffer<unsigned> hash_;
  DeviceBuffer<unsigned> sortedHash_;
  DeviceBuffer<int> index_;
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
