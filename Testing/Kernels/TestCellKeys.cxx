// The Bits keys made from integer offsets (KeyLayout::bitsKeyOfOffsets, offsetsOfBitsKey: the GPU
// searches' per-block cell lookups) against the keys made from cell coordinates in double
// (bitsKey, cellOfBitsKey), on layouts of 32 and 64 bits with negative and positive bounds; and the
// cell coordinates from a multiply by the inverse size (the GPU's key kernels) against the exact
// floor. Host code (the same source the GPU compiles): it runs on every backend and in CI.
#include "CellGrid.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

using neighborgrid::detail::KeyLayout;
using neighborgrid::detail::KeyMode;
using neighborgrid::detail::makeKeyLayout;

TEST(CellKeys, OffsetsMakeTheKeysOfCoordinates)
{
  std::mt19937_64 rng(2028);
  std::uniform_real_distribution<double> corner(-1e4, 1e4), length(0.0, 3e3), size(0.05, 40.0);
  int bits64 = 0;
  for (int trial = 0; trial < 2000; ++trial)
  {
    double lo[3], hi[3];
    for (int a = 0; a < 3; ++a)
    {
      lo[a] = corner(rng);
      hi[a] = lo[a] + (trial % 5 == 0 ? 0.0 : length(rng));
    }
    const KeyLayout layout = makeKeyLayout(lo, hi, size(rng));
    ASSERT_NE(layout.mode, KeyMode::Wide);
    bits64 += layout.mode == KeyMode::Bits64;
    for (int probe = 0; probe < 50; ++probe)
    {
      // Cells inside the bounds' cells and up to three beyond each side.
      std::int64_t offset[3];
      double cell[3];
      bool inside = true;
      for (int a = 0; a < 3; ++a)
      {
        const std::int64_t span = static_cast<std::int64_t>(layout.span[a]);
        offset[a] = static_cast<std::int64_t>(rng() % std::uint64_t(span + 6)) - 3;
        cell[a] = layout.lowest[a] + static_cast<double>(offset[a]);
        inside = inside && offset[a] >= 0 && offset[a] < span;
      }
      std::uint64_t fromCell = 0, fromOffsets = 0;
      ASSERT_EQ(layout.bitsKey(cell, fromCell), inside);
      const bool made = layout.bitsKeyOfOffsets(offset, fromOffsets);
      if (inside)
      {
        ASSERT_TRUE(made);
        ASSERT_EQ(fromOffsets, fromCell);
        std::int64_t back[3];
        layout.offsetsOfBitsKey(fromOffsets, back);
        double again[3];
        layout.cellOfBitsKey(fromOffsets, again);
        for (int a = 0; a < 3; ++a)
        {
          ASSERT_EQ(back[a], offset[a]);
          ASSERT_EQ(again[a], cell[a]);
        }
      }
      else if (made)
      {
        // Beyond the bounds but within the axis' bits: a key of no cell inside, and never a key
        // of another cell (each offset keeps to its own bits).
        std::int64_t back[3];
        layout.offsetsOfBitsKey(fromOffsets, back);
        for (int a = 0; a < 3; ++a)
        {
          ASSERT_EQ(back[a], offset[a]);
        }
      }
      else
      {
        bool outsideTheBits = false;
        for (int a = 0; a < 3; ++a)
        {
          const int width = (a < 2 ? layout.shift[a + 1] : layout.bits) - layout.shift[a];
          outsideTheBits = outsideTheBits || offset[a] < 0 || offset[a] >= (std::int64_t(1) << width);
        }
        ASSERT_TRUE(outsideTheBits);
      }
    }
  }
  EXPECT_GT(bits64, 0) << "no layout of the trials took 64-bit keys";
}

// cellCoordinate(x, size, inverse), the GPU kernels' multiply in place of a division, is the floor
// of x / size exactly (the signs of the exact c size - x and (c + 1) size - x), and the same double
// as the division's cellCoordinate(x, size): at random, next to multiples of the size (a few units
// in the last place either side), and at quotients near and beyond 2^51, where it divides.
TEST(CellKeys, CoordinatesFromTheInverseAreExact)
{
  using neighborgrid::detail::cellCoordinate;
  std::mt19937_64 rng(2029);
  std::uniform_real_distribution<double> unit(-1.0, 1.0), exponent(-12.0, 12.0);
  const double sizes[] = { 0.1, 1.0 / 3.0, 0.75, 1.5, 0.7071067811865476, 3e-7, 12345.678, 1e-300 };
  int checked = 0;
  for (const double size : sizes)
  {
    const double inverse = 1.0 / size;
    auto check = [&](double x) {
      const double c = cellCoordinate(x, size, inverse);
      ASSERT_EQ(c, cellCoordinate(x, size)) << "x " << x << " size " << size;
      ASSERT_FALSE(std::signbit(c) && c == 0.0);
      if (std::fabs(c) < 0x1p51)
      {
        ASSERT_LE(std::fma(c, size, -x), 0.0) << "x " << x << " size " << size;
        ASSERT_GT(std::fma(c + 1.0, size, -x), 0.0) << "x " << x << " size " << size;
      }
      ++checked;
    };
    for (int trial = 0; trial < 20000; ++trial)
    {
      check(unit(rng) * std::pow(10.0, exponent(rng)) * size * 1e3);
      // Next to a multiple k size, where x * inverse and x / size round to either side.
      const double k = std::floor(unit(rng) * (trial % 2 ? 1e6 : 1e14));
      double x = k * size;
      for (int step = 0; step < 3; ++step)
      {
        x = std::nextafter(x, -INFINITY);
      }
      for (int step = 0; step < 7; ++step, x = std::nextafter(x, INFINITY))
      {
        check(x);
      }
    }
    for (const double q : { 0x1p50, 0x1p51, 0x1p52, 0x1p53, 0x1p60 })
    {
      for (const double sign : { -1.0, 1.0 })
      {
        check(sign * q * size);
        check(std::nextafter(sign * q * size, 0.0));
      }
    }
    check(0.0);
    check(-0.0);
    check(INFINITY);
    check(-INFINITY);
  }
  EXPECT_GT(checked, 1000000);
}
