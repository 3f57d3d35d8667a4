// Internal interface between the Engine (validation, backend choice) and the backends.
#pragma once

#include "CellGrid.h"
#include "KernelFunctions.h"
#include "NeighborGrid/NeighborGrid.h"
#include "PairTest.h"
#include "RadiusOperations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// Calls the user's progress callback from the calling thread only; throws Aborted on request.
class ProgressReporter
{
public:
  explicit ProgressReporter(const ProgressCallback& callback) : callback_(callback) {}
  void operator()(double fraction, const char* stage) const
  {
    if (callback_ && !callback_(std::min(1.0, std::max(0.0, fraction)), stage))
    {
      throw Aborted(std::string("NeighborGrid: aborted by the caller during ") + stage);
    }
  }

private:
  const ProgressCallback& callback_;
};

/// The cell size of a grid whose cells are searched `reach` cells each way around a point's own:
/// no smaller than R / reach, with a relative margin of 2^-32 so that a pair the double test
/// accepts (its distance may round below R by a few units in the last place) is never two cells
/// apart. Exact cell assignment (CellGrid.h) needs no other margin.
inline double cellSizeFor(double radius, int reach)
{
  return radius / reach * (1.0 + std::ldexp(1.0, -32));
}

/// Whether an operation reads masses: Density, Gradient, and smoothing with SPH normalization
/// (m_j / rho_j).
inline bool operationUsesMass(Operation operation, Normalization normalization)
{
  return operation == Operation::Density || operation == Operation::Gradient ||
    (operation == Operation::Smoothing && normalization == Normalization::SPH);
}

/// Where results are wanted when they are not the particles themselves (Request::source set):
/// explicit points, or a grid generated where it is used.
struct QuerySet
{
  bool separate = false;   // false: the queries are the particles (input)
  bool isGrid = false;
  Points points;           // explicit queries (caller's coordinates, already checked finite)
  QueryGrid grid;
  std::int64_t count = 0;

  /// Query q's coordinates in double, exactly as the caller's point or vtkImageData's point.
  void get(std::int64_t q, double x[3]) const
  {
    if (isGrid)
    {
      const std::int64_t ijk[3] = { q % grid.dimensions[0], (q / grid.dimensions[0]) % grid.dimensions[1],
        q / (grid.dimensions[0] * grid.dimensions[1]) };
      for (int a = 0; a < 3; ++a)
      {
        x[a] = gridCoordinate(grid.origin[a], grid.firstIndex[a] + ijk[a], grid.spacing[a]);
      }
    }
    else if (points.type == ScalarType::Float32)
    {
      const float* p = static_cast<const float*>(points.xyz) + 3 * q;
      x[0] = p[0], x[1] = p[1], x[2] = p[2];
    }
    else
    {
      const double* p = static_cast<const double*>(points.xyz) + 3 * q;
      x[0] = p[0], x[1] = p[1], x[2] = p[2];
    }
  }
};

/// A periodic box whose images the backend makes where the points are (Periodic.h): the
/// particles wrapped into the box along `axes`, then every image w + k L within `radius` of
/// [lo, hi] on those axes, in the order of the host's images (particle by particle, k_z, k_y, k_x).
struct PeriodicImages
{
  bool axes[3] = { false, false, false };
  double origin[3] = { 0, 0, 0 };
  double lengths[3] = { 0, 0, 0 };
  double lo[3] = { 0, 0, 0 }; // where results are wanted: the box
  double hi[3] = { 0, 0, 0 };
  double radius = 0.0;
};

/// A validated request, with its bounds found.
struct Problem
{
  std::int64_t count = 0;      // particles (the sources)
  Points input;                // the caller's coordinates of the particles
  double lo[3] = { 0, 0, 0 };  // bounds of the coordinates (double)
  double hi[3] = { 0, 0, 0 };
  // The extent of the points' bulk where a few far points stretch the bounds (findBulkExtent);
  // sizes that follow the data's density (Auto, FENNS's and CLAWS's coarse cells) read it.
  double bulkLo[3] = { 0, 0, 0 };
  double bulkHi[3] = { 0, 0, 0 };
  bool boundsStretched = false; // false: the bounds are the bulk
  double radius = 0.0;
  Operation operation = Operation::Density;
  Method method = Method::Auto; // as requested; the backend resolves Auto and reports the choice
  Kernel kernelType = Kernel::CubicSpline;
  int dimension = 3;
  const float* mass = nullptr;
  float constantMass = 1.0f;
  const std::vector<SmoothedArray>* smoothed = nullptr;
  Normalization normalization = Normalization::Shepard;
  std::int32_t* neighborCount = nullptr;
  float* density = nullptr;
  std::uint8_t* valid = nullptr;
  float nullValue = 0.0f;
  QuerySet queries;
  const ProgressReporter* progress = nullptr;
  // SPH smoothing: `mass` holds m_j / rho_j already (periodic boxes, Periodic.h), so no density pass.
  bool sphWeightsGiven = false;
  // A search of the radius layer (Radii.h) instead of `operation`; null otherwise.
  const RadiusPass* radiusPass = nullptr;
  // Images made by the backend (BackendImplementation::makesPeriodicImages): prepareCoordinates
  // appends them to the particles, so `count` includes them and `images` says how many; only the
  // caller's particles' results are returned (Staged Tiles skips the images' sums, or over the half
  // shell adds each pair of a particle and an image to both: StagedTiles.cu, isImage).
  bool imagesByBackend = false;
  PeriodicImages box;
  std::int64_t images = 0;
  // Smoothing Length (KthNeighbor.h): k, the output, and how many of the particles, the first,
  // are queries (the rest are periodic images or halo points that only count as neighbors).
  int neighborTarget = 64;
  float* supportRadius = nullptr;
  std::int64_t kthQueries = 0;

  /// Entries per output array on the backend: one per query, or per particle and image.
  std::int64_t resultCount() const { return queries.separate ? queries.count : count; }
  /// Entries per output array of the caller.
  std::int64_t returnedCount() const { return resultCount() - (queries.separate ? 0 : images); }

  bool usesMass() const { return operationUsesMass(operation, normalization); }
  /// The kernel for squared distances in frame units of a grid of cell size `cellSize`.
  KernelParams frameKernel(double cellSize) const
  {
    KernelParams k = makeKernelParams(kernelType, dimension, radius);
    k.inverseH = static_cast<float>(cellSize * cutoffFactor(kernelType) / radius);
    return k;
  }
};

class BackendImplementation
{
public:
  virtual ~BackendImplementation() = default;
  /// Finds the bounds (problem.lo, problem.hi) and rejects non-finite coordinates
  /// (failNonFinitePoint), wherever the backend computes; keeps what it needs of the coordinates.
  virtual void prepareCoordinates(const Points& points, int threads, Problem& problem) = 0;
  /// Throws DoesNotFit (Slabs.h) before writing any output when the run needs more memory than
  /// bytesAvailable().
  virtual void run(const Problem& problem, Report& report) = 0;
  /// The memory a run of `problem` (its bounds found) would need, coordinates included.
  virtual std::int64_t bytesNeeded(const Problem& problem) = 0;
  /// The memory one run can have: the engine's limit, or what the device has free.
  virtual std::int64_t bytesAvailable() = 0;
  /// Whether prepareCoordinates makes the periodic images of `problem` itself (problem.box),
  /// where the points already are, instead of the host making them (Periodic.h).
  virtual bool makesPeriodicImages(const Problem&) const { return false; }
  /// A request of more points than one run indexes (Slabs.h), its bounds not yet found, in slabs
  /// cut and gathered where the backend holds every point at once (the GPU: ResidentSlabs.h).
  /// False, before any output is written, where it cannot (an operation it does not take, too
  /// little memory, a cloud it cannot cut along one axis): the slab layer then cuts on the host.
  virtual bool runResidentSlabs(Problem&, int /*threads*/, Report&) { return false; }
};

/// Coordinate `axis` of point i in double, whichever precision the points are given in.
inline double coordinateOf(const Points& p, std::int64_t i, int axis)
{
  return p.type == ScalarType::Float64 ? static_cast<const double*>(p.xyz)[3 * i + axis]
                                       : double(static_cast<const float*>(p.xyz)[3 * i + axis]);
}

/// Bounds in double and the non-finite check on the host, on `threads` threads.
void findBoundsOnHost(const Points& points, int threads, double lo[3], double hi[3]);

/// The volume of the box lo-hi, each side at least `leastSide`: the denominator of a density estimate.
inline double boxVolume(const double lo[3], const double hi[3], double leastSide)
{
  double volume = 1.0;
  for (int a = 0; a < 3; ++a)
  {
    volume *= hi[a] - lo[a] > leastSide ? hi[a] - lo[a] : leastSide;
  }
  return volume;
}

/// The volume of `p`'s bounds, each side at least `leastSide`.
inline double boundsVolume(const Problem& p, double leastSide)
{
  return boxVolume(p.lo, p.hi, leastSide);
}

/// The volume over which `p`'s points are spread (their bulk: findBulkExtent, CoordinateBounds.h),
/// each side at least `leastSide`.
inline double bulkVolume(const Problem& p, double leastSide)
{
  return p.boundsStretched ? boxVolume(p.bulkLo, p.bulkHi, leastSide) : boundsVolume(p, leastSide);
}

/// Throws the error for a non-finite coordinate, naming the point and its coordinates.
[[noreturn]] void failNonFinitePoint(const Points& points, std::int64_t index);

/// memoryLimit: bytes of the search's working memory per run, 0 for no limit.
std::unique_ptr<BackendImplementation> makeCpuBackend(int threads, std::int64_t memoryLimit);
#if defined(NEIGHBORGRID_HAS_CUDA)
/// device: a CUDA device ordinal, or -1 for the calling thread's current device.
std::unique_ptr<BackendImplementation> makeCudaBackend(std::int64_t deviceMemoryLimit, int device);
int cudaDeviceCount();
bool cudaDeviceUsable(std::string* why);
/// After a CUDA error: whether the CUDA context still works (false after a sticky error).
bool cudaContextHealthy();
/// After a sticky error: marks CUDA unusable for the rest of the process (cudaDeviceUsable says
/// why from then on) and returns a sentence for the error message that says what happens next.
std::string cudaMarkContextLost();
#endif

/// Number of smoothing components handled per pass (register accumulators on the GPU).
constexpr int maxComponentsPerPass = 4;

/// Passes of the search an operation needs (for progress).
inline int searchPassCount(const Problem& p)
{
  if (p.operation != Operation::Smoothing)
  {
    return 1;
  }
  int passes = p.normalization == Normalization::SPH ? 1 : 0;
  if (p.queries.separate && p.normalization == Normalization::SPH && p.density)
  {
    ++passes; // the density at the queries as well as at the sources
  }
  for (const auto& array : *p.smoothed)
  {
    passes += (array.components + maxComponentsPerPass - 1) / maxComponentsPerPass;
  }
  return passes;
}

} // namespace detail
} // namespace neighborgrid
