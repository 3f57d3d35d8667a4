// The CPU backend's vectorized pair loops (CpuPairLoops.h). Compiled with -fno-math-errno and
// -fno-trapping-math (Kernels/CMakeLists.txt): without them sqrt and the masks of the loops keep
// branches and nothing vectorizes; neither changes a result bit.
//
// x86-64's baseline is SSE2. Where the toolchain supports function multiversioning, the entry
// points are also compiled for AVX2 and AVX-512 and the loader picks the widest the processor has
// (GCC/Clang target_clones): the same operations in the same order, so the same results.
#include "CpuPairLoops.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define NG_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef NG_SIMD_CLONES
#define NG_SIMD_CLONES
#endif
// The per-point loops are inlined into each clone, so they are compiled for its instruction set.
#if defined(__GNUC__)
#define NG_INLINE inline __attribute__((always_inline))
#else
#define NG_INLINE inline
#endif

namespace neighborgrid
{
namespace detail
{
namespace
{

/// x where keep, +0 elsewhere: a mask, not a branch into which the compiler could move the work
/// of x (a load under a branch keeps the loop from vectorizing).
NG_INLINE float keepIf(bool keep, float x)
{
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0u - static_cast<std::uint32_t>(keep);
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// The index of mask's lowest set bit (mask != 0).
NG_INLINE int lowestBit(std::uint32_t mask)
{
#if defined(__GNUC__)
  return __builtin_ctz(mask);
#else
  int bit = 0;
  while (!(mask & 1u))
  {
    mask >>= 1;
    ++bit;
  }
  return bit;
#endif
}

/// Neighbors of q clearly inside R. The pairs not clearly outside (r2 <= reject, or NaN) are
/// counted too: where the two counts differ, some pair needs the double decision.
NG_INLINE std::int32_t countPoint(const Neighborhood& around, const Particle& q, float accept, float reject, std::uint8_t& band)
{
  const float* x = around.x.data();
  const float* y = around.y.data();
  const float* z = around.z.data();
  std::int32_t inside = 0, notOutside = 0;
  for (std::int64_t j = 0; j < around.padded; ++j)
  {
    const float r2 = frameSquared(q.x - x[j], q.y - y[j], q.z - z[j]);
    inside += r2 < accept ? 1 : 0;
    notOutside += !(r2 > reject) ? 1 : 0;
  }
  band = notOutside != inside ? 1 : 0;
  return inside;
}

/// sum_j w_j W(r_ij) over the pairs of q clearly inside R, per lane, compensated. The kernel type
/// is a template argument so the loop has no branch.
template <Kernel type>
NG_INLINE void densityPoint(const Neighborhood& around, const Particle& q, const KernelParams& k, float accept,
  float reject, float& total, float& totalCarry, std::uint8_t& band)
{
  const float* x = around.x.data();
  const float* y = around.y.data();
  const float* z = around.z.data();
  const float* w = around.w.data();
  float sum[pairLanes] = {}, carry[pairLanes] = {};
  std::int32_t inside[pairLanes] = {}, notOutside[pairLanes] = {};
  for (std::int64_t j = 0; j < around.padded; j += pairLanes)
  {
    for (int l = 0; l < pairLanes; ++l)
    {
      const float r2 = frameSquared(q.x - x[j + l], q.y - y[j + l], q.z - z[j + l]);
      // As DensityOperation::pair computes it: w_j times the kernel's shape (finish() applies
      // sigma_d / h^d).
      const float value = kernelShape<float>(type, std::sqrt(r2) * k.inverseH);
      const float term = keepIf(r2 < accept, w[j + l] * value);
      const float t = term - carry[l];
      const float s = sum[l] + t;
      carry[l] = (s - sum[l]) - t;
      sum[l] = s;
      inside[l] += r2 < accept ? 1 : 0;
      notOutside[l] += !(r2 > reject) ? 1 : 0;
    }
  }
  // The lanes into one compensated sum, in lane order.
  float s = 0.0f, c = 0.0f;
  bool open = false;
  for (int l = 0; l < pairLanes; ++l)
  {
    for (const float term : { sum[l], -carry[l] })
    {
      const float t = term - c;
      const float next = s + t;
      c = (next - s) - t;
      s = next;
    }
    open |= inside[l] != notOutside[l];
  }
  total = s;
  totalCarry = c;
  band = open ? 1 : 0;
}

template <Kernel type>
NG_INLINE void densityCell(const CellPairs& cell, const KernelParams& kernel, float* sum, float* carry)
{
  for (std::int64_t i = 0; i < cell.count; ++i)
  {
    densityPoint<type>(
      *cell.around, cell.points[i], kernel, cell.accept, cell.reject, sum[i], carry[i], cell.band[i]);
  }
}

} // namespace

NG_SIMD_CLONES void shiftInto(const float* __restrict from, std::int32_t n, float dx, float dy, float dz,
  float* __restrict x, float* __restrict y, float* __restrict z, float* __restrict w)
{
  for (std::int32_t j = 0; j < n; ++j)
  {
    x[j] = from[4 * j] + dx;
    y[j] = from[4 * j + 1] + dy;
    z[j] = from[4 * j + 2] + dz;
  }
  if (w)
  {
    for (std::int32_t j = 0; j < n; ++j)
    {
      w[j] = from[4 * j + 3];
    }
  }
}

NG_SIMD_CLONES void countClearlyInside(const CellPairs& cell, std::int32_t* inside)
{
  for (std::int64_t i = 0; i < cell.count; ++i)
  {
    inside[i] = countPoint(*cell.around, cell.points[i], cell.accept, cell.reject, cell.band[i]);
  }
}

NG_SIMD_CLONES std::int32_t listUncertain(
  const Neighborhood& around, const Particle& q, float accept, float reject, std::int32_t* positions)
{
  const float* x = around.x.data();
  const float* y = around.y.data();
  const float* z = around.z.data();
  std::int32_t listed = 0;
  for (std::int64_t j = 0; j < around.padded; j += pairLanes)
  {
    // A lane mask per pairLanes candidates: the test vectorizes, and only the few in the band
    // leave it.
    std::uint32_t mask = 0;
    for (int l = 0; l < pairLanes; ++l)
    {
      const float r2 = frameSquared(q.x - x[j + l], q.y - y[j + l], q.z - z[j + l]);
      mask |= static_cast<std::uint32_t>(!(r2 < accept) & !(r2 > reject)) << l;
    }
    for (; mask != 0; mask &= mask - 1)
    {
      positions[listed++] = static_cast<std::int32_t>(j) + lowestBit(mask);
    }
  }
  return listed;
}

NG_SIMD_CLONES void densityClearlyInside(const CellPairs& cell, const KernelParams& kernel, float* sum, float* carry)
{
  switch (kernel.type)
  {
    case Kernel::CubicSpline:
      return densityCell<Kernel::CubicSpline>(cell, kernel, sum, carry);
    case Kernel::QuarticSpline:
      return densityCell<Kernel::QuarticSpline>(cell, kernel, sum, carry);
    case Kernel::QuinticSpline:
      return densityCell<Kernel::QuinticSpline>(cell, kernel, sum, carry);
    case Kernel::WendlandC2:
    default:
      return densityCell<Kernel::WendlandC2>(cell, kernel, sum, carry);
  }
}

} // namespace detail
} // namespace neighborgrid
