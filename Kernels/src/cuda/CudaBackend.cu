// CUDA backend: the device, transfers, the memory check, and the passes of an operation
// (OperationPlan.h) around a method's sort and search. The methods, one file each:
//  - CountingSort.cu (Hoetzlein 2013), RadixSort.cu (Green 2008/2012), both searching through
//    GridSearch.cuh;
//  - Fenns.cu / Fenns.cuh: FENNS (Groß et al. 2019) and CLAWS (2020);
//  - Bayraktar.cu (Bayraktar et al. 2009): a candidate list per cell;
//  - StagedTiles.cu: the FENNS/CLAWS family on cells of R/2, tiles staged in shared memory;
//  - BruteForce.cu: every pair, for validation.
// Per-particle radii run in one search over a tree of their own (RadiusTree.cu), and Smoothing
// Length on grids of its own (KthNeighbor.cu).
// They share the grid (CellGrid.h, CellTable.h): cells keyed by their coordinates, occupied cells
// only, points in frame coordinates of their cell, pairs within rounding of R decided in double
// from the caller's coordinates (PairTest.h), which stay on the device as given.
//
// Sizes: up to 2^31 - 2 points per run; every index into per-point arrays of more than one value
// and every byte count is 64-bit. Before a run the backend adds up the device memory it will need
// and says clearly when that does not fit (Engine::setDeviceMemoryLimit can lower the ceiling).
// Host arrays cross PCIe through a ring of pinned slices filled and emptied by worker threads
// (TransferRing.h), so host memory stays O(ring) and transfers run near the bus's speed.
#include "../OperationPlan.h"
#include "../Parallel.h"
#include "../Slabs.h"
#include "../Timer.h"
#include "CudaRun.h"
#include "KthNeighbor.h"
#include "Queries.cuh"
#include "PeriodicImages.h"
#include "RadiusTree.h"
#include "ResidentSlabs.h"
#include "TransferRing.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

// --- Weights and gathers ------------------------------------------------------------------------
__global__ void setWeightsKernel(Particle* __restrict__ particles, int n, const std::int32_t* __restrict__ orderToInput,
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

/// byInput[input index] = ordered[method order].
__global__ void scatterToInputKernel(const float* __restrict__ ordered, int n, const std::int32_t* __restrict__ orderToInput,
  float* __restrict__ byInput)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    byInput[orderToInput ? orderToInput[s] : s] = ordered[s];
  }
}

/// Periodic images made on the device: an image (input index >= particles) takes its particle's
/// density, in method order.
__global__ void imagesTakeParticleDensityKernel(const float* __restrict__ ordered, int n, int particles,
  const std::int32_t* __restrict__ orderToInput, const std::int32_t* __restrict__ imageOf,
  const float* __restrict__ byInput, float* __restrict__ fixed)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    const int i = orderToInput ? orderToInput[s] : s;
    fixed[s] = i >= particles ? byInput[imageOf[i - particles]] : ordered[s];
  }
}

__global__ void gatherKernel(const float* __restrict__ values, int components, int first, int count, int n,
  const std::int32_t* __restrict__ orderToInput, float* __restrict__ gathered)
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

/// Testing knob (NEIGHBORGRID_TEST_CUDA_FAULT): an illegal address, the sticky error that ends a
/// CUDA context, to test that the next run recovers.
__global__ void illegalAddressKernel(int* volatile target)
{
  *target = 1;
}

// --- The device ------------------------------------------------------------------------------
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
      info.why = std::string("the CUDA device ") + prop.name + " has compute capability " + std::to_string(prop.major) +
        "." + std::to_string(prop.minor) + "; this build has code for 8.0 and newer";
      return;
    }
    info.usable = true;
  });
  return info;
}

class CudaBackend final : public BackendImplementation
{
public:
  CudaBackend(std::int64_t memoryLimit, int device)
    : memoryLimit_(memoryLimit), deviceRaw_(inputPool_), mass_(pool_),
      values_(pool_), smoothed_(pool_), density_(pool_), count_(pool_), orderedDensity_(pool_), gathered_(pool_),
      decided_(pool_), valid_(pool_), queryRaw_(pool_), sourceRadii_(pool_), orderedRadii_(pool_),
      queryRadii_(pool_), queryValues_(pool_), radiusSums_(pool_), imageDensity_(pool_), images_(inputPool_)
  {
    if (device >= 0)
    {
      NG_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    }
    NG_CUDA_CHECK(cudaGetDevice(&device_.id), "cudaGetDevice");
    cudaDeviceProp prop{};
    NG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_.id), "cudaGetDeviceProperties");
    device_.name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1)
    {
      device_.name += ", device " + std::to_string(device_.id); // which one, where a node has several
    }
    device_.multiprocessors = prop.multiProcessorCount;
    device_.sharedMemoryPerBlock = static_cast<int>(prop.sharedMemPerBlockOptin);
    device_.sharedMemoryPerSm = static_cast<int>(prop.sharedMemPerMultiprocessor);
    device_.reservedSharedMemoryPerBlock = static_cast<int>(prop.reservedSharedMemPerBlock);
    NG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // The side stream's work is short and others wait on it: at the greatest priority the SMs
    // take its blocks as soon as they free, not after every block of a long grid queued before
    // (the tiles' listing beside the gather of the particles; StagedTiles::listItems).
    int leastPriority = 0, greatestPriority = 0;
    NG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&leastPriority, &greatestPriority), "cudaDeviceGetStreamPriorityRange");
    NG_CUDA_CHECK(cudaStreamCreateWithPriority(&sideStream_, cudaStreamNonBlocking, greatestPriority), "cudaStreamCreate");
    // The stages' clock (stamp).
    NG_CUDA_CHECK(cudaStreamCreateWithFlags(&clockStream_, cudaStreamNonBlocking), "cudaStreamCreate");
    NG_CUDA_CHECK(cudaEventCreateWithFlags(&streamPassed_, cudaEventDisableTiming), "cudaEventCreate");
    NG_CUDA_CHECK(cudaEventCreate(&coordinatesBegan_), "cudaEventCreate");
    NG_CUDA_CHECK(cudaEventCreate(&coordinatesArrived_), "cudaEventCreate");
  }
  ~CudaBackend() override
  {
    for (auto& m : methods_)
    {
      m.reset();
    }
    for (cudaEvent_t e : events_)
    {
      cudaEventDestroy(e);
    }
    cudaEventDestroy(streamPassed_);
    cudaEventDestroy(coordinatesBegan_);
    cudaEventDestroy(coordinatesArrived_);
    if (stream_)
    {
      cudaStreamDestroy(stream_);
    }
    if (sideStream_)
    {
      cudaStreamDestroy(sideStream_);
    }
    if (clockStream_)
    {
      cudaStreamDestroy(clockStream_);
    }
  }

  /// The caller's coordinates travel as they are. The ring's workers find the bounds while they
  /// copy them into pinned memory (no pass of their own: the device's took 35 us and a round trip
  /// at 4M points); a non-finite coordinate is named by a pass on the host. They stay on the
  /// device: the methods read them to make frame coordinates and to decide pairs within
  /// rounding of R.
  void prepareCoordinates(const Points& points, int threads, Problem& problem) override
  {
    // CUDA's current device is per host thread: this engine's device, whichever thread runs.
    NG_CUDA_CHECK(cudaSetDevice(device_.id), "cudaSetDevice");
    clockStamps_ = points.count >= clockStampsFrom;
    // The stream is idle (every run ends waiting for it): this event marks the stage's start.
    stamp(coordinatesBegan_);
    const std::int64_t n = points.count;
    const bool isDouble = points.type == ScalarType::Float64;
    const std::size_t bytes = 3 * std::size_t(n) * (isDouble ? sizeof(double) : sizeof(float));
    if (memoryLimit_ > 0 && deviceRaw_.bytes() > bytes)
    {
      deviceRaw_.release(); // a larger run's coordinates would count against the limit
    }
    checkFits(std::int64_t(bytes), 0, n, "the coordinates");
    char* raw = static_cast<char*>(deviceRaw_.ensureBytes(bytes, "the coordinates as given"));
    CoordinateBounds bounds;
    uploadBegins_.record(stream_);
    uploadMarked_ = true;
    transfers_.uploadCoordinates(raw, points.xyz, n, isDouble, stream_, "uploading coordinates", bounds);
    input_ = InputPoints{ raw, isDouble };
    if (!bounds.allFinite)
    {
      findBoundsOnHost(points, threads, problem.lo, problem.hi); // names the first non-finite point
      throw Error("NeighborGrid: a coordinate is not finite"); // not reached: the pass above throws
    }
    for (int a = 0; a < 3; ++a)
    {
      problem.lo[a] = bounds.lo[a];
      problem.hi[a] = bounds.hi[a];
    }
    // Auto and FENNS/CLAWS's coarse cells estimate density over the bulk: a few far points stretch
    // the bounds (RESULTS.md, "the bulk of the points"). A periodic run's points are the box's.
    const bool readsBulk = problem.method == Method::FENNS || problem.method == Method::CLAWS ||
      (problem.method == Method::Auto && autoReadsBulk(problem));
    problem.boundsStretched = readsBulk && !problem.imagesByBackend &&
      findBulkExtent(points.xyz, n, isDouble, problem.lo, problem.hi, problem.bulkLo, problem.bulkHi);
    // No wait for the last slices' copies: the host goes on to plan the run and launch the sort,
    // which the stream runs after them. The coordinates stage still ends when the last of them
    // is on the device (collectStageTimes).
    stamp(coordinatesArrived_);
    coordinatesInFlight_ = true;
    imagesInRun_ = false;
    if (problem.imagesByBackend)
    {
      makeImages(raw, isDouble, n, problem);
    }
    else if (memoryLimit_ > 0)
    {
      images_.release(); // held buffers count against the limit
    }
  }

  /// Particles as their own queries (count, density, Shepard and SPH smoothing). Probes and grids
  /// keep the host's images (Periodic.cxx); radii and gradients are not periodic yet.
  bool makesPeriodicImages(const Problem& p) const override
  {
    return !p.queries.separate && !p.radiusPass && p.operation != Operation::Gradient;
  }

  /// The wrapped particles and their images (PeriodicImages.h) become the run's particles; the
  /// bounds are theirs. Throws DoesNotFit before any output is written when they do not fit one run.
  void makeImages(const char* raw, bool isDouble, std::int64_t n, Problem& problem)
  {
    const std::int64_t images = images_.count(raw, isDouble, n, problem.box, stream_);
    if (n + images > maxPointsPerRun)
    {
      throw DoesNotFit("NeighborGrid: " + std::to_string(n) + " particles and their " + std::to_string(images) +
          " periodic images exceed one run",
        0, 0);
    }
    checkFits(DeviceImages::bytesFor(n, images), std::int64_t(deviceRaw_.bytes()), n + images,
      "the particles wrapped into the periodic box and their images");
    images_.write(raw, isDouble, n, images, device_.multiprocessors, stream_, problem.lo, problem.hi);
    imagesInRun_ = true;
    problem.images = images;
    problem.count = n + images;
    input_ = InputPoints{ images_.coordinates(), true };
  }

  void run(const Problem& problem, Report& report) override
  {
    problem_ = &problem;
    report_ = &report;
    stageMarks_.clear();
    eventsUsed_ = 0;
    resultPagesFaultedIn_ = false;
    const ProgressReporter& progress = *problem.progress;
    if (problem.operation == Operation::SmoothingLength)
    {
      runSmoothingLength(problem, report);
      return;
    }
    if (problem.radiusPass && problem.radiusPass->wholeRule)
    {
      runRadiusTree(problem, report);
      return;
    }

    const Method chosen = problem.method == Method::Auto ? chooseMethod(problem) : problem.method;
    report.method = chosen;
    method_ = methodFor(chosen);
    startRun(problem, report);
    planMemory(problem);
    run_.decided = decided_.ensure(1, "decision counter");
    NG_CUDA_CHECK(cudaMemsetAsync(run_.decided, 0, sizeof(unsigned long long), stream_), "clearing the decision counter");
    clearBesideUpload(problem);

    // Masses, arrays to smooth and explicit queries go through the pinned ring.
    cudaEvent_t start = mark();
    uploadArrays();
    uploadQueries();
    cudaEvent_t uploaded = mark();
    stage("upload", start, uploaded);
    progress(0.1, "upload");

    method_->sort(run_);
    uniformWeight_ = method_->sortWeighsOne() ? 1.0f : std::numeric_limits<float>::quiet_NaN();
    if (std::getenv("NEIGHBORGRID_TEST_CUDA_FAULT"))
    {
      illegalAddressKernel<<<1, 1, 0, stream_>>>(reinterpret_cast<int*>(std::uintptr_t(8)));
      NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "the injected fault (NEIGHBORGRID_TEST_CUDA_FAULT)");
    }
    stage("sort", uploaded, mark());
    progress(0.2, "sort");

    if (problem.radiusPass)
    {
      runRadiusPass();
    }
    else
    {
      runOperation(*this, problem);
    }

    report.device = device_.name;
    report.extraDeviceBytes = method_->heldBytes();
    collectStageTimes(report);
  }

  /// What the run's kernels see of this problem (CudaRun), before any method or search.
  void startRun(const Problem& problem, Report& report)
  {
    run_ = CudaRun{};
    run_.problem = &problem;
    run_.report = &report;
    run_.stream = stream_;
    run_.side = sideStream_;
    run_.device = &device_;
    run_.count = problem.count;
    run_.input = input_;
  }

  /// A radius-layer search's results for `queries` queries: counts or terms() sums a query.
  void downloadRadiusResults(const RadiusPass& pass, const void* output, std::size_t queries, Report& report)
  {
    Timer timer;
    if (pass.sum == RadiusSum::Count)
    {
      transfers_.download(pass.counts, output, queries * sizeof(std::int32_t), stream_, "downloading results");
    }
    else
    {
      transfers_.download(pass.sums, output, queries * std::size_t(pass.terms()) * sizeof(float), stream_,
        "downloading results");
    }
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "waiting for the results");
    addStage(report, "download", timer.milliseconds());
  }

  /// Smoothing Length: its own grids and search (KthNeighbor.h), then the download.
  void runSmoothingLength(const Problem& problem, Report& report)
  {
    report.method = Method::RadixSort; // its grids are grouped by Green's radix sort
    startRun(problem, report);
    const std::int64_t queries = problem.kthQueries;
    checkFits(CudaKthNeighbor::plannedBytes(problem) + 4 * queries, std::int64_t(deviceRaw_.bytes()) +
        (problem.images > 0 ? images_.heldBytes() : 0), problem.count,
      "the Smoothing Length search's cells, particles and results");
    float* out = density_.ensure(std::size_t(queries), "support radii");
    cudaEvent_t begin = mark();
    const int levels = kth_.run(run_, queries, problem.neighborTarget, out);
    stage("smoothing length", begin, mark());
    (*problem.progress)(0.9, "smoothing length");
    Timer timer;
    transfers_.download(problem.supportRadius, out, std::size_t(queries) * sizeof(float), stream_,
      "downloading results");
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "waiting for the results");
    addStage(report, "download", timer.milliseconds());
    report.device = device_.name;
    report.extraDeviceBytes = kth_.heldBytes();
    report.radiusLevels = levels;
    collectStageTimes(report);
  }

  /// A whole-rule search of the radius layer (RadiusPass::wholeRule): the radius tree's own order
  /// and boxes (RadiusTree.h), one search, then the sums' download.
  void runRadiusTree(const Problem& p, Report& report)
  {
    const RadiusPass& pass = *p.radiusPass;
    report.method = Method::RadiusTree;
    startRun(p, report);
    const std::size_t n = static_cast<std::size_t>(p.count);
    const bool sumsValues = pass.sum == RadiusSum::Smoothing || pass.sum == RadiusSum::Gradient;
    const int c = sumsValues ? pass.components : 0;
    const std::size_t terms = static_cast<std::size_t>(pass.terms());
    checkFits(CudaRadiusTree::plannedBytes(p.count, c) + std::int64_t(n) * (4 + 4 + 4 * c + 4 * std::int64_t(terms)),
      std::int64_t(deviceRaw_.bytes()), p.count, "the radius tree, the particles' radii, weights and values, and the sums");
    cudaEvent_t begin = mark();
    const float* radii = nullptr;
    if (pass.sourceRadii)
    {
      float* raw = sourceRadii_.ensure(n, "radii");
      transfers_.upload(raw, pass.sourceRadii, n * sizeof(float), stream_, "uploading radii");
      radii = raw;
    }
    const float* weights = nullptr;
    if (p.mass)
    {
      float* raw = mass_.ensure(n, "weights");
      transfers_.upload(raw, p.mass, n * sizeof(float), stream_, "uploading weights");
      weights = raw;
    }
    float* values = nullptr;
    if (sumsValues)
    {
      values = values_.ensure(n * c, "values");
      transfers_.upload(values, pass.sourceValues, n * c * sizeof(float), stream_, "uploading values");
    }
    void* output = pass.sum == RadiusSum::Count ? static_cast<void*>(count_.ensure(n, "neighbor counts"))
                                                : static_cast<void*>(radiusSums_.ensure(n * terms, "sums"));
    cudaEvent_t uploaded = mark();
    stage("upload", begin, uploaded);
    (*p.progress)(0.1, "upload");
    tree_.build(run_, radii, pass.constantRadius, weights, p.constantMass);
    const float* treeValues = sumsValues ? tree_.valuesInTreeOrder(run_, values, c) : nullptr;
    cudaEvent_t built = mark();
    stage("sort", uploaded, built);
    (*p.progress)(0.2, "sort");
    withRadiusOperation(pass, p.kernelType, p.dimension, [&](auto op) {
      op.rule.queryRadii = radii; // the queries are the particles, in input order
      op.values = treeValues;
      op.queryValues = values;
      op.output = static_cast<typename decltype(op)::Value*>(output);
      launchRadiusTreeSearch(run_, tree_, op);
    });
    NG_CUDA_CHECK_LAUNCH("search");
    stage("search", built, mark());
    downloadRadiusResults(pass, output, n, report);
    report.device = device_.name;
    report.extraDeviceBytes = tree_.heldBytes();
    collectStageTimes(report);
  }

  // --- executor primitives (OperationPlan.h) -------------------------------------------------
  KernelParams kernel() const { return problem_->frameKernel(method_->cellSize()); }
  /// The particles' weights: one, or the mass (an array or a constant). A pass over every
  /// particle (41 us at 4M points on the H100) is skipped when all of them already weigh what the
  /// pass would write: after the sort (sortWeighsOne) or an earlier pass of the same run.
  void setWeights(WeightMode mode)
  {
    const int n = static_cast<int>(problem_->count);
    const bool mass = mode == WeightMode::Mass;
    const bool fromArray = mass && problem_->mass;
    const float constant = mass ? problem_->constantMass : 1.0f;
    if (!fromArray && uniformWeight_ == constant)
    {
      return;
    }
    setWeightsKernel<<<blocksFor(n), 256, 0, stream_>>>(
      method_->particles(), n, method_->orderToInput(), fromArray ? mass_.get() : nullptr, constant);
    NG_CUDA_CHECK_LAUNCH("setWeights");
    uniformWeight_ = fromArray ? std::numeric_limits<float>::quiet_NaN() : constant;
  }
  void divideWeightsByDensity(const float* orderedDensity)
  {
    uniformWeight_ = std::numeric_limits<float>::quiet_NaN();
    const int n = static_cast<int>(problem_->count);
    if (problem_->images > 0)
    {
      // An image's own neighborhood is cut off at the images' outer edge: it weighs m / rho of
      // its particle, as the host's images do (Periodic.cxx, sphWeights).
      const int particles = static_cast<int>(problem_->count - problem_->images);
      float* scratch = imageDensity_.ensure(2 * std::size_t(n), "densities of the periodic images");
      scatterToInputKernel<<<blocksFor(n), 256, 0, stream_>>>(orderedDensity, n, method_->orderToInput(), scratch);
      imagesTakeParticleDensityKernel<<<blocksFor(n), 256, 0, stream_>>>(orderedDensity, n, particles,
        method_->orderToInput(), images_.imageOf(), scratch, scratch + n);
      NG_CUDA_CHECK_LAUNCH("images take their particles' density");
      orderedDensity = scratch + n;
    }
    divideWeightsKernel<<<blocksFor(n), 256, 0, stream_>>>(method_->particles(), n, orderedDensity);
    NG_CUDA_CHECK_LAUNCH("divideWeightsByDensity");
  }
  /// Where the method adds into the count or density output (CudaMethod::addsToOutput), clears
  /// that output on the side stream from where the coordinates' upload began, while the upload's
  /// last slices are still on their way over PCIe and the memory is idle; the search joins it
  /// (search). Cleared on the stream before the search instead, the 4M rows' search stages took
  /// count 0.898-0.899 ms against 0.894-0.895, density 0.979-0.980 against 0.975-0.976 (H200;
  /// RESULTS.md, issue 22).
  void clearBesideUpload(const Problem& p)
  {
    run_.clearedOutput = nullptr;
    const bool marked = uploadMarked_;
    uploadMarked_ = false;
    if (!sideStream_ || p.radiusPass || p.queries.separate || !method_->addsToOutput(p) ||
      (p.operation != Operation::NeighborCount && (p.operation != Operation::Density || !p.density)))
    {
      return;
    }
    if (!marked)
    {
      uploadBegins_.record(stream_); // no upload since the last run: after what the stream holds
    }
    void* output = p.operation == Operation::NeighborCount ? static_cast<void*>(countOutput()) : densityOutput();
    uploadBegins_.holdBack(sideStream_, "clearing the output beside the upload");
    NG_CUDA_CHECK(cudaMemsetAsync(output, 0, 4 * std::size_t(p.resultCount()), sideStream_), "clearing the output");
    outputCleared_.record(sideStream_);
    run_.clearedOutput = output;
  }
  std::int32_t* countOutput() { return count_.ensure(std::size_t(problem_->resultCount()), "neighbor counts"); }
  float* densityOutput()
  {
    return problem_->density ? density_.ensure(std::size_t(problem_->resultCount()), "density") : nullptr;
  }
  std::uint8_t* validOutput()
  {
    return problem_->valid ? valid_.ensure(std::size_t(problem_->resultCount()), "valid point mask") : nullptr;
  }
  float* orderedDensity() { return orderedDensity_.ensure(std::size_t(problem_->count), "density (method order)"); }
  const float* gatherValues(std::size_t array, int first, int count)
  {
    const int n = static_cast<int>(problem_->count);
    const SmoothedArray& a = (*problem_->smoothed)[array];
    float* gathered = gathered_.ensure(std::size_t(n) * count, "smoothing values (method order)");
    gatherKernel<<<blocksFor(n), 256, 0, stream_>>>(
      values_.get() + valueOffsets_[array], a.components, first, count, n, method_->orderToInput(), gathered);
    NG_CUDA_CHECK_LAUNCH("gatherValues");
    return gathered;
  }
  float* smoothingOutput(std::size_t array) { return smoothed_.get() + resultOffsets_[array]; }

  template <class Op>
  void search(const Op& op, const char* stageName)
  {
    cudaEvent_t begin = mark();
    if (run_.clearedOutput)
    {
      outputCleared_.holdBack(stream_, "joining the output's clearing");
    }
    method_->search(run_, op);
    NG_CUDA_CHECK_LAUNCH(stageName);
    cudaEvent_t end = mark();
    faultInResultPages();
    // Progress and abort between passes: the GPU cannot be interrupted inside a kernel.
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), stageName);
    if (method_->searchRest(run_))
    {
      end = mark();
      NG_CUDA_CHECK(cudaStreamSynchronize(stream_), stageName);
    }
    stage(stageName, begin, end);
    (*problem_->progress)(0.9, stageName);
  }

  DeviceQueries deviceQueries()
  {
    const QuerySet& set = problem_->queries;
    DeviceQueries queries;
    queries.count = static_cast<int>(set.count);
    queries.isGrid = set.isGrid;
    if (set.isGrid)
    {
      for (int a = 0; a < 3; ++a)
      {
        queries.origin[a] = set.grid.origin[a];
        queries.spacing[a] = set.grid.spacing[a];
        queries.dimensions[a] = set.grid.dimensions[a];
        queries.firstIndex[a] = set.grid.firstIndex[a];
      }
    }
    else
    {
      queries.points = InputPoints{ queryRaw_.get(), set.points.type == ScalarType::Float64 };
    }
    return queries;
  }

  template <class Op>
  void searchQueries(const Op& op, const char* stageName)
  {
    const DeviceQueries queries = deviceQueries();
    cudaEvent_t begin = mark();
    launchQueries(run_, queries, method_->querySource(), op);
    NG_CUDA_CHECK_LAUNCH(stageName);
    stage(stageName, begin, mark());
    faultInResultPages();
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), stageName);
    (*problem_->progress)(0.9, stageName);
  }

  /// A search of the radius layer (Problem::radiusPass, RadiusOperations.h) on the method's
  /// cells: radii and values go to the method's order, then one thread per query.
  void runRadiusPass()
  {
    const Problem& p = *problem_;
    const RadiusPass& pass = *p.radiusPass;
    const std::size_t n = static_cast<std::size_t>(p.count);
    const std::size_t m = static_cast<std::size_t>(p.queries.count);
    const std::size_t c = static_cast<std::size_t>(pass.components);
    const bool sumsValues = pass.sum == RadiusSum::Smoothing || pass.sum == RadiusSum::Gradient;
    cudaEvent_t begin = mark();
    setWeights(WeightMode::Mass);
    const QuerySource source = method_->querySource();
    const float* orderedRadii = nullptr;
    if (pass.sourceRadii)
    {
      float* raw = sourceRadii_.ensure(n, "radii");
      transfers_.upload(raw, pass.sourceRadii, n * sizeof(float), stream_, "uploading radii");
      float* ordered = orderedRadii_.ensure(n, "radii (method order)");
      gatherKernel<<<blocksFor(p.count), 256, 0, stream_>>>(raw, 1, 0, 1, int(n), source.orderToInput, ordered);
      NG_CUDA_CHECK_LAUNCH("gathering radii");
      orderedRadii = ordered;
    }
    const float* orderedValues = nullptr;
    if (sumsValues)
    {
      float* raw = values_.ensure(n * c, "values");
      transfers_.upload(raw, pass.sourceValues, n * c * sizeof(float), stream_, "uploading values");
      float* ordered = gathered_.ensure(n * c, "values (method order)");
      gatherKernel<<<blocksFor(p.count), 256, 0, stream_>>>(raw, int(c), 0, int(c), int(n), source.orderToInput, ordered);
      NG_CUDA_CHECK_LAUNCH("gathering values");
      orderedValues = ordered;
    }
    float* queryRadii = nullptr;
    if (pass.queryRadii)
    {
      queryRadii = queryRadii_.ensure(m, "query radii");
      transfers_.upload(queryRadii, pass.queryRadii, m * sizeof(float), stream_, "uploading query radii");
    }
    float* queryValues = nullptr;
    if (pass.sum == RadiusSum::Gradient)
    {
      queryValues = queryValues_.ensure(m * c, "query values");
      transfers_.upload(queryValues, pass.queryValues, m * c * sizeof(float), stream_, "uploading query values");
    }
    const std::size_t terms = static_cast<std::size_t>(pass.terms());
    void* output = pass.sum == RadiusSum::Count ? static_cast<void*>(count_.ensure(m, "neighbor counts"))
                                                : static_cast<void*>(radiusSums_.ensure(m * terms, "sums"));
    cudaEvent_t searched = mark();
    stage("upload", begin, searched);
    withRadiusOperation(pass, p.kernelType, p.dimension, [&](auto op) {
      op.rule.queryRadii = queryRadii;
      op.rule.sourceRadii = orderedRadii;
      op.values = orderedValues;
      op.queryValues = queryValues;
      op.output = static_cast<typename decltype(op)::Value*>(output);
      launchRadiusQueries(run_, deviceQueries(), source, op);
    });
    NG_CUDA_CHECK_LAUNCH("search");
    stage("search", searched, mark());
    unsigned long long decided = 0;
    NG_CUDA_CHECK(cudaMemcpyAsync(&decided, run_.decided, sizeof decided, cudaMemcpyDeviceToHost, stream_),
      "reading the decision counter");
    downloadRadiusResults(pass, output, m, *report_);
    report_->pairsDecidedInDouble = static_cast<std::int64_t>(decided);
  }

  /// Where the run's results go: the caller's arrays and the device arrays that fill them.
  struct ResultDownload
  {
    const void* device;
    void* host;
    std::size_t bytes;
  };
  std::vector<ResultDownload> resultDownloads() const
  {
    const Problem& p = *problem_;
    const std::size_t n = static_cast<std::size_t>(p.returnedCount()); // not the images' results
    std::vector<ResultDownload> downloads;
    if (p.operation == Operation::NeighborCount)
    {
      downloads.push_back({ count_.get(), p.neighborCount, n * sizeof(std::int32_t) });
    }
    if (p.density && p.operation != Operation::NeighborCount)
    {
      downloads.push_back({ density_.get(), p.density, n * sizeof(float) });
    }
    if (p.operation == Operation::Smoothing)
    {
      for (std::size_t a = 0; a < p.smoothed->size(); ++a)
      {
        downloads.push_back({ smoothed_.get() + resultOffsets_[a], (*p.smoothed)[a].output,
          n * std::size_t((*p.smoothed)[a].components) * sizeof(float) });
      }
    }
    if (p.valid)
    {
      downloads.push_back({ valid_.get(), p.valid, n });
    }
    return downloads;
  }

  /// While the GPU searches, the caller's result pages are made resident (TransferRing::faultIn),
  /// once a run: fresh arrays would otherwise fault page by page in the download.
  void faultInResultPages()
  {
    if (slab_ && !slab_->pagesFaultedIn)
    {
      slab_->pagesFaultedIn = true; // the caller's whole arrays, during the first slab's search
      for (const CallerResult& r : slab_->results)
      {
        transfers_.faultIn(r.caller, r.bytes(slab_->count));
      }
    }
    if (resultPagesFaultedIn_ || slab_)
    {
      return;
    }
    resultPagesFaultedIn_ = true;
    for (const auto& d : resultDownloads())
    {
      transfers_.faultIn(d.host, d.bytes);
    }
  }

  void finishOutputs()
  {
    if (slab_)
    {
      keepSlabResults();
      return;
    }
    const Problem& p = *problem_;
    const std::size_t n = static_cast<std::size_t>(p.returnedCount()); // not the images' results
    const std::vector<ResultDownload> downloads = resultDownloads();
    unsigned long long decided = 0;
    NG_CUDA_CHECK(cudaMemcpyAsync(&decided, run_.decided, sizeof decided, cudaMemcpyDeviceToHost, stream_),
      "reading the decision counter");
    Timer timer;
    for (const auto& d : downloads)
    {
      transfers_.download(d.host, d.device, d.bytes, stream_, "downloading results");
    }
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "waiting for the results");
    addStage(*report_, "download", timer.milliseconds());
    report_->pairsDecidedInDouble = static_cast<std::int64_t>(decided);
    if (p.operation == Operation::NeighborCount)
    {
      // On every core: a serial pass took 1-2 ms at 4M points.
      report_->neighborPairs = parallelSum(static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency()))),
        p.neighborCount, std::int64_t(n));
    }
  }


  /// Resident slabs (ResidentSlabs.h): Neighbor Count, Density and Kernel Smoothing (Shepard, or
  /// SPH with the particle volumes given: the slab layer's second pass) of particles that are
  /// their own queries, every point's coordinates, masses, values and results on the device at
  /// once beside a run of a slab; no engine memory limit (it would not see the resident arrays).
  bool runResidentSlabs(Problem& whole, int threads, Report& report) override
  {
    NG_CUDA_CHECK(cudaSetDevice(device_.id), "cudaSetDevice");
    const bool smoothing = whole.operation == Operation::Smoothing &&
      (whole.normalization == Normalization::Shepard || whole.sphWeightsGiven);
    const bool takes = (whole.operation == Operation::NeighborCount || whole.operation == Operation::Density || smoothing) &&
      !whole.queries.separate && !whole.radiusPass && !whole.imagesByBackend && !whole.valid && memoryLimit_ == 0;
    if (!takes)
    {
      return false;
    }
    const std::int64_t n = whole.count;
    ActiveSlab active;
    active.count = n;
    active.results = callerResults(whole);
    std::int64_t resultWords = 0, valueWords = 0;
    for (const CallerResult& r : active.results)
    {
      resultWords += r.words;
    }
    for (std::size_t a = 0; smoothing && a < whole.smoothed->size(); ++a)
    {
      valueWords += (*whole.smoothed)[a].components;
    }
    const bool masses = whole.usesMass() && whole.mass;
    const std::int64_t element = whole.input.type == ScalarType::Float64 ? 8 : 4;
    const std::int64_t resident = (3 * element + 4 * (resultWords + valueWords + (masses ? 1 : 0))) * n;
    pool_.releaseAll();
    inputPool_.releaseAll();
    if (resident > 0.7 * double(bytesAvailable()))
    {
      return false; // the host's slabs
    }
    struct Release // the resident arrays go back however this ends
    {
      DevicePool& pool;
      ~Release() { pool.releaseAll(); }
    } release{ residentPool_ };
    std::uint32_t* results = wholeResults_.ensure(std::size_t(n * resultWords), "every point's results");
    for (CallerResult& r : active.results)
    {
      r.whole = results;
      results += std::size_t(n) * std::size_t(r.words);
    }
    uploadWhole(whole, threads, active, report);
    const SlabCuts cuts = cutResidentSlabs(whole, active, report);
    if (cuts.cuts.empty())
    {
      return false;
    }
    try
    {
      for (int s = 0; s < cuts.slabs(); ++s)
      {
        runResidentSlab(whole, cuts, s, active, report);
      }
    }
    catch (const DoesNotFit&)
    {
      slab_ = nullptr;
      return false; // no output written yet: the host's slabs
    }
    catch (...)
    {
      slab_ = nullptr;
      throw;
    }
    (*whole.progress)(0.95, "download");
    Timer timer;
    for (const CallerResult& r : active.results)
    {
      transfers_.download(r.caller, r.whole, r.bytes(n), stream_, "downloading results");
    }
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "waiting for the results");
    addStage(report, "download", timer.milliseconds());
    report.pairsDecidedInDouble = std::int64_t(active.decided);
    if (whole.operation == Operation::NeighborCount)
    {
      report.neighborPairs = parallelSum(std::max(1, std::min(threads, 16)), whole.neighborCount, n);
    }
    return true;
  }

private:
  /// A caller's result array in resident slabs: 4-byte words per point, and every point's results
  /// on the device.
  struct CallerResult
  {
    void* caller = nullptr;
    int words = 1;
    std::uint32_t* whole = nullptr;
    std::size_t bytes(std::int64_t n) const { return std::size_t(n) * std::size_t(words) * 4; }
  };
  /// The caller's result arrays of `p`, in the order of resultDownloads().
  static std::vector<CallerResult> callerResults(const Problem& p)
  {
    std::vector<CallerResult> results;
    if (p.operation == Operation::NeighborCount)
    {
      results.push_back({ p.neighborCount, 1 });
    }
    if (p.density && p.operation != Operation::NeighborCount)
    {
      results.push_back({ p.density, 1 });
    }
    for (std::size_t a = 0; p.operation == Operation::Smoothing && a < p.smoothed->size(); ++a)
    {
      results.push_back({ (*p.smoothed)[a].output, (*p.smoothed)[a].components });
    }
    return results;
  }

  /// Where a resident slab's run keeps its results (finishOutputs) and finds its inputs.
  struct ActiveSlab
  {
    std::int64_t count = 0;                // every point of the request
    int axis = 0;                          // the axis the cuts divide
    const std::int64_t* indices = nullptr; // input index of each of the slab's points
    std::int64_t own = 0;                  // the slab's own points, first
    const float* wholeMass = nullptr;
    std::vector<const float*> wholeValues; // every point's values of each array to smooth
    std::vector<CallerResult> results;
    bool pagesFaultedIn = false;
    unsigned long long decided = 0;
  };

  /// Every coordinate (the ring finds their bounds), mass and value to smooth up once.
  void uploadWhole(Problem& whole, int threads, ActiveSlab& active, Report& report)
  {
    const std::int64_t n = whole.count;
    const bool isDouble = whole.input.type == ScalarType::Float64;
    Timer timer;
    (*whole.progress)(0.0, "uploading coordinates");
    char* raw = wholeXyz_.ensure(3 * std::size_t(n) * (isDouble ? 8 : 4), "every point's coordinates");
    CoordinateBounds bounds;
    transfers_.uploadCoordinates(raw, whole.input.xyz, n, isDouble, stream_, "uploading coordinates", bounds);
    if (!bounds.allFinite)
    {
      findBoundsOnHost(whole.input, threads, whole.lo, whole.hi); // names the first non-finite point
      throw Error("NeighborGrid: a coordinate is not finite");
    }
    std::copy(bounds.lo, bounds.lo + 3, whole.lo);
    std::copy(bounds.hi, bounds.hi + 3, whole.hi);
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "uploading coordinates");
    addStage(report, "coordinates", timer.milliseconds());
    Timer arrays;
    if (whole.usesMass() && whole.mass)
    {
      active.wholeMass = wholeMass_.ensure(std::size_t(n), "every point's mass");
      transfers_.upload(wholeMass_.get(), whole.mass, 4 * std::size_t(n), stream_, "uploading masses");
    }
    if (whole.operation == Operation::Smoothing)
    {
      std::size_t words = 0;
      for (const SmoothedArray& a : *whole.smoothed)
      {
        words += std::size_t(n) * std::size_t(a.components);
      }
      float* values = wholeValues_.ensure(words, "every point's values to smooth");
      for (const SmoothedArray& a : *whole.smoothed)
      {
        transfers_.upload(values, a.values, 4 * std::size_t(n) * std::size_t(a.components), stream_,
          "uploading arrays to smooth");
        active.wholeValues.push_back(values);
        values += std::size_t(n) * std::size_t(a.components);
      }
    }
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "uploading arrays");
    addStage(report, "upload", arrays.milliseconds());
    (*whole.progress)(0.1, "uploading coordinates");
  }

  /// Cuts along the longest axis, from a histogram made on the device, into slabs whose runs
  /// (with the resident arrays) fit the device's memory. No cuts where none does.
  SlabCuts cutResidentSlabs(const Problem& whole, ActiveSlab& active, Report& report)
  {
    Timer timer;
    int axis = 0;
    for (int a = 1; a < 3; ++a)
    {
      axis = whole.hi[a] - whole.lo[a] > whole.hi[axis] - whole.lo[axis] ? a : axis;
    }
    // The memory a run needs a point, coordinates included, with the slab's input indices: a
    // probe of a slab's size and the whole's density.
    Problem probe = whole;
    probe.count = std::min(whole.count, pointsPerRun());
    probe.hi[axis] = whole.lo[axis] + (whole.hi[axis] - whole.lo[axis]) * double(probe.count) / double(whole.count);
    const double perPoint = double(bytesNeeded(probe)) / double(probe.count) + 8.0;
    const double fits = 0.9 * double(bytesAvailable()) / perPoint;
    const std::uint64_t capacity = static_cast<std::uint64_t>(std::max(0.0, std::min(double(pointsPerRun()), fits)));
    const AxisHistogram histogram = slabGather_.histogram(wholeXyz_.get(), whole.input.type == ScalarType::Float64,
      whole.count, axis, whole.lo[axis], whole.hi[axis], 8192, device_.multiprocessors, stream_);
    SlabCuts cuts = cutSlabs(histogram, haloMargin(whole.hi[axis], whole.radius), capacity, 1024);
    active.axis = axis;
    addStage(report, "slab gathers", timer.milliseconds());
    return cuts;
  }

  /// Slab s: its points gathered on the device, its run, its own points' results kept.
  void runResidentSlab(const Problem& whole, const SlabCuts& cuts, int s, ActiveSlab& active, Report& report)
  {
    Timer timer;
    const double inf = std::numeric_limits<double>::infinity();
    const bool isDouble = whole.input.type == ScalarType::Float64;
    SlabRange range;
    range.axis = active.axis;
    range.lower = s == 0 ? -inf : cuts.cuts[s - 1];
    range.upper = s + 1 == cuts.slabs() ? inf : cuts.cuts[s];
    range.haloLower = s == 0 ? -inf : range.lower - haloMargin(range.lower, whole.radius);
    range.haloUpper = s + 1 == cuts.slabs() ? inf : range.upper + haloMargin(range.upper, whole.radius);
    const SlabCounts counts = slabGather_.count(wholeXyz_.get(), isDouble, whole.count, range, stream_);
    if (counts.total() > maxPointsPerRun)
    {
      throw Error("NeighborGrid: a resident slab holds " + std::to_string(counts.total()) +
        " points, more than a run takes (its histogram's bound was " + std::to_string(cuts.most[s]) + ")");
    }
    const std::size_t m = std::size_t(counts.total());
    char* slabXyz = static_cast<char*>(deviceRaw_.ensureBytes(3 * m * (isDouble ? 8 : 4), "the slab's coordinates"));
    active.indices = slabIndices_.ensure(std::max<std::size_t>(1, m), "the slab's input indices");
    active.own = counts.own;
    slabGather_.write(wholeXyz_.get(), isDouble, whole.count, range, slabXyz, slabIndices_.get(), stream_);
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "gathering the slab's points");
    addStage(report, "slab gathers", timer.milliseconds());
    report.slabs = cuts.slabs();
    report.slabHaloPoints += counts.halo;
    if (m == 0)
    {
      return;
    }
    Problem slab = whole;
    slab.count = std::int64_t(m);
    slab.input.count = slab.count;
    slab.lo[range.axis] = std::max(whole.lo[range.axis], range.haloLower);
    slab.hi[range.axis] = std::min(whole.hi[range.axis], range.haloUpper);
    const double base = 0.1 + 0.85 * s / cuts.slabs(), span = 0.85 / cuts.slabs();
    const ProgressReporter& wholeProgress = *whole.progress;
    const ProgressCallback inSlab = [&](double fraction, const char* stage) {
      wholeProgress(base + span * fraction, stage);
      return true;
    };
    const ProgressReporter slabProgress(inSlab);
    slab.progress = &slabProgress;
    input_ = InputPoints{ slabXyz, isDouble };
    slab_ = &active;
    run(slab, report);
    slab_ = nullptr;
  }

  /// finishOutputs of a resident slab: its own points' results into every point's.
  void keepSlabResults()
  {
    const std::vector<ResultDownload> downloads = resultDownloads();
    unsigned long long decided = 0;
    NG_CUDA_CHECK(cudaMemcpyAsync(&decided, run_.decided, sizeof decided, cudaMemcpyDeviceToHost, stream_),
      "reading the decision counter");
    if (downloads.size() != slab_->results.size())
    {
      throw Error("NeighborGrid: internal error: a resident slab's results do not match the caller's arrays");
    }
    cudaEvent_t begin = mark();
    for (std::size_t a = 0; a < downloads.size(); ++a)
    {
      scatterSlabWords(static_cast<const std::uint32_t*>(downloads[a].device), slab_->results[a].words, slab_->own,
        slab_->indices, slab_->results[a].whole, stream_);
    }
    stage("slab gathers", begin, mark());
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "keeping the slab's results");
    slab_->decided += decided;
  }

  CudaMethod* methodFor(Method method)
  {
    auto& slot = methods_[static_cast<int>(method)];
    if (!slot)
    {
      switch (method)
      {
        case Method::BruteForce:
          slot = makeBruteForce(pool_);
          break;
        case Method::RadixSort:
          slot = makeRadixSort(pool_);
          break;
        case Method::FENNS:
          slot = makeFenns(pool_, false);
          break;
        case Method::CLAWS:
          slot = makeFenns(pool_, true);
          break;
        case Method::Bayraktar:
          slot = makeBayraktar(pool_);
          break;
        case Method::StagedTiles:
          slot = makeStagedTiles(pool_);
          break;
        case Method::CountingSort:
        default:
          slot = makeCountingSort(pool_);
          break;
      }
    }
    return slot.get();
  }

  /// Auto's rules that read the bulk take sparse data only, and the bulk is never sparser than
  /// the bounds: where the bounds hold a point per cell of R or more, no sample is taken (256
  /// scattered reads of a large array: 40-75 us on the build machine, with the caches cold).
  static bool autoReadsBulk(const Problem& p) { return pointsPerCellOfR(p, false) < 1.0; }

  /// Points per cell of size R over the bounds, or over the bulk (Problem::bulkLo) where a few
  /// far points stretch the bounds.
  static double pointsPerCellOfR(const Problem& p, bool overBulk)
  {
    const double fine = cellSizeFor(p.radius, 1);
    const double volume = overBulk ? bulkVolume(p, fine) : boundsVolume(p, fine);
    return double(p.count) * fine * fine * fine / volume;
  }

  /// Auto's rule, fitted to Testing/Benchmarks/results-H100.csv (every row of FENNS Tables 1-3
  /// and CLAWS Tables 1-2 and the scale sweep on an H100; Testing/Benchmarks/RESULTS.md):
  ///  - Counting Sort and Radix Sort share one search and differ in the sort. Below about 1.5M
  ///    points Counting Sort's atomic counting is the cheaper sort, and so it is on sparse data
  ///    (fewer than 0.2 points per cell of size R, or keys wider than 64 bits: Radix Sort then
  ///    sorts many bits for few points per cell); otherwise the radix sort wins (4M dense: 5.22
  ///    against 5.42 ms), with the least device memory (22.4 bytes per point at 10^9 points).
  ///  - CLAWS on sparse data, and Radix Sort there where it looks its cells up by identity
  ///    (below).
  ///  - Staged Tiles on dense data with many neighbors (below).
  ///  - CLAWS wherever the baselines' grid is held more than twice as coarse as R: FENNS Table 2,
  ///    where they are held to the 18^3 grid (NEIGHBORGRID_BASELINE_CELL_SIZE). CLAWS bins at R
  ///    and was no slower on any of its rows (H200, results-H200.csv: 0.058-0.101 ms against
  ///    Counting Sort's 0.068-0.115 from 1,024 to 65,536 points; 0.19-0.21 against 1.52 at
  ///    524,288; 1.2-1.7 against 86 at 4M). The cost model this replaces gave CLAWS a floor of
  ///    0.6 ms and so kept Counting Sort on every row of up to 65,536 points, up to 1.33x slower.
  static Method chooseMethod(const Problem& p)
  {
    const double n = double(p.count);
    const double fine = cellSizeFor(p.radius, 1);
    const double coarse = baselineCellSize(p.radius);
    if (coarse > 2.0 * fine)
    {
      return Method::CLAWS;
    }
    // Sparse data (between 2e-4 and 1 point per cell of size R over the bulk, from 256K points
    // on): CLAWS, whose coarse cells then span many cells of size R and keep its blocks busy,
    // while the baselines visit 27 nearly empty cells per point (4M points, R = 0.5 in a box of
    // 180: CLAWS 1.27 ms, Counting Sort 3.76; 524,288 points, R = 0.3 in a box of 360, 3e-4 per
    // cell: CLAWS 0.173 ms, Counting Sort 0.297, since its coarse cells may be 256 R wide). The
    // density is the bulk's (findBulkExtent): one far point made sparse data of the bounds.
    // Except where Radix Sort's cells are looked up in an identity table (the key its own slot:
    // each of the 27 lookups one read; RadixCells::looksUpByIdentity), from 0.25 points per cell
    // and 1.5M points on: there its search of nearly empty cells is the faster one (H200,
    // 2026-11-29, twenty-fifth session, RESULTS.md "Auto: Radix Sort on sparse data with an
    // identity table": uniform 4M at 0.25, 0.5 and 0.75 points per cell, Radix Sort 1.375,
    // 1.449 and 1.525 ms against CLAWS's 1.416, 1.590 and 1.689; FENNS Table 1, 4M points,
    // R = 0.8 and 1 in a box of 180, 0.37 and 0.72 per cell: 1.415 and 1.511 against 1.489 and
    // 1.650). Where the key's
    // bits round up past the table (4M at 0.2 per cell: 27 bits; 16M at 0.25 and 0.5) the
    // lookups hash and CLAWS is 2.6-2.2x faster (1.381 against 3.624 ms; 5.84 and 6.48 against
    // 12.9 and 11.1). Below 256K points Counting Sort's small sorts are about as fast as CLAWS's
    // (H200, FENNS Tables 1 and 3, the sixth session's results-H200.csv: 0.056-0.073 ms against
    // 0.051-0.080 at 1,024 points, 0.083-0.100 against 0.084-0.102 at 65,536), but for the sizes
    // below.
    const double perCell = pointsPerCellOfR(p, false);
    const double bulkPerCell = pointsPerCellOfR(p, true);
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, coarse);
    if (p.count >= 262144 && bulkPerCell > 2e-4 && bulkPerCell < 1.0)
    {
      const bool radixLooksUpByIdentity = p.count >= 1500000 && p.count <= 300000000 && perCell >= 0.25 &&
        RadixCells::looksUpByIdentity(p.count, layout);
      return radixLooksUpByIdentity ? Method::RadixSort : Method::CLAWS;
    }
    // Small sparse clouds: CLAWS. Its small sort is one launch, whose last block scans and
    // writes the tallies the host reads into mapped pinned memory; Counting Sort's is two to four
    // launches, but its search gains on CLAWS's as the cloud grows denser or larger. CLAWS's time
    // over Counting Sort's (H200, 2026-11-28, eighth session; RESULTS.md, "Auto: CLAWS on small
    // sparse clouds"; densities over the bulk of the points):
    //  - FENNS Tables 1 and 3, three runs: 1,024 points 0.71-0.95 and 8,192 points 0.75-1.02,
    //    at 6e-7 to 1.4e-3 points per cell of R;
    //  - the small table, four runs: 1,024 and 4,096 points 0.84-0.95 up to 0.1 per cell,
    //    0.96-1.09 at 0.3 and 0.5, 1.15-1.46 from 1; 8,192 points 0.93-0.94 at 1e-3, 0.95-1.03
    //    at 1e-2 and 0.1, 1.11-1.14 at 0.3 and 0.5; 16,384 points 1.03-1.09 at 1e-3 and 1e-2,
    //    1.2-1.7 above.
    // Not with a far point (p.boundsStretched), whose keys are too wide for CLAWS's table
    // (outlier-8K: CLAWS 1.31-1.34x Counting Sort).
    const bool smallSparse = (p.count <= 4096 && bulkPerCell < 0.3) || (p.count <= 8192 && bulkPerCell < 2e-3);
    if (smallSparse && !p.boundsStretched)
    {
      return Method::CLAWS;
    }
    const bool sparse = layout.mode == KeyMode::Wide || perCell < 0.2;
    // Data of at least one point per cell of size R (about 4 neighbors), from 1M points on:
    // Staged Tiles. With many neighbors its culled rows of cells of R / 2 test about 2.0
    // candidates per neighbor where the 27-cell search tests 6.6 (4M points, 80 neighbors: 2.73
    // ms against Radix Sort's 4.66); with fewer its tiles of cells of R stage 64 cells' points in
    // shared memory. Uniform clouds, density (H200, `--table=sparser`, RESULTS.md "Auto and
    // Staged Tiles on sparser data"): 4M points at 1, 1.25, 1.5 and 2 points per cell, Staged
    // Tiles 1.78, 1.57, 1.45 and 1.11 ms against the fastest other method's 1.83, 1.87, 1.92 and
    // 1.95; 16M at 1, 6.58 against 6.91; 1M at 1, 0.486 against CLAWS's 0.468. Below one point
    // per cell CLAWS or Radix Sort is faster (the rule above). Its lookup table and kept keys
    // need 29-61 bytes per point, so a billion points stay with Radix Sort (22 bytes).
    // Separate queries (Queries.cuh): a grid goes by bricks on any method's cells, and all tie
    // (512^3 density volume of 4M particles: Radix Sort 46.1 ms, Staged Tiles 45.7); a list of
    // points gathers one thread per query, where Staged Tiles' cells of R / 2 cost 125 lookups
    // per query against 27 (the same volume gathered point by point: Radix Sort 115.9 ms,
    // Staged Tiles 146.1 ms). So Radix Sort, in less memory.
    if (p.count >= 1000000 && p.count <= 300000000 && perCell >= 1.0 && layout.mode != KeyMode::Wide &&
      !p.queries.separate)
    {
      return Method::StagedTiles;
    }
    return p.count >= 1500000 && !sparse ? Method::RadixSort : Method::CountingSort;
  }

  /// The bytes this run needs beyond the coordinates, against what the device can give: a clear
  /// error when it cannot; cached buffers are released first when they stand in the way.
  struct MemoryPart
  {
    std::string what;
    std::int64_t bytes;
  };

  void planMemory(const Problem& p)
  {
    const std::vector<MemoryPart> parts = memoryParts(p, method_, run_);
    std::int64_t needed = 0;
    for (const MemoryPart& part : parts)
    {
      needed += part.bytes;
    }
    std::ostringstream list;
    for (std::size_t k = 0; k < parts.size(); ++k)
    {
      list << (k ? ", " : "") << formatBytes(double(parts[k].bytes)) << " " << parts[k].what;
    }
    // Resident: the coordinates, and the periodic images made from them.
    const std::int64_t resident = std::int64_t(deviceRaw_.bytes()) + (p.images > 0 ? images_.heldBytes() : 0);
    checkFits(needed, resident, p.count, list.str());
  }

  std::int64_t bytesNeeded(const Problem& p) override
  {
    NG_CUDA_CHECK(cudaSetDevice(device_.id), "cudaSetDevice");
    if (p.operation == Operation::SmoothingLength)
    {
      const std::int64_t element = p.input.type == ScalarType::Float32 ? 4 : 8;
      return 3 * element * p.count + CudaKthNeighbor::plannedBytes(p) + 4 * p.kthQueries;
    }
    CudaMethod* method = methodFor(p.method == Method::Auto ? chooseMethod(p) : p.method);
    CudaRun run;
    run.problem = &p;
    run.device = &device_;
    run.count = p.count;
    const std::int64_t element = p.input.type == ScalarType::Float32 ? 4 : 8;
    std::int64_t needed = 3 * element * p.count;
    for (const MemoryPart& part : memoryParts(p, method, run))
    {
      needed += part.bytes;
    }
    return needed;
  }

  std::int64_t bytesAvailable() override
  {
    NG_CUDA_CHECK(cudaSetDevice(device_.id), "cudaSetDevice");
    std::size_t freeBytes = 0, totalBytes = 0;
    NG_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes), "cudaMemGetInfo");
    const std::int64_t available =
      std::int64_t(freeBytes) + std::int64_t(pool_.heldBytes()) + std::int64_t(inputPool_.heldBytes());
    return memoryLimit_ > 0 ? std::min(available, memoryLimit_) : available;
  }

  /// What a run holds on the device beyond the coordinates, part by part.
  std::vector<MemoryPart> memoryParts(const Problem& p, CudaMethod* method, const CudaRun& run)
  {
    const std::int64_t n = p.count;
    const std::int64_t results = p.resultCount();
    using Part = MemoryPart;
    std::vector<Part> parts;
    if (p.usesMass() && p.mass)
    {
      parts.push_back({ "masses", 4 * n });
    }
    std::int64_t components = 0, widest = 0;
    if (p.operation == Operation::Smoothing)
    {
      for (const auto& a : *p.smoothed)
      {
        components += a.components;
        widest = std::max<std::int64_t>(widest, std::min(a.components, maxComponentsPerPass));
      }
      parts.push_back({ "arrays to smooth and their results", 4 * (n + results) * components });
      parts.push_back({ "one pass of values in method order", 4 * n * widest });
    }
    if (p.operation == Operation::NeighborCount)
    {
      parts.push_back({ "neighbor counts", 4 * results });
    }
    if (p.density || (p.operation == Operation::Smoothing && p.normalization == Normalization::SPH))
    {
      parts.push_back({ "density", 4 * results });
    }
    if (p.valid)
    {
      parts.push_back({ "valid point mask", results });
    }
    if (p.queries.separate && !p.queries.isGrid)
    {
      const std::int64_t element = p.queries.points.type == ScalarType::Float32 ? 4 : 8;
      parts.push_back({ "query coordinates", 3 * element * p.queries.count });
    }
    if (p.operation == Operation::Smoothing && p.normalization == Normalization::SPH)
    {
      parts.push_back({ "density in method order", 4 * n });
    }
    if (const RadiusPass* pass = p.radiusPass)
    {
      const bool sumsValues = pass->sum == RadiusSum::Smoothing || pass->sum == RadiusSum::Gradient;
      const std::int64_t c = sumsValues ? pass->components : 0;
      parts.push_back({ "radii, values and sums of the search",
        4 * (n * ((pass->sourceRadii ? 2 : 0) + 2 * c) + results * ((pass->queryRadii ? 1 : 0) +
        (pass->sum == RadiusSum::Gradient ? c : 0) + pass->terms())) });
    }
    parts.push_back({ std::string(toString(method->id())) + "'s cells, particles and scratch", method->plannedBytes(run) });
    return parts;
  }

  /// Throws when `needed` bytes (beyond `resident`, already held outside the pool) cannot be had.
  void checkFits(std::int64_t needed, std::int64_t resident, std::int64_t n, const std::string& what)
  {
    std::size_t freeBytes = 0, totalBytes = 0;
    NG_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes), "cudaMemGetInfo");
    const std::int64_t pooled = std::int64_t(pool_.heldBytes());
    const std::int64_t idleImages = imagesInRun_ ? 0 : std::int64_t(images_.heldBytes());
    const std::int64_t inputHeld = resident ? idleImages : std::int64_t(inputPool_.heldBytes());
    std::int64_t available = std::int64_t(freeBytes) + pooled + inputHeld;
    if (memoryLimit_ > 0)
    {
      available = std::min(available, memoryLimit_ - resident);
    }
    if (needed > available)
    {
      const double share = double(available) / double(needed + resident);
      const std::int64_t fit = std::max<std::int64_t>(0, static_cast<std::int64_t>(double(n) * share * 0.95));
      std::ostringstream s;
      s << "NeighborGrid: " << n << " points need " << formatBytes(double(needed + resident)) << " of GPU memory ("
        << (resident ? formatBytes(double(resident)) + " coordinates, " : std::string()) << what << ") but "
        << formatBytes(double(available + resident))
        << (memoryLimit_ > 0 ? " are allowed (the engine's memory limit)" : " are free on " + device_.name)
        << ". About " << fit << " points would fit in one run";
      throw DoesNotFit(s.str(), needed + resident, available + resident);
    }
    // Cached buffers of earlier runs stand in the way of the device's free memory, or would
    // take the run over the engine's limit.
    if (needed > std::int64_t(freeBytes) || (memoryLimit_ > 0 && needed + resident + pooled + idleImages > memoryLimit_))
    {
      pool_.releaseAll();
      if (!resident)
      {
        inputPool_.releaseAll();
      }
      else if (!imagesInRun_)
      {
        images_.release();
      }
    }
  }

  void uploadArrays()
  {
    const Problem& p = *problem_;
    const std::size_t n = static_cast<std::size_t>(p.count); // with the periodic images made here
    const std::size_t given = n - static_cast<std::size_t>(p.images);
    if (p.usesMass() && p.mass && slab_)
    {
      gatherSlabWords(reinterpret_cast<const std::uint32_t*>(slab_->wholeMass), 1, std::int64_t(n), slab_->indices,
        reinterpret_cast<std::uint32_t*>(mass_.ensure(n, "masses")), stream_);
    }
    else if (p.usesMass() && p.mass)
    {
      float* mass = mass_.ensure(n, "masses");
      transfers_.upload(mass, p.mass, given * sizeof(float), stream_, "uploading masses");
      images_.extend(mass, 1, std::int64_t(given), p.images, stream_);
    }
    valueOffsets_.clear();
    if (p.operation == Operation::Smoothing)
    {
      std::size_t values = 0;
      for (const auto& a : *p.smoothed)
      {
        valueOffsets_.push_back(values);
        values += n * std::size_t(a.components);
      }
      float* deviceValues = values_.ensure(values, "arrays to smooth");
      resultOffsets_.clear();
      std::size_t results = 0;
      for (const auto& a : *p.smoothed)
      {
        resultOffsets_.push_back(results);
        results += std::size_t(p.resultCount()) * std::size_t(a.components);
      }
      smoothed_.ensure(results, "smoothed arrays");
      for (std::size_t a = 0; a < p.smoothed->size() && slab_; ++a)
      {
        gatherSlabWords(reinterpret_cast<const std::uint32_t*>(slab_->wholeValues.at(a)), (*p.smoothed)[a].components,
          std::int64_t(n), slab_->indices, reinterpret_cast<std::uint32_t*>(deviceValues + valueOffsets_[a]), stream_);
      }
      for (std::size_t a = 0; a < p.smoothed->size() && !slab_; ++a)
      {
        const auto& array = (*p.smoothed)[a];
        transfers_.upload(deviceValues + valueOffsets_[a], array.values, given * std::size_t(array.components) * sizeof(float),
          stream_, "uploading arrays to smooth");
        images_.extend(deviceValues + valueOffsets_[a], array.components, std::int64_t(given), p.images, stream_);
      }
    }
  }

  void uploadQueries()
  {
    const QuerySet& q = problem_->queries;
    if (!q.separate || q.isGrid)
    {
      return;
    }
    const std::size_t bytes = 3 * std::size_t(q.count) * (q.points.type == ScalarType::Float32 ? 4 : 8);
    transfers_.upload(queryRaw_.ensure(bytes, "query coordinates"), q.points.xyz, bytes, stream_, "uploading queries");
  }

  /// A timed event at the stream's present point (stamp).
  cudaEvent_t mark()
  {
    if (eventsUsed_ == events_.size())
    {
      cudaEvent_t e;
      NG_CUDA_CHECK(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    cudaEvent_t e = events_[eventsUsed_++];
    stamp(e);
    return e;
  }
  /// Records the timed event `timed` once the stream gets to this point: on the clock's stream
  /// for runs of clockStampsFrom points or more, else on the stream itself. A timed event
  /// recorded on the stream held the stream's next kernel back by about 2 us (H200, a probe: 1.6
  /// us a kernel between small kernels, 3.7 with a timed event after each, 1.6 with an untimed
  /// one), and a run records three between its upload and its search: with the clock's stream
  /// the 4M count row's sort stage took 0.307-0.310 ms against 0.314, its search stage
  /// 0.904-0.905 against 0.907-0.908. But the clock's stamp takes three host calls instead of
  /// one, and where the GPU waits for the host (small clouds, after the sort's wait for its
  /// counts) they fall inside a stage (RESULTS.md, issue 22).
  void stamp(cudaEvent_t timed)
  {
    if (!clockStamps_)
    {
      NG_CUDA_CHECK(cudaEventRecord(timed, stream_), "timing the stream");
      return;
    }
    // The wait takes the record before it: one untimed event serves every stamp.
    NG_CUDA_CHECK(cudaEventRecord(streamPassed_, stream_), "marking the stream for its clock");
    NG_CUDA_CHECK(cudaStreamWaitEvent(clockStream_, streamPassed_, 0), "the clock waiting for the stream");
    NG_CUDA_CHECK(cudaEventRecord(timed, clockStream_), "timing the stream");
  }
  void stage(const char* name, cudaEvent_t begin, cudaEvent_t end) { stageMarks_.push_back({ name, begin, end }); }
  void collectStageTimes(Report& report)
  {
    NG_CUDA_CHECK(cudaStreamSynchronize(stream_), "finishing");
    NG_CUDA_CHECK(cudaStreamSynchronize(clockStream_), "reading stage times");
    if (coordinatesInFlight_)
    {
      // The engine timed prepareCoordinates on the host, which returns before the last slices'
      // copies are done (and after them where periodic images waited for them): the stage lasts
      // until both are.
      coordinatesInFlight_ = false;
      float arrived = 0.0f;
      NG_CUDA_CHECK(cudaEventElapsedTime(&arrived, coordinatesBegan_, coordinatesArrived_), "reading stage times");
      for (StageTime& s : report.stages)
      {
        if (s.stage == "coordinates")
        {
          s.milliseconds = std::max(s.milliseconds, double(arrived));
        }
      }
    }
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

  std::int64_t memoryLimit_;
  CudaDevice device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t sideStream_ = nullptr; // CudaRun::side
  cudaStream_t clockStream_ = nullptr; // stamp
  StreamMark uploadBegins_;  // the stream's point before the coordinates' upload (prepareCoordinates)
  bool uploadMarked_ = false; // uploadBegins_ marks this run's upload
  StreamMark outputCleared_; // clearBesideUpload
  cudaEvent_t streamPassed_ = nullptr; // stamp
  // Stamps on the clock's stream from this many points a run (stamp). On the H200 the papers'
  // tables (medians of four rounds, in turns) took 2-4% longer for FENNS and CLAWS on clouds of
  // 65,536 points with the clock's stamps, 1-2% less on those of 524,288 (RESULTS.md, issue 22).
  static constexpr std::int64_t clockStampsFrom = std::int64_t(1) << 18;
  bool clockStamps_ = true;
  std::vector<cudaEvent_t> events_;
  // When prepareCoordinates began and when the coordinates were on the device: the coordinates
  // stage ends at the later of that and prepareCoordinates' return (collectStageTimes).
  cudaEvent_t coordinatesBegan_ = nullptr, coordinatesArrived_ = nullptr;
  bool coordinatesInFlight_ = false;
  std::size_t eventsUsed_ = 0;
  std::vector<StageMark> stageMarks_;
  const Problem* problem_ = nullptr;
  Report* report_ = nullptr;
  CudaRun run_;
  CudaMethod* method_ = nullptr;
  InputPoints input_;
  std::vector<std::size_t> valueOffsets_;
  std::vector<std::size_t> resultOffsets_;
  TransferRing transfers_;
  bool resultPagesFaultedIn_ = false;

  DevicePool inputPool_; // the coordinates: kept when other buffers are released for a run
  DevicePool pool_;      // everything else
  DeviceBuffer<char> deviceRaw_;
  DeviceBuffer<float> mass_;
  DeviceBuffer<float> values_;
  DeviceBuffer<float> smoothed_;
  DeviceBuffer<float> density_;
  DeviceBuffer<std::int32_t> count_;
  DeviceBuffer<float> orderedDensity_;
  DeviceBuffer<float> gathered_;
  DeviceBuffer<unsigned long long> decided_;
  DeviceBuffer<std::uint8_t> valid_;
  DeviceBuffer<unsigned char> queryRaw_;
  DeviceBuffer<float> sourceRadii_;
  DeviceBuffer<float> orderedRadii_;
  DeviceBuffer<float> queryRadii_;
  DeviceBuffer<float> queryValues_;
  DeviceBuffer<float> radiusSums_;
  DeviceBuffer<float> imageDensity_;
  // The weight of every particle, NaN when they differ or are not known (setWeights).
  float uniformWeight_ = std::numeric_limits<float>::quiet_NaN();
  DeviceImages images_; // periodic images made here (Problem::imagesByBackend), with the coordinates
  // Whether this run's particles are images_'s; without a memory limit an open run keeps the
  // buffers of the last periodic one (a periodic run after it would otherwise wait on cudaFree and
  // cudaMalloc), and checkFits releases them when memory is short.
  bool imagesInRun_ = false;
  std::unique_ptr<CudaMethod> methods_[8];
  CudaKthNeighbor kth_{ pool_ };
  CudaRadiusTree tree_{ pool_ };
  // Resident slabs: held for one request only, and outside the pools a run may release.
  DevicePool residentPool_;
  DeviceBuffer<char> wholeXyz_{ residentPool_ };
  DeviceBuffer<float> wholeMass_{ residentPool_ };
  DeviceBuffer<float> wholeValues_{ residentPool_ };
  DeviceBuffer<std::uint32_t> wholeResults_{ residentPool_ };
  DeviceBuffer<std::int64_t> slabIndices_{ residentPool_ };
  DeviceSlabGather slabGather_{ residentPool_ };
  ActiveSlab* slab_ = nullptr; // the resident slab being run, if any
};

} // namespace

/// Set once a sticky error has ended this process's CUDA context: CUDA offers no way back
/// ("to continue using CUDA, the process must be terminated and relaunched", the runtime's
/// documentation of cudaErrorIllegalAddress), so the GPU stays off for the rest of the process.
std::mutex lostMutex;
std::string lostReason;

bool cudaDeviceUsable(std::string* why)
{
  {
    std::lock_guard<std::mutex> lock(lostMutex);
    if (!lostReason.empty())
    {
      if (why)
      {
        *why = lostReason;
      }
      return false;
    }
  }
  const DeviceInfo& info = probeDevice();
  if (!info.usable && why)
  {
    *why = info.why;
  }
  return info.usable;
}

bool cudaContextHealthy()
{
  (void)cudaGetLastError(); // clears errors that are not sticky
  const cudaError_t status = cudaDeviceSynchronize();
  return status == cudaSuccess && cudaGetLastError() == cudaSuccess;
}

std::string cudaMarkContextLost()
{
  const cudaError_t sticky = cudaDeviceSynchronize();
  std::lock_guard<std::mutex> lock(lostMutex);
  lostReason = std::string("an earlier CUDA error (") + cudaGetErrorName(sticky) +
    ") ended this process's CUDA context, and CUDA can only start a new one in a new process: restart the "
    "application to use the GPU again";
  return "The error ended this process's CUDA context, which CUDA cannot restore: restart the application to use "
         "the GPU again. Until then NeighborGrid runs on the CPU (Backend Auto), and Backend CUDA fails with this "
         "reason";
}

std::unique_ptr<BackendImplementation> makeCudaBackend(std::int64_t deviceMemoryLimit, int device)
{
  return std::make_unique<CudaBackend>(deviceMemoryLimit, device);
}

int cudaDeviceCount()
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess)
  {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

} // namespace detail
} // namespace neighborgrid
