// The Bits keys made from integer offsets (KeyLayout::bitsKeyOfOffsets, offsetsOfBitsKey: the GPU
// searches' per-block cell lookups) against the keys made from cell coordinates in double
// (bitsKey, cellOfBitsKey), on layouts of 32 and 64 bits with negative and positive bounds. Host
// code: it runs on every backend and in CI.
#include "CellGrid.h"

#include <gtest/gtest.h>

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
