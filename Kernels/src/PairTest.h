// The neighbor test, exact with respect to the caller's coordinates.
//
// Definition (DESIGN.md; public as neighborgrid::withinRadius): j is a neighbor of i when
//   (dx * dx + dy * dy) + dz * dz <= R * R,   d = x_i - x_j,
// evaluated in double from the input coordinates (float input converted to double first), every
// operation rounded on its own (no fused multiply-add), in that order. Every backend and method
// decides every pair this way, for the count and for which pairs enter density and smoothing sums
// (Staged Tiles excepted for density and smoothing, whose terms vanish at R: a pair within the
// band adds its float terms, under 3e-16 of a point's own; StagedTiles.cu, termsVanishAtRadius).
//
// Methods test pairs in float, in frame coordinates (CellGrid.h: relative to a cell, in units of
// its size s), and decide there wherever the float squared distance r2f is clearly inside or
// outside. Its error is bounded (u = 2^-24, rho = R / s, S = the largest frame coordinate after a
// shift by the offset of a neighboring cell):
//   - a frame coordinate is the exact one rounded to float: error <= 1.01 u (|a| < 1);
//   - shifting by an integer offset rounds once: <= u S;
//   - the difference of two coordinates rounds once: <= u rho near the cutoff;
//   so per axis E <= u (2 + S + rho), and with three squares and two sums
//   |r2f - r2| <= 2 sqrt(3) rho E + 3 E^2 + 5 u rho^2.
// Pairs whose r2f lies within four times that bound of rho^2 (plus 16 u) are decided in double
// from the input coordinates: about one neighbor pair in 10^4 for cells of size R. A NaN r2f (a
// huge cell, CellGrid.h) is always decided in double.
#pragma once

#include "KernelFunctions.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace neighborgrid
{
namespace detail
{

/// (dx * dx + dy * dy) + dz * dz in double, each operation rounded on its own.
NG_HD double exactSquaredDistance(double ax, double ay, double az, double bx, double by, double bz)
{
#if defined(__CUDA_ARCH__)
  const double dx = __dsub_rn(ax, bx), dy = __dsub_rn(ay, by), dz = __dsub_rn(az, bz);
  return __dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)), __dmul_rn(dz, dz));
#else
  // Kernels/ is compiled with -ffp-contract=off: these stay separate multiplies and adds.
  const double dx = ax - bx, dy = ay - by, dz = az - bz;
  return (dx * dx + dy * dy) + dz * dz;
#endif
}

/// Coordinate of grid index i: origin + i * spacing, rounded twice (as vtkImageData computes it),
/// never fused.
NG_HD double gridCoordinate(double origin, std::int64_t i, double spacing)
{
#if defined(__CUDA_ARCH__)
  return __dadd_rn(origin, __dmul_rn(double(i), spacing));
#else
  return origin + double(i) * spacing;
#endif
}

/// The caller's coordinates, float or double, interleaved x, y, z, in input order.
struct InputPoints
{
  const void* xyz = nullptr;
  bool isDouble = false;

  NG_HD void get(std::int64_t i, double& x, double& y, double& z) const
  {
    if (isDouble)
    {
      const double* p = static_cast<const double*>(xyz) + 3 * i;
      x = p[0];
      y = p[1];
      z = p[2];
    }
    else
    {
      const float* p = static_cast<const float*>(xyz) + 3 * i;
      x = p[0];
      y = p[1];
      z = p[2];
    }
  }
};

/// The float test with its band, and the double decision inside the band.
struct PairTest
{
  float accept = 0.0f; // r2f below: a neighbor
  float reject = 0.0f; // r2f above: not a neighbor; in between (or NaN): decided in double
  InputPoints points;  // where the double decision reads the input coordinates
  double radiusSquared = 0.0;
  float band = 0.0f; // the half width of the band around rho^2 (RadiusOperations.h)

  double frameScale = 1.0; // 1 / s^2: squared distances from input units to frame units

  /// The double decision for input indices i and j; when they are neighbors, r2f becomes their
  /// squared distance in frame units (the float one may be NaN: a huge cell).
  NG_HD bool exact(std::int64_t i, std::int64_t j, float& r2f) const
  {
    double ax, ay, az, bx, by, bz;
    points.get(i, ax, ay, az);
    points.get(j, bx, by, bz);
    const double r2 = exactSquaredDistance(ax, ay, az, bx, by, bz);
    r2f = static_cast<float>(r2 * frameScale);
    return r2 <= radiusSquared;
  }
  /// The double decision between a query at q (input units) and source input index j.
  NG_HD bool exactQuery(const double q[3], std::int64_t j, float& r2f) const
  {
    double bx, by, bz;
    points.get(j, bx, by, bz);
    const double r2 = exactSquaredDistance(q[0], q[1], q[2], bx, by, bz);
    r2f = static_cast<float>(r2 * frameScale);
    return r2 <= radiusSquared;
  }
  /// 1: a neighbor by the float test, 0: not, -1: decide with exact().
  NG_HD int classify(float r2f) const
  {
    if (r2f > reject)
    {
      return 0;
    }
    return r2f < accept ? 1 : -1; // NaN lands here too
  }
};

/// The band for frames of cell size s: rho = R / s, frameSpan = the largest frame coordinate after
/// a shift (2 for a search of the 27 cells around a point's own).
inline PairTest makePairTest(double radius, double cellSize, double frameSpan, InputPoints points)
{
  constexpr double u = 1.0 / 16777216.0;
  const double rho = radius / cellSize;
  const double perAxis = u * (2.0 + frameSpan + rho);
  const double bound = 2.0 * std::sqrt(3.0) * rho * perAxis + 3.0 * perAxis * perAxis + 5.0 * u * rho * rho;
  const double band = 4.0 * bound + 16.0 * u * rho * rho;
  PairTest test;
  test.accept = std::nextafter(static_cast<float>(rho * rho - band), 0.0f);
  test.reject = std::nextafter(static_cast<float>(rho * rho + band), HUGE_VALF);
  if (std::getenv("NEIGHBORGRID_BENCHMARK_FLOAT_ONLY"))
  {
    // Benchmarking knob: the float test alone (not exact), to measure what exactness costs.
    test.accept = std::nextafter(static_cast<float>(rho * rho), HUGE_VALF);
    test.reject = test.accept;
  }
  test.band = std::nextafter(static_cast<float>(band), HUGE_VALF);
  test.points = points;
  test.radiusSquared = radius * radius;
  test.frameScale = 1.0 / (cellSize * cellSize);
  return test;
}

} // namespace detail
} // namespace neighborgrid
