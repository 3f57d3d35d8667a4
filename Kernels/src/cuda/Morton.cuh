// Morton (Z-order) keys of 63 bits, 21 per axis: the Radius Tree's clusters and the Smoothing
// Length search's crowded-cell walk sort by them. Included only by .cu files.
#pragma once

#include "../KernelFunctions.h"

#include <cstdint>

namespace neighborgrid
{
namespace detail
{

/// Bits per axis of a Morton key: 63 bits in all.
constexpr int mortonAxisBits = 21;

/// The 21 low bits of v spread to every third bit.
NG_HD std::uint64_t spreadBits(std::uint64_t v)
{
  v &= 0x1fffffull;
  v = (v | v << 32) & 0x1f00000000ffffull;
  v = (v | v << 16) & 0x1f0000ff0000ffull;
  v = (v | v << 8) & 0x100f00f00f00f00full;
  v = (v | v << 4) & 0x10c30c30c30c30c3ull;
  v = (v | v << 2) & 0x1249249249249249ull;
  return v;
}

/// The key of cell (x, y, z), each below 2^21: x in the lowest bit of each triple.
NG_HD std::uint64_t mortonKey(std::uint64_t x, std::uint64_t y, std::uint64_t z)
{
  return spreadBits(x) | spreadBits(y) << 1 | spreadBits(z) << 2;
}

} // namespace detail
} // namespace neighborgrid
