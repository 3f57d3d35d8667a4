// Engine: validates a request, converts coordinates to float relative to the bounds' minimum,
// picks the backend and method, and hands the problem to the backend.
#include "Backend.h"
#include "Periodic.h"
#include "Radii.h"
#include "Parallel.h"
#include "Slabs.h"
#include "SmoothingLength.h"
#include "Timer.h"
#if defined(NEIGHBORGRID_HAS_CUDA)
#include "cuda/TransferMemory.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

namespace neighborgrid
{

const char* toString(Backend b)
{
  switch (b)
  {
    case Backend::Auto:
      return "Auto";
    case Backend::CUDA:
      return "CUDA";
    case Backend::CPU:
      return "CPU";
  }
  return "?";
}

const char* toString(Method m)
{
  switch (m)
  {
    case Method::Auto:
      return "Auto";
    case Method::CountingSort:
      return "Counting Sort";
    case Method::BruteForce:
      return "Brute Force";
    case Method::FENNS:
      return "FENNS";
    case Method::RadixSort:
      return "Radix Sort";
    case Method::CLAWS:
      return "CLAWS";
    case Method::Bayraktar:
      return "Bayraktar";
    case Method::StagedTiles:
      return "Staged Tiles";
    case Method::RadiusTree:
      return "Radius Tree";
  }
  return "?";
}

const char* toString(Operation o)
{
  switch (o)
  {
    case Operation::NeighborCount:
      return "Neighbor Count";
    case Operation::Density:
      return "Density";
    case Operation::Smoothing:
      return "Kernel Smoothing";
    case Operation::Gradient:
      return "Gradient";
    case Operation::SmoothingLength:
      return "Smoothing Length";
  }
  return "?";
}

const char* toString(Kernel k)
{
  switch (k)
  {
    case Kernel::CubicSpline:
      return "Cubic Spline";
    case Kernel::QuarticSpline:
      return "Quartic Spline";
    case Kernel::QuinticSpline:
      return "Quintic Spline";
    case Kernel::WendlandC2:
      return "Wendland C2";
  }
  return "?";
}

const char* toString(Normalization n)
{
  return n == Normalization::SPH ? "SPH" : "Shepard";
}

bool withinRadius(const double a[3], const double b[3], double radius)
{
  return detail::exactSquaredDistance(a[0], a[1], a[2], b[0], b[1], b[2]) <= radius * radius;
}

double kernelCutoffFactor(Kernel kernel)
{
  return detail::cutoffFactor(kernel);
}

double kernelValue(Kernel kernel, int dimension, double radius, double distance)
{
  const double h = radius / detail::cutoffFactor(kernel);
  const double hToD = dimension == 2 ? h * h : h * h * h;
  return detail::kernelSigma(kernel, dimension) / hToD * detail::kernelShape<double>(kernel, distance / h);
}

double kernelDerivative(Kernel kernel, int dimension, double radius, double distance)
{
  const double h = radius / detail::cutoffFactor(kernel);
  const double hToD = dimension == 2 ? h * h : h * h * h;
  return detail::kernelSigma(kernel, dimension) / (hToD * h) * detail::kernelShapeDerivative<double>(kernel, distance / h);
}

const char* toString(SmoothingLengthMode m)
{
  switch (m)
  {
    case SmoothingLengthMode::Gather:
      return "Gather";
    case SmoothingLengthMode::Scatter:
      return "Scatter";
    case SmoothingLengthMode::Symmetric:
      return "Symmetric";
  }
  return "?";
}

namespace
{

[[noreturn]] void fail(const std::string& message)
{
  throw Error("NeighborGrid: " + message);
}

template <class Enum>
bool validEnum(Enum e, Enum last)
{
  return static_cast<int>(e) >= 0 && static_cast<int>(e) <= static_cast<int>(last);
}

using detail::hasSeparateSource;

void validate(const Request& r)
{
  const bool separate = hasSeparateSource(r);
  const Points& particles = separate ? r.source : r.points;
  const char* particleName = separate ? "source" : "input";
  if (particles.count <= 0)
  {
    fail(std::string("the ") + particleName + " has no points");
  }
  if (!particles.xyz)
  {
    fail(std::string("the ") + particleName + " points have a count but no coordinates");
  }
  if (separate)
  {
    const bool grid = !r.queryGrid.empty();
    if (grid && (r.points.count || r.points.xyz))
    {
      fail("give the queries either as points or as a grid (Request::queryGrid), not both");
    }
    if (!grid && r.points.count <= 0)
    {
      fail("there are no query points");
    }
    if (!grid && !r.points.xyz)
    {
      fail("the query points have a count but no coordinates");
    }
    if (grid)
    {
      for (int a = 0; a < 3; ++a)
      {
        if (r.queryGrid.dimensions[a] < 1)
        {
          fail("every dimension of the query grid must be at least 1 (got " +
            std::to_string(r.queryGrid.dimensions[0]) + " x " + std::to_string(r.queryGrid.dimensions[1]) + " x " +
            std::to_string(r.queryGrid.dimensions[2]) + ")");
        }
        if (!std::isfinite(r.queryGrid.origin[a]) || !std::isfinite(r.queryGrid.spacing[a]))
        {
          fail("the query grid's origin and spacing must be finite");
        }
        // Grid indices stay exact in double, and so does every point's coordinate formula.
        constexpr double exactIndex = 4503599627370496.0; // 2^52
        if (std::fabs(double(r.queryGrid.firstIndex[a])) + double(r.queryGrid.dimensions[a]) > exactIndex)
        {
          fail("the query grid's indices (firstIndex + dimensions) must stay below 2^52 in magnitude");
        }
      }
      if (double(r.queryGrid.dimensions[0]) * double(r.queryGrid.dimensions[1]) * double(r.queryGrid.dimensions[2]) >
        9.0e18)
      {
        fail("the query grid has more points than a 64-bit count holds");
      }
    }
  }
  else if (r.valid)
  {
    fail("Request::valid is for queries with a separate source; every point of a single set has itself as "
         "a source");
  }
  if (r.radii)
  {
    if (!validEnum(r.smoothingLengthMode, SmoothingLengthMode::Symmetric))
    {
      fail("an enumeration in the request has an invalid value");
    }
    if (separate && r.smoothingLengthMode != SmoothingLengthMode::Scatter)
    {
      fail(std::string("with a separate source or a query grid, per-particle radii take the Scatter smoothing length "
                       "mode (a pair within R_j, W(r, h_j)): a query has no radius of its own for ") +
        toString(r.smoothingLengthMode));
    }
  }
  else if (!(std::isfinite(r.radius) && r.radius > 0.0))
  {
    std::ostringstream s;
    s << "the radius must be a finite number > 0 (got " << r.radius << ")";
    fail(s.str());
  }
  // R * R and every squared distance that matters then stay normal doubles.
  if (!r.radii && !(r.radius >= 1e-150 && r.radius <= 1e150))
  {
    std::ostringstream s;
    s << "the radius must lie between 1e-150 and 1e150 (got " << r.radius
      << "); scale the coordinates and the radius together";
    fail(s.str());
  }
  if (!validEnum(r.operation, Operation::SmoothingLength) || !validEnum(r.kernel, Kernel::WendlandC2) ||
    !validEnum(r.normalization, Normalization::SPH) || !validEnum(r.backend, Backend::CPU) ||
    !validEnum(r.method, Method::RadiusTree) ||
    !validEnum(r.points.type, ScalarType::Float64) || !validEnum(r.source.type, ScalarType::Float64))
  {
    fail("an enumeration in the request has an invalid value");
  }
  if (r.dimension != 2 && r.dimension != 3)
  {
    fail("the kernel dimension must be 2 or 3 (got " + std::to_string(r.dimension) + ")");
  }
  if (r.particleVolumes && !(r.operation == Operation::Gradient ||
                              (r.operation == Operation::Smoothing && r.normalization == Normalization::SPH)))
  {
    fail("particle volumes (Request::particleVolumes) apply to Gradient and to Kernel Smoothing with SPH "
         "normalization only");
  }
  if (r.operation == Operation::Gradient && separate)
  {
    fail("Gradient is computed at the particles (grad f_i takes f_i), not at a separate source's queries or a "
         "query grid");
  }
  if (r.particleVolumes && r.density)
  {
    fail("with particle volumes (Request::particleVolumes) no density is computed: Request::density must be null");
  }
  const bool usesMass = detail::operationUsesMass(r.operation, r.normalization);
  if (usesMass && !r.mass && !r.particleVolumes && !std::isfinite(r.constantMass))
  {
    fail("the constant mass must be finite");
  }
  switch (r.operation)
  {
    case Operation::NeighborCount:
      if (!r.neighborCount)
      {
        fail("Neighbor Count needs Request::neighborCount (an int32 array of one value per point)");
      }
      break;
    case Operation::Density:
      if (!r.density)
      {
        fail("Density needs Request::density (a float array of one value per point)");
      }
      break;
    case Operation::Smoothing:
    case Operation::Gradient:
      if (r.smoothed.empty())
      {
        fail(std::string(toString(r.operation)) + " needs at least one array (Request::smoothed)");
      }
      for (const auto& a : r.smoothed)
      {
        const std::string name = a.name.empty() ? std::string("(unnamed)") : "'" + a.name + "'";
        if (!a.values || !a.output)
        {
          fail(std::string(r.operation == Operation::Gradient ? "array " : "smoothed array ") + name +
            " needs both values and an output buffer");
        }
        if (a.components < 1)
        {
          fail("smoothed array " + name + " must have at least one component");
        }
      }
      break;
    case Operation::SmoothingLength:
      break; // validated by validateSmoothingLength
  }
}

void checkMass(const float* mass, std::int64_t n, int threads, const char* what)
{
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 65536)));
  std::vector<std::int64_t> firstBad(slices, -1);
  // In blocks whose loop has no branch, so that it vectorizes: a float is not finite where its
  // exponent bits are all set. A block with such a value is searched again.
  detail::parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    for (std::int64_t block = begin; block < end; block += 4096)
    {
      const std::int64_t stop = std::min(end, block + 4096);
      std::uint32_t bad = 0u;
      for (std::int64_t i = block; i < stop; ++i)
      {
        std::uint32_t bits;
        std::memcpy(&bits, mass + i, sizeof bits);
        bad |= (bits & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
      }
      if (bad)
      {
        firstBad[slice] = std::find_if(mass + block, mass + stop, [](float m) { return !std::isfinite(m); }) - mass;
        return;
      }
    }
  });
  for (std::int64_t i : firstBad)
  {
    if (i >= 0)
    {
      std::ostringstream s;
      s << "the " << what << " of point " << i << " is not finite (" << mass[i] << ")";
      fail(s.str());
    }
  }
}

} // namespace

namespace detail
{

void failNonFinitePoint(const Points& points, std::int64_t i)
{
  double v[3];
  for (int a = 0; a < 3; ++a)
  {
    v[a] = coordinateOf(points, i, a);
  }
  std::ostringstream s;
  s << "point " << i << " has a non-finite coordinate (" << v[0] << ", " << v[1] << ", " << v[2] << ")";
  fail(s.str());
}

/// Bounds in double; rejects non-finite coordinates, naming the first such point. One pass over
/// the array, split over threads.
template <class T>
void findBoundsTyped(const Points& points, const T* xyz, std::int64_t n, int threads, double lo[3], double hi[3])
{
  struct Partial
  {
    double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL };
    double hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
    std::int64_t firstBad = -1;
  };
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 32768)));
  std::vector<Partial> partials(slices);
  detail::parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    // A local copy: the slices' partials share a cache line, which updates in place would bounce
    // between the cores on every point.
    Partial p;
    for (std::int64_t i = begin; i < end; ++i)
    {
      const double x = xyz[3 * i], y = xyz[3 * i + 1], z = xyz[3 * i + 2];
      if (!(std::isfinite(x) && std::isfinite(y) && std::isfinite(z)))
      {
        p.firstBad = i;
        break;
      }
      p.lo[0] = std::min(p.lo[0], x);
      p.hi[0] = std::max(p.hi[0], x);
      p.lo[1] = std::min(p.lo[1], y);
      p.hi[1] = std::max(p.hi[1], y);
      p.lo[2] = std::min(p.lo[2], z);
      p.hi[2] = std::max(p.hi[2], z);
    }
    partials[slice] = p;
  });
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = HUGE_VAL;
    hi[a] = -HUGE_VAL;
  }
  for (const Partial& p : partials)
  {
    if (p.firstBad >= 0)
    {
      detail::failNonFinitePoint(points, p.firstBad);
    }
    for (int a = 0; a < 3; ++a)
    {
      lo[a] = std::min(lo[a], p.lo[a]);
      hi[a] = std::max(hi[a], p.hi[a]);
    }
  }
}

void findBoundsOnHost(const Points& points, int threads, double lo[3], double hi[3])
{
  if (points.type == ScalarType::Float32)
  {
    findBoundsTyped(points, static_cast<const float*>(points.xyz), points.count, threads, lo, hi);
  }
  else
  {
    findBoundsTyped(points, static_cast<const double*>(points.xyz), points.count, threads, lo, hi);
  }
}

} // namespace detail

struct Engine::Impl
{
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::int64_t memoryLimit = 0;
  int cudaDevice = -1;
  std::unique_ptr<detail::BackendImplementation> cpu;
  std::unique_ptr<detail::BackendImplementation> cuda;

  detail::PeriodicScratch periodicScratch;

  /// The backend for a request, and why (Report::backendReason); throws when it is unusable.
  detail::BackendImplementation& backendFor(const Request& request, Backend& chosen, std::string& reason);
  /// The backend's problem for a validated request (bounds not yet found).
  static detail::Problem makeProblem(const Request& request, const detail::ProgressReporter& progress);
  /// A validated open-box request in one run of the backend (at most 2^31 - 2 points and queries).
  /// radiusPass: a search of the radius layer (Radii.h) instead of the request's operation.
  /// imagesByBackend: a periodic request whose images the backend makes (backendMakesImages).
  /// kthQueries: Smoothing Length's queries, the first of the points (-1: all of them).
  Report runOnce(const Request& request, const detail::RadiusPass* radiusPass = nullptr, bool imagesByBackend = false,
    std::int64_t kthQueries = -1);
  /// A validated open-box request of more points than one run takes, in slabs the backend cuts
  /// where it holds every point (BackendImplementation::runResidentSlabs); false where it cannot.
  bool runResidentSlabs(const Request& request, Report& report);
  /// Runs `work` on `backend`; after a CUDA error that ended the process's CUDA context, the
  /// error says so and what happens next.
  template <class Work>
  void guardBackend(Backend backend, Work&& work);
  /// Whether the backend makes a periodic request's images where the points are (Backend.h).
  bool backendMakesImages(const Request& request);
  /// Throws for a non-finite mass, particle volume or query point, naming the caller's point.
  void checkInputs(const Request& request) const;
  /// A validated open-box request: one run, or slabs where it does not fit (Slabs.h).
  Report runOpen(const Request& request);
  /// A validated open-box request with radii or a gradient (Radii.h): the radius layer in one
  /// run, or in each slab where it does not fit (the halo as wide as the largest radius).
  Report runRadiusLayer(const Request& request);
  /// The slab layer's view of the backend that runs `request`; runPiece runs one slab.
  detail::SlabBackend slabBackendFor(const Request& request, std::function<Report(const Request&)> runPiece);
  /// Operation::SmoothingLength, validated here (SmoothingLength.h).
  Report runSmoothingLength(const Request& request);
  /// Whether the radius layer's sums run as one whole-rule search each (RadiusPass::wholeRule):
  /// the CUDA backend's radius tree, for Auto and Radius Tree. Throws for Radius Tree where it
  /// cannot run.
  bool radiusTreeSearches(const Request& request);
};

Engine::Engine() : impl_(new Impl) {}
Engine::~Engine()
{
  delete impl_;
}
Engine::Engine(Engine&& other) noexcept : impl_(other.impl_)
{
  other.impl_ = new Impl;
}
Engine& Engine::operator=(Engine&& other) noexcept
{
  std::swap(impl_, other.impl_);
  return *this;
}

void Engine::setCpuThreads(int threads)
{
  impl_->threads = std::max(1, threads);
  impl_->cpu.reset();
}

void Engine::setMemoryLimit(std::int64_t bytes)
{
  bytes = std::max<std::int64_t>(0, bytes);
  if (bytes == impl_->memoryLimit)
  {
    return; // the backends keep their buffers
  }
  impl_->memoryLimit = bytes;
  impl_->cuda.reset();
  impl_->cpu.reset();
}

void Engine::setCudaDevice(int device)
{
  if (device < -1 || (device >= 0 && device >= cudaDeviceCount()))
  {
    std::ostringstream s;
    s << "CUDA device " << device << " does not exist (this machine has " << cudaDeviceCount() << ")";
    fail(s.str());
  }
  if (device != impl_->cudaDevice)
  {
    impl_->cudaDevice = device;
    impl_->cuda.reset();
  }
}

int Engine::cudaDeviceCount()
{
#if defined(NEIGHBORGRID_HAS_CUDA)
  return cudaAvailable() ? detail::cudaDeviceCount() : 0;
#else
  return 0;
#endif
}

bool Engine::cudaAvailable(std::string* why)
{
#if defined(NEIGHBORGRID_HAS_CUDA)
  return detail::cudaDeviceUsable(why);
#else
  if (why)
  {
    *why = "this NeighborGrid was built without CUDA";
  }
  return false;
#endif
}

void* Engine::allocateTransferMemory(std::size_t bytes)
{
#if defined(NEIGHBORGRID_HAS_CUDA)
  return cudaAvailable() ? detail::allocateTransferMemory(bytes) : nullptr;
#else
  (void)bytes;
  return nullptr;
#endif
}

void Engine::releaseTransferMemory(void* memory)
{
#if defined(NEIGHBORGRID_HAS_CUDA)
  detail::releaseTransferMemory(memory);
#else
  (void)memory;
#endif
}

detail::BackendImplementation& Engine::Impl::backendFor(const Request& request, Backend& backend, std::string& reason)
{
  backend = request.backend;
  if (backend == Backend::Auto)
  {
    std::string why;
    if (cudaAvailable(&why))
    {
      backend = Backend::CUDA;
      reason = "Auto: a CUDA device is usable";
    }
    else
    {
      backend = Backend::CPU;
      reason = "Auto: CPU because " + why;
    }
  }
  else
  {
    reason = "requested";
    if (backend == Backend::CUDA)
    {
      std::string why;
      if (!cudaAvailable(&why))
      {
        fail("the CUDA backend was requested but is not usable: " + why);
      }
    }
  }
  if (backend == Backend::CPU &&
    (request.method == Method::FENNS || request.method == Method::RadixSort || request.method == Method::CLAWS ||
      request.method == Method::Bayraktar || request.method == Method::StagedTiles ||
      request.method == Method::RadiusTree))
  {
    fail(std::string("the method ") + toString(request.method) + " runs on the CUDA backend only (" + reason +
      "); choose Counting Sort or Brute Force for the CPU");
  }
  if (backend == Backend::CPU)
  {
    if (!cpu)
    {
      cpu = detail::makeCpuBackend(threads, memoryLimit);
    }
    return *cpu;
  }
#if defined(NEIGHBORGRID_HAS_CUDA)
  if (!cuda)
  {
    cuda = detail::makeCudaBackend(memoryLimit, cudaDevice);
  }
  return *cuda;
#else
  fail("this NeighborGrid was built without CUDA");
#endif
}

detail::Problem Engine::Impl::makeProblem(const Request& request, const detail::ProgressReporter& progress)
{
  const bool separate = hasSeparateSource(request);
  detail::Problem problem;
  problem.input = separate ? request.source : request.points;
  problem.count = problem.input.count;
  problem.valid = request.valid;
  problem.nullValue = request.nullValue;
  if (separate)
  {
    detail::QuerySet& q = problem.queries;
    q.separate = true;
    q.isGrid = !request.queryGrid.empty();
    q.points = request.points;
    q.grid = request.queryGrid;
    q.count = q.isGrid ? request.queryGrid.count() : request.points.count;
  }
  problem.radius = request.radius;
  problem.operation = request.operation;
  problem.method = request.method; // the backend resolves Auto
  problem.kernelType = request.kernel;
  problem.dimension = request.dimension;
  problem.mass = request.particleVolumes ? request.particleVolumes : request.mass;
  problem.constantMass = static_cast<float>(request.constantMass);
  problem.smoothed = &request.smoothed;
  problem.normalization = request.normalization;
  problem.neighborCount = request.neighborCount;
  problem.density = request.density;
  problem.progress = &progress;
  problem.sphWeightsGiven = request.particleVolumes != nullptr;
  return problem;
}

bool Engine::Impl::backendMakesImages(const Request& request)
{
  if (hasSeparateSource(request) || request.points.count > detail::maxPointsPerRun ||
    detail::expectedImagesPerParticle(request) > detail::imagesPerParticleForQueries)
  {
    return false; // the host's images: probes and grids, or R near the box lengths (Periodic.h)
  }
  Backend backend;
  std::string reason;
  detail::BackendImplementation& implementation = backendFor(request, backend, reason);
  const detail::ProgressReporter progress(request.progress);
  return implementation.makesPeriodicImages(makeProblem(request, progress));
}

bool Engine::Impl::radiusTreeSearches(const Request& request)
{
  if (request.method != Method::Auto && request.method != Method::RadiusTree)
  {
    return false;
  }
  Backend backend;
  std::string reason;
  backendFor(request, backend, reason); // Radius Tree on the CPU: an Error
  if (request.method == Method::RadiusTree && hasSeparateSource(request))
  {
    fail("the method Radius Tree computes at the particles only; choose Auto for probes and volumes");
  }
  return backend == Backend::CUDA;
}

template <class Work>
void Engine::Impl::guardBackend(Backend backend, Work&& work)
{
  try
  {
    work();
  }
  catch (const Aborted&)
  {
    throw;
  }
  catch (const Error& error)
  {
#if defined(NEIGHBORGRID_HAS_CUDA)
    // ParaView keeps running after a failed filter: the next run must work, or say why not.
    if (backend == Backend::CUDA && !detail::cudaContextHealthy())
    {
      // A sticky error (an illegal address, a failed launch) ends the CUDA context for good.
      std::string next = detail::cudaMarkContextLost();
      cuda.reset();
      throw Error(std::string(error.what()) + ". " + next);
    }
#else
    (void)backend;
#endif
    throw;
  }
}

Report Engine::Impl::runOnce(
  const Request& request, const detail::RadiusPass* radiusPass, bool imagesByBackend, std::int64_t kthQueries)
{
  Report report;
  Backend backend;
  detail::BackendImplementation& implementation = backendFor(request, backend, report.backendReason);
  const detail::ProgressReporter progress(request.progress);
  progress(0.0, "prepare");
  detail::Problem problem = makeProblem(request, progress);
  problem.radiusPass = radiusPass;
  problem.neighborTarget = request.neighborTarget;
  problem.supportRadius = request.supportRadius;
  problem.kthQueries = kthQueries >= 0 ? kthQueries : request.points.count;
  if (imagesByBackend)
  {
    problem.imagesByBackend = true;
    problem.box = detail::periodicBoxOfParticles(request);
  }
  report.neighborPairs = -1;
  guardBackend(backend, [&] {
    detail::Timer timer;
    implementation.prepareCoordinates(problem.input, threads, problem);
    detail::addStage(report, "coordinates", timer.milliseconds());
    implementation.run(problem, report);
  });
  report.backend = backend;
  report.periodicImages = problem.images;
  progress(1.0, "done");
  return report;
}

bool Engine::Impl::runResidentSlabs(const Request& request, Report& report)
{
  Backend backend;
  detail::BackendImplementation& implementation = backendFor(request, backend, report.backendReason);
  const detail::ProgressReporter progress(request.progress);
  progress(0.0, "prepare");
  detail::Problem problem = makeProblem(request, progress);
  report.neighborPairs = -1;
  bool ran = false;
  guardBackend(backend, [&] { ran = implementation.runResidentSlabs(problem, threads, report); });
  if (ran)
  {
    report.backend = backend;
    progress(1.0, "done");
  }
  return ran;
}

void Engine::Impl::checkInputs(const Request& request) const
{
  // Checks on the whole request, so that messages name the caller's point.
  const bool separate = hasSeparateSource(request);
  const std::int64_t n = separate ? request.source.count : request.points.count;
  if (request.particleVolumes)
  {
    checkMass(request.particleVolumes, n, threads, "particle volume");
  }
  else if (detail::operationUsesMass(request.operation, request.normalization) && request.mass)
  {
    checkMass(request.mass, n, threads, "mass");
  }
  if (separate && request.queryGrid.empty())
  {
    try
    {
      double lo[3], hi[3];
      detail::findBoundsOnHost(request.points, threads, lo, hi);
    }
    catch (const Error& error)
    {
      std::string message = error.what();
      const std::string prefix = "NeighborGrid: point";
      if (message.compare(0, prefix.size(), prefix) == 0)
      {
        message = "NeighborGrid: query point" + message.substr(prefix.size());
      }
      throw Error(message);
    }
  }
}

detail::SlabBackend Engine::Impl::slabBackendFor(
  const Request& request, std::function<Report(const Request&)> runPiece)
{
  detail::SlabBackend slabBackend;
  slabBackend.threads = threads;
  slabBackend.runOnce = std::move(runPiece);
  slabBackend.bytesNeeded = [this](const Request& whole, const double lo[3], const double hi[3]) {
    Backend backend;
    std::string reason;
    detail::BackendImplementation& implementation = backendFor(whole, backend, reason);
    const detail::ProgressReporter progress(whole.progress);
    detail::Problem problem = makeProblem(whole, progress);
    std::copy(lo, lo + 3, problem.lo);
    std::copy(hi, hi + 3, problem.hi);
    if (whole.radii)
    {
      problem.radius = detail::largestRadiusOf(whole, threads); // an estimate: a search of that radius
    }
    return implementation.bytesNeeded(problem);
  };
  slabBackend.bytesAvailable = [this, &request]() {
    Backend backend;
    std::string reason;
    return backendFor(request, backend, reason).bytesAvailable();
  };
  return slabBackend;
}

Report Engine::Impl::runOpen(const Request& request)
{
  checkInputs(request);
  detail::SlabBackend slabs = slabBackendFor(request, [this](const Request& piece) { return runOnce(piece); });
  slabs.runResident = [this](const Request& whole, Report& report) { return runResidentSlabs(whole, report); };
  return detail::runFitting(request, slabs);
}

Report Engine::Impl::runRadiusLayer(const Request& request)
{
  const bool wholeRule = radiusTreeSearches(request);
  const detail::RadiusSearch search = [this](const Request& one, const detail::RadiusPass& pass) {
    return runOnce(one, &pass);
  };
  return detail::runFitting(request, slabBackendFor(request, [this, &search, wholeRule](const Request& piece) {
    return detail::runWithRadii(piece, threads, search, wholeRule);
  }));
}

Report Engine::Impl::runSmoothingLength(const Request& request)
{
  detail::validateSmoothingLength(request);
  detail::validatePeriodicBox(request);
  if (!validEnum(request.backend, Backend::CPU) || !validEnum(request.points.type, ScalarType::Float64))
  {
    fail("an enumeration in the request has an invalid value");
  }
  if (detail::isPeriodic(request))
  {
    double lo[3], hi[3];
    detail::findBoundsOnHost(request.points, threads, lo, hi); // non-finite points, named, before wrapping
  }
  return detail::runSmoothingLength(request, threads,
    [this](const Request& points, std::int64_t queries, int k, float* out) {
      Request one = points;
      one.neighborTarget = k;
      one.supportRadius = out;
      return runOnce(one, nullptr, false, queries); // DoesNotFit: the layer runs it in slabs
    },
    periodicScratch);
}

namespace
{
std::function<void(const Request&)>& runObserver()
{
  static std::function<void(const Request&)> observer;
  return observer;
}
} // namespace

void Engine::setRunObserver(std::function<void(const Request&)> observer)
{
  runObserver() = std::move(observer);
}

Report Engine::run(const Request& caller)
{
  if (runObserver())
  {
    runObserver()(caller);
  }
  // The caller sees progress that never goes back, whichever layers the request takes: slabs map
  // their runs' fractions into the whole (a seam may differ in the last bit), and resident slabs
  // that decline after their upload hand over to the host's slabs, which start again from 0.
  Request given = caller;
  double shown = 0.0;
  if (caller.progress)
  {
    given.progress = [&caller, &shown](double fraction, const char* stage) {
      shown = std::max(shown, fraction);
      return caller.progress(shown, stage);
    };
  }
  if (given.operation == Operation::SmoothingLength)
  {
    return impl_->runSmoothingLength(given);
  }
  validate(given);
  detail::validatePeriodicBox(given);
  // Output pointers the operation does not write are not touched by any layer.
  Request request = given;
  if (request.operation != Operation::NeighborCount)
  {
    request.neighborCount = nullptr;
  }
  if (!(request.operation == Operation::Density || request.operation == Operation::Gradient ||
        (request.operation == Operation::Smoothing && request.normalization == Normalization::SPH)))
  {
    request.density = nullptr;
  }
  if (request.operation != Operation::Smoothing && request.operation != Operation::Gradient)
  {
    request.smoothed.clear();
  }
  if (detail::usesRadiusLayer(request))
  {
    impl_->checkInputs(request);
    const detail::OpenRun radiusRun = [this](const Request& open) { return impl_->runRadiusLayer(open); };
    if (detail::isPeriodic(request))
    {
      return detail::runPeriodicWithRadii(request, impl_->threads, radiusRun, impl_->periodicScratch);
    }
    return radiusRun(request);
  }
  if (detail::isPeriodic(request))
  {
    // The points go up once and the backend makes their images (the GPU), where it can.
    if (impl_->backendMakesImages(request))
    {
      impl_->checkInputs(request);
      try
      {
        return impl_->runOnce(request, nullptr, true);
      }
      catch (const detail::DoesNotFit&)
      {
        // Particles and images do not fit one run: the host's images, in slabs (Slabs.h).
      }
    }
    return detail::runPeriodic(request, impl_->threads, [this](const Request& open) {
      validate(open);
      return impl_->runOpen(open);
    }, impl_->periodicScratch);
  }
  return impl_->runOpen(request);
}

} // namespace neighborgrid
