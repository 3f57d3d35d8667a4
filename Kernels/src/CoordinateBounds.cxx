#include "CoordinateBounds.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace neighborgrid
{
namespace detail
{

void CoordinateBounds::reset()
{
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = HUGE_VAL;
    hi[a] = -HUGE_VAL;
  }
  allFinite = true;
}

void CoordinateBounds::merge(const CoordinateBounds& other)
{
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = std::min(lo[a], other.lo[a]);
    hi[a] = std::max(hi[a], other.hi[a]);
  }
  allFinite = allFinite && other.allFinite;
}

namespace
{

#if defined(__SSE2__)
/// 16-byte vectors of T (SSE2, every x86-64 processor): min and max with the rule a < b ? a : b,
/// so a NaN in the first operand leaves the second.
struct FloatVector
{
  using Register = __m128;
  static Register load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, Register v) { _mm_storeu_ps(p, v); }
  static Register fill(float v) { return _mm_set1_ps(v); }
  static Register min(Register a, Register b) { return _mm_min_ps(a, b); }
  static Register max(Register a, Register b) { return _mm_max_ps(a, b); }
  static Register mark(Register sum, Register v) { return _mm_add_ps(sum, _mm_sub_ps(v, v)); }
};
struct DoubleVector
{
  using Register = __m128d;
  static Register load(const double* p) { return _mm_loadu_pd(p); }
  static void store(double* p, Register v) { _mm_storeu_pd(p, v); }
  static Register fill(double v) { return _mm_set1_pd(v); }
  static Register min(Register a, Register b) { return _mm_min_pd(a, b); }
  static Register max(Register a, Register b) { return _mm_max_pd(a, b); }
  static Register mark(Register sum, Register v) { return _mm_add_pd(sum, _mm_sub_pd(v, v)); }
};
template <class T>
using VectorOf = typename std::conditional<std::is_same<T, float>::value, FloatVector, DoubleVector>::type;
#endif

/// One value into lane k's bounds: `v < lo ? v : lo` leaves lo for a NaN, and `v - v` is 0 for a
/// finite value and NaN for a NaN or an infinity, which then stays in the lane's mark.
template <class T>
inline void addValue(T v, T& lo, T& hi, T& mark)
{
  lo = v < lo ? v : lo;
  hi = v > hi ? v : hi;
  mark += v - v;
}

/// Blocks of three 16-byte vectors, so that each lane of a block keeps one axis (a block holds
/// a whole number of points): vector loads, minima, maxima and adds. The ring copies with memcpy
/// and then calls this on the piece it has just read: a copy in this loop (plain stores) made the
/// 4M upload slower on the H100 machine (1.98 ms against 1.65), where host memory bandwidth is
/// the limit and glibc's copy stores whole cache lines without reading them first.
template <class T>
void widen(const T* source, std::size_t count, int firstAxis, CoordinateBounds& bounds)
{
  constexpr std::size_t lanes = 16 / sizeof(T);
  constexpr std::size_t block = 3 * lanes;
  T lo[block], hi[block], marks[block];
  std::size_t i = 0;
#if defined(__SSE2__)
  using V = VectorOf<T>;
  typename V::Register vlo[3], vhi[3], vmarks[3];
  for (int r = 0; r < 3; ++r)
  {
    vlo[r] = V::fill(T(HUGE_VAL));
    vhi[r] = V::fill(T(-HUGE_VAL));
    vmarks[r] = V::fill(T(0));
  }
  for (; i + block <= count; i += block)
  {
    for (int r = 0; r < 3; ++r)
    {
      const typename V::Register v = V::load(source + i + r * lanes);
      vlo[r] = V::min(v, vlo[r]);
      vhi[r] = V::max(v, vhi[r]);
      vmarks[r] = V::mark(vmarks[r], v);
    }
  }
  for (int r = 0; r < 3; ++r)
  {
    V::store(lo + r * lanes, vlo[r]);
    V::store(hi + r * lanes, vhi[r]);
    V::store(marks + r * lanes, vmarks[r]);
  }
#else
  for (std::size_t k = 0; k < block; ++k)
  {
    lo[k] = T(HUGE_VAL);
    hi[k] = T(-HUGE_VAL);
    marks[k] = 0;
  }
#endif
  for (; i < count; ++i) // without vectors: every value; with them, those after the last block
  {
    const std::size_t k = i % block;
    addValue(source[i], lo[k], hi[k], marks[k]);
  }
  for (std::size_t k = 0; k < block; ++k)
  {
    const int axis = static_cast<int>((std::size_t(firstAxis) + k) % 3);
    bounds.lo[axis] = std::min(bounds.lo[axis], double(lo[k]));
    bounds.hi[axis] = std::max(bounds.hi[axis], double(hi[k]));
    bounds.allFinite = bounds.allFinite && marks[k] == 0;
  }
}

} // namespace

void widenBounds(const void* values, std::size_t count, int firstAxis, bool isDouble, CoordinateBounds& bounds)
{
  if (isDouble)
  {
    widen(static_cast<const double*>(values), count, firstAxis, bounds);
  }
  else
  {
    widen(static_cast<const float*>(values), count, firstAxis, bounds);
  }
}

std::int64_t bulkSampleIndex(int s, std::int64_t n)
{
  // SplitMix64's finalizer over the golden-ratio sequence: fixed, so runs are repeatable.
  std::uint64_t z = (std::uint64_t(s) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<std::int64_t>(z % std::uint64_t(n));
}

namespace
{
constexpr int bulkSample = 256;
constexpr int bulkTrimmed = 2; // sample values beyond the bulk's ends, on each side

template <class T>
void findBulkExtentTyped(const T* xyz, std::int64_t n, double bulkLo[3], double bulkHi[3])
{
  // The three smallest and three largest sample values of each axis, in order, kept in one pass.
  double low[3][bulkTrimmed + 1], high[3][bulkTrimmed + 1];
  for (int a = 0; a < 3; ++a)
  {
    std::fill(std::begin(low[a]), std::end(low[a]), std::numeric_limits<double>::infinity());
    std::fill(std::begin(high[a]), std::end(high[a]), -std::numeric_limits<double>::infinity());
  }
  for (int s = 0; s < bulkSample; ++s)
  {
    const std::int64_t i = bulkSampleIndex(s, n);
    for (int a = 0; a < 3; ++a)
    {
      double v = double(xyz[3 * i + a]), w = v;
      for (int k = 0; k <= bulkTrimmed; ++k)
      {
        if (v < low[a][k])
        {
          std::swap(v, low[a][k]);
        }
        if (w > high[a][k])
        {
          std::swap(w, high[a][k]);
        }
      }
    }
  }
  // A uniform sample of m values leaves about (t + 1) / (m + 1) of the extent beyond its
  // (t + 1)-th smallest value, and as much beyond the (t + 1)-th largest.
  const double beyond = double(bulkTrimmed + 1) / double(bulkSample + 1 - 2 * (bulkTrimmed + 1));
  for (int a = 0; a < 3; ++a)
  {
    const double width = high[a][bulkTrimmed] - low[a][bulkTrimmed];
    bulkLo[a] = low[a][bulkTrimmed] - beyond * width;
    bulkHi[a] = high[a][bulkTrimmed] + beyond * width;
  }
}
} // namespace

bool findBulkExtent(const void* xyz, std::int64_t n, bool isDouble, const double lo[3], const double hi[3],
  double bulkLo[3], double bulkHi[3])
{
  std::copy(lo, lo + 3, bulkLo);
  std::copy(hi, hi + 3, bulkHi);
  if (n < 4 * bulkSample)
  {
    return false;
  }
  double sampledLo[3], sampledHi[3];
  if (isDouble)
  {
    findBulkExtentTyped(static_cast<const double*>(xyz), n, sampledLo, sampledHi);
  }
  else
  {
    findBulkExtentTyped(static_cast<const float*>(xyz), n, sampledLo, sampledHi);
  }
  double boundsVolume = 1.0, bulkVolume = 1.0;
  for (int a = 0; a < 3; ++a)
  {
    sampledLo[a] = std::max(lo[a], sampledLo[a]);
    sampledHi[a] = std::min(hi[a], sampledHi[a]);
    // A flat axis (planar data) is as flat in the sample: the ratio of the volumes is the others'.
    boundsVolume *= std::max(hi[a] - lo[a], 1e-300);
    bulkVolume *= std::max(sampledHi[a] - sampledLo[a], 1e-300);
  }
  if (!(bulkVolume < boundsVolume / 8.0))
  {
    return false;
  }
  std::copy(sampledLo, sampledLo + 3, bulkLo);
  std::copy(sampledHi, sampledHi + 3, bulkHi);
  return true;
}

} // namespace detail
} // namespace neighborgrid
