// Internal interface between the Engine (validation, coordinate preparation) and the backends.
#pragma once

#include "KernelFunctions.h"
#include "NeighborGrid/NeighborGrid.h"

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

/// Uniform grid over the relative coordinates [0, extent]. Cells are at least R wide (plus a
/// margin that absorbs float rounding of the cell assignment), so every neighbor of a point lies
/// in its own cell or one of the 26 around it. Tiny radii do not blow memory up: the cell size
/// grows until the grid has at most maxCells cells, which keeps the search exact.
struct Grid
{
  float inverseCellSize = 1.0f;
  int dimX = 1, dimY = 1, dimZ = 1;

  NG_HD int axisCell(float v, int dim) const
  {
    const int c = static_cast<int>(v * inverseCellSize);
    return c < 0 ? 0 : (c >= dim ? dim - 1 : c);
  }
  NG_HD int cellX(const Particle& p) const { return axisCell(p.x, dimX); }
  NG_HD int cellY(const Particle& p) const { return axisCell(p.y, dimY); }
  NG_HD int cellZ(const Particle& p) const { return axisCell(p.z, dimZ); }
  NG_HD int cellIndex(int x, int y, int z) const { return (z * dimY + y) * dimX + x; }
  NG_HD int cellOf(const Particle& p) const { return cellIndex(cellX(p), cellY(p), cellZ(p)); }
  NG_HD std::int64_t cellCount() const { return std::int64_t(dimX) * dimY * dimZ; }
  double cellSize() const { return 1.0 / inverseCellSize; }
};

/// Largest number of cells per axis: keeps the float error of v * inverseCellSize (at most
/// dims * 2^-24 cells) far below the cell-size margin below.
constexpr int maxCellsPerAxis = 4096;
/// Cells are R * (1 + 2^-8) wide: a pair two cells apart is then more than R apart even after
/// the rounding of the cell assignment and of the distance test.
constexpr double cellMargin = 1.0 + 1.0 / 256.0;

inline Grid makeGrid(const float extent[3], double radius, std::int64_t maxCells)
{
  double cell = radius * cellMargin;
  for (int axis = 0; axis < 3; ++axis)
  {
    cell = std::max(cell, double(extent[axis]) / (maxCellsPerAxis - 1));
  }
  auto dims = [&](double size, int axis) {
    return static_cast<std::int64_t>(std::floor(double(extent[axis]) / size)) + 1;
  };
  for (;;)
  {
    const std::int64_t total = dims(cell, 0) * dims(cell, 1) * dims(cell, 2);
    if (total <= maxCells)
    {
      break;
    }
    cell *= std::cbrt(double(total) / double(maxCells)) * 1.01;
  }
  Grid grid;
  grid.inverseCellSize = static_cast<float>(1.0 / cell);
  // Dimensions from the float inverse actually used, so no coordinate maps past the last cell.
  grid.dimX = static_cast<int>(std::floor(extent[0] * grid.inverseCellSize)) + 1;
  grid.dimY = static_cast<int>(std::floor(extent[1] * grid.inverseCellSize)) + 1;
  grid.dimZ = static_cast<int>(std::floor(extent[2] * grid.inverseCellSize)) + 1;
  return grid;
}

/// A validated request with coordinates already relative and in float.
struct Problem
{
  std::int64_t count = 0;
  const float* xyz = nullptr; // relative coordinates, 3 per point, host memory of the backend
  float extent[3] = { 0, 0, 0 };
  double radius = 0.0;
  float radiusSquared = 0.0f;
  Operation operation = Operation::Density;
  Method method = Method::Auto; // as requested; the backend resolves Auto and reports the choice
  KernelParams kernel;
  const float* mass = nullptr;
  float constantMass = 1.0f;
  const std::vector<SmoothedArray>* smoothed = nullptr;
  Normalization normalization = Normalization::Shepard;
  std::int32_t* neighborCount = nullptr;
  float* density = nullptr;
  const ProgressReporter* progress = nullptr;
};

class BackendImplementation
{
public:
  virtual ~BackendImplementation() = default;
  /// Finds the bounds, rejects non-finite coordinates (failNonFinitePoint) and makes the float
  /// coordinates relative to the bounds' minimum, wherever the backend computes: sets
  /// problem.extent, and problem.xyz where the coordinates live in host memory.
  virtual void prepareCoordinates(const Points& points, int threads, Problem& problem) = 0;
  virtual void run(const Problem& problem, Report& report) = 0;
};

/// The host version of prepareCoordinates, on `threads` threads; out holds 3 floats per point.
void prepareCoordinatesOnHost(const Points& points, int threads, float* out, float extent[3]);

/// Throws the error for a non-finite coordinate, naming the point and its coordinates.
[[noreturn]] void failNonFinitePoint(const Points& points, std::int64_t index);

std::unique_ptr<BackendImplementation> makeCpuBackend(int threads);
#if defined(NEIGHBORGRID_HAS_CUDA)
std::unique_ptr<BackendImplementation> makeCudaBackend();
bool cudaDeviceUsable(std::string* why);
#endif

/// Number of smoothing components handled per pass (register accumulators on the GPU).
constexpr int maxComponentsPerPass = 4;

} // namespace detail
} // namespace neighborgrid
