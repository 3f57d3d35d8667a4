// The bounds the CUDA upload's workers find in each piece they copy (Kernels/src/CoordinateBounds.h),
// against a plain pass in double: every first axis, lengths across the vector blocks and their
// tails, float and double, with NaN and infinities. Host code: it runs on every backend and in CI.
#include "CoordinateBounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using neighborgrid::detail::CoordinateBounds;
using neighborgrid::detail::widenBounds;

namespace
{
template <class T>
void expectBoundsOfRandomPieces()
{
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> value(-1e4, 1e4);
  const T specials[] = { std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
    -std::numeric_limits<T>::infinity() };
  for (int trial = 0; trial < 4000; ++trial)
  {
    const std::size_t count = trial < 200 ? std::size_t(trial) : std::size_t(rng() % 5000);
    const int firstAxis = int(rng() % 3);
    std::vector<T> values(count);
    for (T& v : values)
    {
      v = T(value(rng));
    }
    if (count > 0 && trial % 3 == 0)
    {
      values[rng() % count] = specials[rng() % 3];
    }
    double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
    bool finite = true;
    for (std::size_t i = 0; i < count; ++i)
    {
      const int axis = int((std::size_t(firstAxis) + i) % 3);
      const double v = values[i];
      finite = finite && std::isfinite(v);
      lo[axis] = std::min(lo[axis], v);
      hi[axis] = std::max(hi[axis], v);
    }
    // Bounds widened from earlier pieces must stay where no value of this one goes beyond them.
    CoordinateBounds bounds;
    bounds.lo[1] = -2e4;
    bounds.hi[2] = 2e4;
    lo[1] = std::min(lo[1], -2e4);
    hi[2] = std::max(hi[2], 2e4);
    widenBounds(values.data(), count, firstAxis, sizeof(T) == sizeof(double), bounds);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + std::to_string(count) + " values from axis " +
      std::to_string(firstAxis));
    ASSERT_EQ(bounds.allFinite, finite);
    if (finite)
    {
      for (int a = 0; a < 3; ++a)
      {
        ASSERT_EQ(bounds.lo[a], lo[a]) << "axis " << a;
        ASSERT_EQ(bounds.hi[a], hi[a]) << "axis " << a;
      }
    }
  }
}
} // namespace

TEST(CoordinateBounds, FloatPiecesMatchAPlainPass)
{
  expectBoundsOfRandomPieces<float>();
}

TEST(CoordinateBounds, DoublePiecesMatchAPlainPass)
{
  expectBoundsOfRandomPieces<double>();
}

TEST(CoordinateBounds, MergeKeepsTheWiderBoundsAndAnyNonFiniteValue)
{
  CoordinateBounds a, b;
  const float first[] = { 1.0f, 2.0f, 3.0f };
  const float second[] = { -1.0f, 5.0f, 0.5f, std::numeric_limits<float>::quiet_NaN() };
  widenBounds(first, 3, 0, false, a);
  widenBounds(second, 3, 0, false, b);
  a.merge(b);
  EXPECT_EQ(a.lo[0], -1.0);
  EXPECT_EQ(a.hi[1], 5.0);
  EXPECT_EQ(a.lo[2], 0.5);
  EXPECT_TRUE(a.allFinite);
  widenBounds(second + 3, 1, 0, false, b);
  a.merge(b);
  EXPECT_FALSE(a.allFinite);
}

namespace
{
/// n points uniform in [0, side)^3 (z flat at 2.5 when planar), as float or double, and their bounds.
template <class T>
struct UniformCloud
{
  std::vector<T> xyz;
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };

  UniformCloud(std::int64_t n, double side, bool planar = false) : xyz(3 * n)
  {
    std::mt19937_64 rng(77 + n);
    std::uniform_real_distribution<double> u(0.0, side);
    for (std::int64_t i = 0; i < 3 * n; ++i)
    {
      xyz[i] = T(planar && i % 3 == 2 ? 2.5 : u(rng));
    }
  }
  void place(std::int64_t i, double x, double y, double z)
  {
    xyz[3 * i] = T(x);
    xyz[3 * i + 1] = T(y);
    xyz[3 * i + 2] = T(z);
  }
  std::int64_t count() const { return std::int64_t(xyz.size() / 3); }
  bool bulk(double bulkLo[3], double bulkHi[3])
  {
    for (std::size_t i = 0; i < xyz.size(); ++i)
    {
      lo[i % 3] = std::min(lo[i % 3], double(xyz[i]));
      hi[i % 3] = std::max(hi[i % 3], double(xyz[i]));
    }
    return neighborgrid::detail::findBulkExtent(
      xyz.data(), count(), std::is_same<T, double>::value, lo, hi, bulkLo, bulkHi);
  }
};

/// The sample's point s of n.
std::int64_t sampled(int s, std::int64_t n)
{
  return neighborgrid::detail::bulkSampleIndex(s, n);
}

template <class T>
void expectFarPointsLeftOut()
{
  // One far point where the sample does not look, and two where it does, on the same side.
  UniformCloud<T> cloud(8193, 10.0);
  cloud.place(1, 1e6, -3e5, 2e7);
  cloud.place(sampled(7, 8193), -4e4, 5e4, 9e5);
  cloud.place(sampled(200, 8193), -3e4, 6e4, 8e5);
  double lo[3], hi[3];
  EXPECT_TRUE(cloud.bulk(lo, hi));
  for (int a = 0; a < 3; ++a)
  {
    EXPECT_LT(lo[a], 0.5) << "axis " << a;
    EXPECT_GT(lo[a], -1.0) << "axis " << a;
    EXPECT_GT(hi[a], 9.5) << "axis " << a;
    EXPECT_LT(hi[a], 11.0) << "axis " << a;
  }
}
} // namespace

TEST(BulkExtent, FarPointsStretchTheBoundsButNotTheBulk)
{
  expectFarPointsLeftOut<float>();
  expectFarPointsLeftOut<double>();
}

// Even and planar clouds, and clouds too small to sample, keep their bounds exactly: the
// estimates that read the bulk (Auto, FENNS's and CLAWS's coarse cells) do not move for them.
TEST(BulkExtent, EvenPlanarAndSmallCloudsKeepTheirBounds)
{
  const auto expectBounds = [](auto& cloud, const char* what) {
    double lo[3], hi[3];
    EXPECT_FALSE(cloud.bulk(lo, hi)) << what;
    for (int a = 0; a < 3; ++a)
    {
      EXPECT_EQ(lo[a], cloud.lo[a]) << what << ", axis " << a;
      EXPECT_EQ(hi[a], cloud.hi[a]) << what << ", axis " << a;
    }
  };
  UniformCloud<float> even(100000, 10.0);
  expectBounds(even, "even");
  UniformCloud<double> planar(8193, 10.0, true);
  expectBounds(planar, "planar");
  UniformCloud<float> small(1023, 10.0);
  small.place(5, 1e9, 1e9, 1e9);
  expectBounds(small, "1,023 points with a far one");
  // A cloud stretched along one axis by a few far points only on it.
  UniformCloud<float> slab(8193, 10.0);
  slab.place(sampled(3, 8193), 5.0, 5.0, 60.0);
  expectBounds(slab, "one sampled far point, 6x the extent");
  // Lattices in row-major order, whose every 512th point lies on one row or plane: a sample at
  // such a stride found a flat bulk, and FENNS's coarse cells then held eight points.
  for (int side : { 64, 128, 160 })
  {
    UniformCloud<float> lattice(std::int64_t(side) * side * side, 1.0);
    for (std::int64_t i = 0; i < lattice.count(); ++i)
    {
      lattice.place(i, double(i % side), double(i / side % side), double(i / side / side));
    }
    expectBounds(lattice, (std::to_string(side) + "^3 lattice, row-major").c_str());
  }
}

// The sample is spread over the whole array at every size, and stays inside it.
TEST(BulkExtent, SampleCoversTheArray)
{
  for (std::int64_t n : { 1024LL, 8193LL, 4096000LL, 3000000000LL })
  {
    std::int64_t least = n, most = -1, lowerHalf = 0;
    for (int s = 0; s < 256; ++s)
    {
      const std::int64_t i = sampled(s, n);
      ASSERT_GE(i, 0) << n;
      ASSERT_LT(i, n) << n;
      least = std::min(least, i);
      most = std::max(most, i);
      lowerHalf += i < n / 2;
    }
    EXPECT_LT(least, n / 16) << n;
    EXPECT_GT(most, n - n / 16) << n;
    EXPECT_GT(lowerHalf, 96) << n;
    EXPECT_LT(lowerHalf, 160) << n;
  }
}
