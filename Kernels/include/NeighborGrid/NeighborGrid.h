// NeighborGrid engine: fixed-radius neighbor operations on point clouds, on the CPU or a CUDA GPU.
//
// The whole public API is this header. No VTK, no CUDA types: any C++17 program can use it.
//
//   neighborgrid::Engine engine;                  // keep it: device buffers are reused across calls
//   neighborgrid::Request request;
//   request.points = {xyz, count};                // interleaved x,y,z (float or double)
//   request.radius = 1.5;
//   request.operation = neighborgrid::Operation::Density;
//   std::vector<float> density(count);
//   request.density = density.data();
//   neighborgrid::Report report = engine.run(request);   // throws neighborgrid::Error on bad input
//
// Conventions (DESIGN.md): j is a neighbor of i when |x_i - x_j| <= R, decided exactly as
// withinRadius() below decides it from the caller's coordinates, by every backend and method; the
// neighbor count excludes i itself and includes other points at the same position; density and
// smoothing sums include j = i.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(_WIN32)
#if defined(NEIGHBORGRID_KERNELS_BUILDING)
#define NEIGHBORGRID_API __declspec(dllexport)
#else
#define NEIGHBORGRID_API __declspec(dllimport)
#endif
#else
#define NEIGHBORGRID_API __attribute__((visibility("default")))
#endif

namespace neighborgrid
{

enum class Backend
{
  Auto, // CUDA when a usable device is present, otherwise CPU; the Report says which and why
  CUDA,
  CPU
};

enum class Method
{
  Auto,         // the fastest method for the request by a measured rule (Report::method says which)
  CountingSort, // cells of size R, counting sort (Hoetzlein 2013), 27 cells; the CPU's method
  BruteForce,   // every pair; for validation
  FENNS,        // two-step shared-memory search (Groß, Köster, Krüger 2019); CUDA only
  RadixSort,    // cell hashes sorted with a radix sort (Green 2008/2012), 27 cells; CUDA only
  CLAWS,        // FENNS with symmetric pairs, inner/border-first order, merged lookups and
                // balanced warps (Groß, Köster, Krüger 2020); CUDA only
  Bayraktar,    // a candidate list per cell holding its 27 cells' points (Bayraktar et al. 2009);
                // CUDA only
  StagedTiles,  // the FENNS/CLAWS two-step search on cells of R/2: tiles staged in shared memory,
                // rows beyond R skipped per point (Kernels/src/cuda/StagedTiles.cu); CUDA only
  RadiusTree    // per-particle radii and the gradient in one search: Morton-ordered clusters of
                // 32 in a tree of boxes, 32 x 32 cluster tiles (Kernels/src/cuda/RadiusTree.h);
                // CUDA only, particles as their own queries; Auto takes it there
};

enum class Operation
{
  NeighborCount, // int32 per point
  Density,       // rho_i = sum_j m_j W_ij (self included), float per point
  Smoothing,     // kernel smoothing of point arrays, float per component
  Gradient,      // SPH gradient of point arrays: grad f_i = sum_j (m_j / rho_j) (f_j - f_i) grad_i W,
                 // float, 3 per component (d/dx, d/dy, d/dz of each), the density in the same call
  SmoothingLength // per point, the distance to its k-th nearest other point (k = neighborTarget),
                  // float: a support radius per particle for Request::radii. Request::radius,
                  // the kernel and masses are not read.
};

enum class Kernel
{
  CubicSpline,
  QuarticSpline,
  QuinticSpline,
  WendlandC2
};

enum class Normalization
{
  Shepard, // f_i = sum_j W_ij f_j / sum_j W_ij
  SPH      // f_i = sum_j (m_j / rho_j) f_j W_ij (the density is computed in the same call)
};

/// With per-particle radii (Request::radii): which radius decides a pair (i, j) and which
/// smoothing length h = R / cutoff factor its kernel takes.
enum class SmoothingLengthMode
{
  Gather,   // j is a neighbor of i when |x_i - x_j| <= R_i; W(r, h_i)
  Scatter,  // when |x_i - x_j| <= R_j; W(r, h_j)
  Symmetric // when |x_i - x_j| <= max(R_i, R_j); (W(r, h_i) + W(r, h_j)) / 2
};

enum class ScalarType
{
  Float32,
  Float64
};

/// Interleaved x,y,z coordinates, `count` points.
struct Points
{
  const void* xyz = nullptr;
  std::int64_t count = 0;
  ScalarType type = ScalarType::Float32;

  Points() = default;
  Points(const float* p, std::int64_t n) : xyz(p), count(n), type(ScalarType::Float32) {}
  Points(const double* p, std::int64_t n) : xyz(p), count(n), type(ScalarType::Float64) {}
};

/// One array to smooth: `components` floats per point, interleaved as in VTK (tuple after tuple);
/// the result goes to `output` with the same layout.
struct SmoothedArray
{
  const float* values = nullptr;
  int components = 1;
  float* output = nullptr;
  std::string name; // used in error messages only
};

/// Called between stages and between slices of work, always on the thread that called run():
/// fraction in [0, 1] and the stage name. Return false to abort; run() then throws
/// neighborgrid::Aborted (outputs may then hold partial results).
using ProgressCallback = std::function<bool(double fraction, const char* stage)>;

/// A regular grid of query points, never stored: point (i, j, k), i fastest, is
/// origin + (firstIndex + (i, j, k)) * spacing per axis, computed in double as vtkImageData
/// computes its points (firstIndex: the grid's first index, as a vtkImageData extent that does
/// not start at 0, or a piece of a larger grid whose points keep their coordinates exactly).
struct QueryGrid
{
  double origin[3] = { 0, 0, 0 };
  double spacing[3] = { 1, 1, 1 };
  std::int64_t dimensions[3] = { 0, 0, 0 }; // points per axis; all 0: no grid
  std::int64_t firstIndex[3] = { 0, 0, 0 };
  std::int64_t count() const { return dimensions[0] * dimensions[1] * dimensions[2]; }
  bool empty() const { return dimensions[0] == 0 && dimensions[1] == 0 && dimensions[2] == 0; }
};

struct Request
{
  // The points results are computed at (the queries), one result per point. Without `source`
  // they are also the points their neighbors are taken from.
  Points points;
  // Optional: the points neighbors are taken from (the particles), when they differ from the
  // queries: then a query's neighbors are the source points within R of it (a source point at
  // the query's position counts), masses and arrays to smooth are per source point, and outputs
  // are per query. Symmetric evaluation (CLAWS) applies only without a source.
  Points source;
  // Optional, with `source` and instead of `points`: queries on a regular grid.
  QueryGrid queryGrid;

  double radius = 0.0; // support radius R, in [1e-150, 1e150]; not read when `radii` is set
  // Optional: a support radius per particle (per source point), each finite and in
  // [1e-150, 1e150]; replaces `radius`. Pairs and kernels follow smoothingLengthMode. With
  // separate queries only Scatter applies (a query has no radius of its own). Radii that differ
  // by any factor keep the search linear: particles are binned into levels of radii within a
  // factor of 2, and each level is searched on a grid of its own largest radius.
  const float* radii = nullptr;
  SmoothingLengthMode smoothingLengthMode = SmoothingLengthMode::Gather;
  Operation operation = Operation::Density;

  Kernel kernel = Kernel::CubicSpline;
  int dimension = 3;             // 2 or 3: selects the kernel's normalization sigma_d
  const float* mass = nullptr;   // per-point mass (per source point), or null for constantMass
  double constantMass = 1.0;

  // Smoothing and Gradient: any number of arrays (per source point). For Gradient each output
  // holds 3 x components floats per point: d/dx, d/dy, d/dz of component 0, then of component 1...
  std::vector<SmoothedArray> smoothed;
  Normalization normalization = Normalization::Shepard;
  // SPH smoothing only, optional: the particle volumes V_j = m_j / rho_j, one per source point,
  // for a caller that has rho_j already (a distributed run, where the density of a halo point
  // comes from the rank that owns it). Then no density pass runs, `mass` is not read, and
  // `density` must be null.
  const float* particleVolumes = nullptr;

  // Smoothing Length: k, the neighbor whose distance is the point's support radius, in
  // [1, maxNeighborTarget]. Other points at the same position count, as in the neighbor count.
  int neighborTarget = 64;
  // Smoothing Length, optional: results for the first smoothingLengthQueries points only
  // (supportRadius then holds that many values); the points after them are neighbors only, as a
  // halo is. -1 (default): every point. A distributed run puts a rank's own points first.
  std::int64_t smoothingLengthQueries = -1;

  Backend backend = Backend::Auto;
  Method method = Method::Auto; // Smoothing Length: Auto (its own grid search per backend)

  // Outputs, caller-owned, one entry per query (count x components for smoothing).
  std::int32_t* neighborCount = nullptr; // required for NeighborCount
  float* density = nullptr; // required for Density; optional for Gradient and SPH smoothing
  // With a source only, optional: 1 where at least one source point lies within R, else 0. There
  // the count and density are 0 and every smoothed component is nullValue (so it is too where
  // the Shepard weights sum to 0: every neighbor exactly at the kernel's cutoff).
  std::uint8_t* valid = nullptr;
  float nullValue = 0.0f;
  // Required for Smoothing Length: per point the distance to its k-th nearest other point, the
  // square root of the exact double squared distance s (withinRadius()'s formula) rounded up to
  // float (the smallest float R with R * R >= s, so withinRadius takes the k-th neighbor and these
  // radii, as Request::radii with Gather, give every point at least k neighbors); with a periodic
  // box, over every image (a point's own images included).
  float* supportRadius = nullptr;

  // Periodic box, per axis: along an axis with periodic[a], the box is [boxOrigin[a],
  // boxOrigin[a] + boxLengths[a]) and every point has images at multiples of boxLengths[a].
  // Positions are first wrapped into the box in double, w = x - L floor((x - o) / L) (points
  // already inside keep their coordinates exactly); a pair (i, j) counts once for every image
  // w_j + k L (k integer per periodic axis, computed in double) within R of w_i, so with R above
  // half a box length one point can be a neighbor several times, as LAMMPS counts. A point's own
  // images (k != 0) are neighbors of it; it is not its own (k = 0). Queries (points with a
  // source, or a grid) see the source's images the same way. Outputs stay in input order and
  // the inputs are not modified. Cost: the images within R of the box (or of a grid's bounds)
  // are added to the source, about prod_a (L_a + 2R) / L_a times the points.
  bool periodic[3] = { false, false, false };
  double boxOrigin[3] = { 0, 0, 0 };
  double boxLengths[3] = { 0, 0, 0 };

  ProgressCallback progress; // optional
};

struct StageTime
{
  std::string stage;
  double milliseconds = 0.0;
};

struct Report
{
  Backend backend = Backend::CPU; // what actually ran (never Auto)
  Method method = Method::CountingSort;
  std::string device;             // "NVIDIA H100 80GB HBM3 (sm_90)" or "CPU, 16 threads"
  std::string backendReason;      // why Auto chose this backend, or "requested"
  std::vector<StageTime> stages;  // wall or device time per stage
  std::int64_t neighborPairs = -1; // Neighbor Count only: sum of the counts; -1 otherwise
  std::int64_t extraDeviceBytes = 0; // device memory the method holds beyond inputs and outputs
  // Pair tests decided in double from the input coordinates because the float distance was
  // within rounding of R (summed over the passes of the search).
  std::int64_t pairsDecidedInDouble = 0;
  std::int64_t periodicImages = 0; // source points added as periodic images (Request::periodic)
  // Runs of the backend the request took: 1, or more when it was cut into slabs to fit
  // (Engine::setMemoryLimit); then the points run in more than one slab (halos), summed.
  std::int64_t slabs = 1;
  std::int64_t slabHaloPoints = 0;
  // Per-particle radii (Request::radii): the levels their radii fell into, and the searches run
  // (a level's particles as queries or as sources, per pass of the operation). 0 without radii.
  // Smoothing Length: the levels of cell sizes its search took (KthNeighbor.h).
  int radiusLevels = 0;
  int radiusSearches = 0;
};

/// Every failure: bad input, an unavailable backend, a failed CUDA call. what() says what and why.
class NEIGHBORGRID_API Error : public std::runtime_error
{
public:
  using std::runtime_error::runtime_error;
};

/// Thrown when the progress callback asked to stop.
class NEIGHBORGRID_API Aborted : public Error
{
public:
  using Error::Error;
};

class NEIGHBORGRID_API Engine
{
public:
  Engine();
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  /// Validates the request (throws Error before touching any output), then computes.
  Report run(const Request& request);

  /// Number of CPU threads the CPU backend uses (default: hardware concurrency).
  void setCpuThreads(int threads);

  /// At most this many bytes of working memory per run of the backend: GPU memory for CUDA
  /// (0, the default: whatever the device has free), the search's own buffers for the CPU (0: no
  /// limit). A request that needs more, or has more than 2^31 - 2 points or queries, is cut into
  /// slabs of space, each run with the points within R of it, so that its results are those of
  /// one run (counts exactly; float sums up to their order). Report::slabs says how many ran.
  void setMemoryLimit(std::int64_t bytes);

  /// The CUDA device this engine runs on: an ordinal below cudaDeviceCount(), or -1 (the
  /// default) for the calling thread's current device. For one process per GPU, e.g. MPI ranks
  /// on a node taking devices by node-local rank. Throws Error for a device that does not exist.
  void setCudaDevice(int device);

  /// Usable CUDA devices (0 without CUDA).
  static int cudaDeviceCount();

  /// Whether this build has the CUDA backend and a device is usable; `why` says why not.
  static bool cudaAvailable(std::string* why = nullptr);

  /// Page-locked host memory for a result array (Request's outputs) that a run on the CUDA
  /// backend fills with one DMA: no staging copy and no page faults (the VTK filter's Update() on
  /// 4M points, density, H200: 6.5-6.7 ms into ordinary arrays, 5.4-5.6 into these, same
  /// process). `bytes` or more from a process-wide pool, on
  /// the calling thread's current device's context; null where CUDA is not usable or the pool is
  /// at its limits (blocks of at most 1 GiB, 4 GiB in use): then allocate as usual. Release it
  /// with releaseTransferMemory, from any thread; the pool keeps up to 512 MiB of released blocks
  /// for the next arrays, since pinning memory is slow.
  static void* allocateTransferMemory(std::size_t bytes);
  /// Returns memory of allocateTransferMemory to the pool; null or any other pointer is ignored.
  static void releaseTransferMemory(void* memory);

  /// For tests of the layers above (the VTK filters): `observer` sees every request that reaches
  /// run() of any engine of this process, as the caller passed it, before anything else, so a
  /// test can check that a caller's own arrays arrive with no copy or pass in between. An empty
  /// function removes it. Set it while no run is in flight.
  static void setRunObserver(std::function<void(const Request&)> observer);

private:
  struct Impl;
  Impl* impl_;
};

// Names as they appear in the ParaView plugin and in reports.
NEIGHBORGRID_API const char* toString(Backend);
NEIGHBORGRID_API const char* toString(Method);
NEIGHBORGRID_API const char* toString(Operation);
NEIGHBORGRID_API const char* toString(Kernel);
NEIGHBORGRID_API const char* toString(Normalization);
NEIGHBORGRID_API const char* toString(SmoothingLengthMode);

/// The largest Request::neighborTarget: each GPU thread keeps its k best distances in shared
/// memory.
constexpr int maxNeighborTarget = 1024;

/// The neighbor test every backend and method applies: (dx*dx + dy*dy) + dz*dz <= radius*radius
/// in double, d = a - b, each operation rounded on its own. For references and tests.
NEIGHBORGRID_API bool withinRadius(const double a[3], const double b[3], double radius);

/// The kernel's cutoff factor (R / h) and value W(r, h) in double, for references and tests.
NEIGHBORGRID_API double kernelCutoffFactor(Kernel kernel);
NEIGHBORGRID_API double kernelValue(Kernel kernel, int dimension, double radius, double distance);
/// dW/dr at `distance` for support radius `radius`, in double (grad_i W = dW/dr (x_i - x_j) / r).
NEIGHBORGRID_API double kernelDerivative(Kernel kernel, int dimension, double radius, double distance);

} // namespace neighborgrid
