// The bounds the CUDA upload's workers find in each piece they copy (Kernels/src/CoordinateBounds.h),
// against a plain pass in double: every first axis, lengths across the vector blocks and their
// tails, float and double, with NaN and infinities. Host code: it runs on every backend and in CI.
#include "CoordinateBounds.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
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
