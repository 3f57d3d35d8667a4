// Formulas shared by every backend and method: written once, compiled for host and device.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define NG_HD __host__ __device__ __forceinline__
#else
#define NG_HD inline
#endif

namespace neighborgrid
{
namespace detail
{

/// A point in the sorted working set: relative float coordinates, and a per-point pair weight
/// (the mass for density, m_j / rho_j for SPH-normalized smoothing, 1 otherwise). 16 bytes, so
/// the GPU reads it with one vector load.
struct alignas(16) Particle
{
  float x, y, z, w;
};

/// Squared distance between two points, rounded identically on host and device (no FMA
/// contraction), so every backend and method agrees on the neighbor test bit for bit.
NG_HD float squaredDistance(const Particle& a, const Particle& b)
{
#if defined(__CUDA_ARCH__)
  const float dx = __fsub_rn(a.x, b.x);
  const float dy = __fsub_rn(a.y, b.y);
  const float dz = __fsub_rn(a.z, b.z);
  return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
#else
  const float dx = a.x - b.x;
  const float dy = a.y - b.y;
  const float dz = a.z - b.z;
  // Kernels/ is compiled with -ffp-contract=off so these stay separate multiplies and adds.
  return (dx * dx + dy * dy) + dz * dz;
#endif
}

/// W(r, h) = sigma_d h^-d w(q), q = r / h, with VTK's kernels (DESIGN.md). The kernel type is a
/// run-time value: the branch is uniform across a warp and keeps the number of instantiations small.
struct KernelParams
{
  Kernel type = Kernel::CubicSpline;
  float inverseH = 1.0f;      // cutoff factor / R
  float normalization = 1.0f; // sigma_d * h^-d
};

template <typename T>
NG_HD T positivePart(T a)
{
  return a > T(0) ? a : T(0);
}

/// The dimensionless shape w(q); zero at and beyond the cutoff factor.
template <typename T>
NG_HD T kernelShape(Kernel type, T q)
{
  switch (type)
  {
    case Kernel::CubicSpline:
    {
      const T a = positivePart(T(2) - q), b = positivePart(T(1) - q);
      return T(0.25) * a * a * a - b * b * b;
    }
    case Kernel::QuarticSpline:
    {
      const T a = positivePart(T(2.5) - q), b = positivePart(T(1.5) - q),
              c = positivePart(T(0.5) - q);
      const T a2 = a * a, b2 = b * b, c2 = c * c;
      return a2 * a2 - T(5) * b2 * b2 + T(10) * c2 * c2;
    }
    case Kernel::QuinticSpline:
    {
      const T a = positivePart(T(3) - q), b = positivePart(T(2) - q), c = positivePart(T(1) - q);
      const T a2 = a * a, b2 = b * b, c2 = c * c;
      return a2 * a2 * a - T(6) * b2 * b2 * b + T(15) * c2 * c2 * c;
    }
    case Kernel::WendlandC2:
    default:
    {
      if (q >= T(2))
      {
        return T(0);
      }
      const T a = T(1) - T(0.5) * q;
      const T a2 = a * a;
      return a2 * a2 * (T(1) + T(2) * q);
    }
  }
}

/// dw/dq of kernelShape; zero at and beyond the cutoff factor (and at q = 0 for every kernel).
template <typename T>
NG_HD T kernelShapeDerivative(Kernel type, T q)
{
  switch (type)
  {
    case Kernel::CubicSpline:
    {
      const T a = positivePart(T(2) - q), b = positivePart(T(1) - q);
      return T(-0.75) * a * a + T(3) * b * b;
    }
    case Kernel::QuarticSpline:
    {
      const T a = positivePart(T(2.5) - q), b = positivePart(T(1.5) - q),
              c = positivePart(T(0.5) - q);
      return T(-4) * a * a * a + T(20) * b * b * b - T(40) * c * c * c;
    }
    case Kernel::QuinticSpline:
    {
      const T a = positivePart(T(3) - q), b = positivePart(T(2) - q), c = positivePart(T(1) - q);
      const T a2 = a * a, b2 = b * b, c2 = c * c;
      return T(-5) * a2 * a2 + T(30) * b2 * b2 - T(75) * c2 * c2;
    }
    case Kernel::WendlandC2:
    default:
    {
      if (q >= T(2))
      {
        return T(0);
      }
      const T a = T(1) - T(0.5) * q;
      return T(-5) * q * a * a * a;
    }
  }
}

/// The square root on the GPU in one instruction (MUFU.SQRT) instead of the correctly rounded
/// one's branchy sequence: within 2^-22 relative of it, and 0 at 0. The correctly rounded one on
/// the host.
NG_HD float approximateSqrt(float v)
{
#if defined(__CUDA_ARCH__)
  float r;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
#else
  return std::sqrt(v);
#endif
}

/// The shape w(q) at squared distance r2 (q = r / h): W without sigma_d / h^d, which a sum of
/// shapes takes once at its end. The searches evaluate this for every neighbor pair; the square
/// root is one instruction (approximateSqrt).
NG_HD float kernelShapeFromSquared(const KernelParams& k, float squaredDistance)
{
  const float q = approximateSqrt(squaredDistance) * k.inverseH;
#if defined(__CUDA_ARCH__)
  if (k.type == Kernel::CubicSpline)
  {
    // kernelShape's cubic spline with the clamps folded into saturating instructions: with
    // s = (2 - q) / 2 and b = 1 - q, each clamped to [0, 1] (NaN to 0), w = 2 s^3 - b^3, which is
    // 0.25 a^3 - b^3 for a = 2 s. Seven instructions instead of nine or ten for every candidate
    // of the density and smoothing loops. q's product folded into s's multiply-add (b = 2 s - 1)
    // takes one more away. On the H200 it took Staged Tiles' 4M density search 1.249 -> 1.242 ms,
    // but FENNS's sparse 4M searches 4-6% and Shepard-3's 3% longer, so q stays (RESULTS.md,
    // issue 22).
    const float s = __saturatef(__fmaf_rn(q, -0.5f, 1.0f));
    const float b = __saturatef(__fadd_rn(1.0f, -q));
    return __fmaf_rn(2.0f, (s * s) * s, -((b * b) * b));
  }
#endif
  return kernelShape<float>(k.type, q);
}

constexpr double pi = 3.14159265358979323846;

NG_HD double cutoffFactor(Kernel type)
{
  switch (type)
  {
    case Kernel::QuarticSpline:
      return 2.5;
    case Kernel::QuinticSpline:
      return 3.0;
    case Kernel::CubicSpline:
    case Kernel::WendlandC2:
    default:
      return 2.0;
  }
}

/// sigma_d of DESIGN.md's table (VTK's vtkSPH*Kernel values).
inline double kernelSigma(Kernel type, int dimension)
{
  const bool planar = dimension == 2;
  switch (type)
  {
    case Kernel::CubicSpline:
      return planar ? 10.0 / (7.0 * pi) : 1.0 / pi;
    case Kernel::QuarticSpline:
      return planar ? 96.0 / (1199.0 * pi) : 1.0 / (20.0 * pi);
    case Kernel::QuinticSpline:
      return planar ? 7.0 / (478.0 * pi) : 1.0 / (120.0 * pi);
    case Kernel::WendlandC2:
    default:
      return planar ? 7.0 / (4.0 * pi) : 21.0 / (16.0 * pi);
  }
}

inline KernelParams makeKernelParams(Kernel type, int dimension, double radius)
{
  const double h = radius / cutoffFactor(type);
  double hToD = h * h;
  if (dimension == 3)
  {
    hToD *= h;
  }
  KernelParams k;
  k.type = type;
  k.inverseH = static_cast<float>(1.0 / h);
  k.normalization = static_cast<float>(kernelSigma(type, dimension) / hToD);
  return k;
}

} // namespace detail
} // namespace neighborgrid
