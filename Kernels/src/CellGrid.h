// The grid every method shares: cells keyed by their integer coordinates, occupied cells only.
//
// A point x lies in cell c = floor(x / s) on each axis, s the cell size. The floor is exact (a
// division, then a correction by the sign of an exact fused multiply-add) and taken in absolute
// coordinates, so two points within s of each other are always in the same or adjacent cells,
// whatever their distance from the origin and whatever other points exist. Nothing is sized from
// the bounding box: a cell is known by a key built from its coordinates, only occupied cells are
// stored, and a hash table finds a cell from its key. One far outlier adds one cell.
//
// Keys, row-major (z, then y, then x), over the cell coordinates relative to the lowest cell of
// the bounds:
//  - Bits32 / Bits64: the bounds span at most 2^31 / 2^63 cells (each axis gets as many bits as
//    its span needs). The common case; 32-bit keys sort in half the passes and memory.
//  - Wide: anything else (a far outlier, sentinel coordinates, a radius far below the spacing):
//    three 64-bit words, each the cell coordinate as a double in an order-preserving encoding.
//    Exact for every finite coordinate; sorted in the same row-major order.
//
// Cell coordinates are integers held in doubles. Beyond 2^53 in magnitude ("huge") a coordinate is
// only the rounded quotient and c + 1 may not exist: such a point can have neighbors along that
// axis only at the very same coordinate (two different doubles that large are more than s apart),
// so a huge axis is never searched at offsets -1 and +1, and its pair tests are all done in double
// (its frame coordinate is NaN; see PairTest.h).
//
// Coordinates for the float pair test are relative to the point's cell, in units of the cell size
// ("frame" coordinates, in [0, 1)): as precise far from the origin as near it, and in float range
// for any radius.
#pragma once

#include "KernelFunctions.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace neighborgrid
{
namespace detail
{

/// 2^53: integers up to this magnitude are exact in a double, with their neighbors c - 1, c + 1.
constexpr double exactIntegerLimit = 9007199254740992.0;

NG_HD double fusedMultiplyAdd(double a, double b, double c)
{
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// floor(x / size), exactly, from an estimate q of x / size whose floor is off by at most one:
/// the sign of the exact c * size - x (one rounding of an exact product and sum keeps the sign)
/// says which way.
NG_HD double floorOfQuotient(double q, double x, double size)
{
  double c = floor(q);
  if (fusedMultiplyAdd(c, size, -x) > 0.0)
  {
    c -= 1.0;
  }
  else if (fusedMultiplyAdd(c + 1.0, size, -x) <= 0.0)
  {
    c += 1.0;
  }
  return c + 0.0; // never -0: keys of equal cells must be equal bit for bit
}

/// floor(x / size), exactly, for |x / size| < 2^53; beyond, the rounded quotient (a huge cell).
/// The same on host and device: IEEE division and fused multiply-add are correctly rounded on both.
NG_HD double cellCoordinate(double x, double size)
{
  const double q = x / size;
  if (!(fabs(q) < exactIntegerLimit))
  {
    return q + 0.0; // integer-valued (or infinite): a huge cell
  }
#if !defined(__CUDA_ARCH__)
  // The host's common case without libm's floor and fma: x / size lies within 2^-53 |q| of q, so
  // where q - e and q + e (e = 2^-51 |q|, rounded) have the same floor, that is floor(x / size).
  if (fabs(q) < 0x1p52 && fabs(q) >= 0x1p-960)
  {
    const double e = fabs(q) * 0x1p-51;
    const double lo = q - e, hi = q + e;
    const auto truncatedLo = static_cast<std::int64_t>(lo), truncatedHi = static_cast<std::int64_t>(hi);
    const std::int64_t floorLo = truncatedLo - (lo < static_cast<double>(truncatedLo) ? 1 : 0);
    const std::int64_t floorHi = truncatedHi - (hi < static_cast<double>(truncatedHi) ? 1 : 0);
    if (floorLo == floorHi)
    {
      return static_cast<double>(floorLo) + 0.0;
    }
  }
#endif
  return floorOfQuotient(q, x, size);
}

/// cellCoordinate(x, size), given inverse = 1 / size (rounded): the same result, with a multiply
/// in place of the division where |x / size| < 2^51. There x * inverse lies within two roundings
/// (2^-52 |q| < 0.5) of x / size, so its floor is off by at most one, which floorOfQuotient
/// corrects. A division is a subroutine of about twenty double instructions on the GPU, and the
/// sort's key kernel takes three a point.
NG_HD double cellCoordinate(double x, double size, double inverse)
{
  const double q = x * inverse;
  if (!(fabs(q) < 0x1p51))
  {
    return cellCoordinate(x, size); // huge cells keep the correctly rounded quotient
  }
  return floorOfQuotient(q, x, size);
}

NG_HD bool isHugeCell(double c)
{
  return !(fabs(c) < exactIntegerLimit);
}

/// x relative to its cell, in cell units: [0, 1) up to rounding. NaN on a huge axis, which sends
/// every pair test of the point to the double-precision check (PairTest.h).
NG_HD float frameCoordinate(double x, double c, double size, double inverseSize)
{
  if (isHugeCell(c))
  {
    return NAN;
  }
  return static_cast<float>(fusedMultiplyAdd(-c, size, x) * inverseSize);
}

enum class KeyMode : int
{
  Bits32,
  Bits64,
  Wide
};

/// Three words, most significant first: z, y, x, each a cell coordinate in orderedBits encoding.
struct WideKey
{
  std::uint64_t word[3];
};

NG_HD bool operator==(const WideKey& a, const WideKey& b)
{
  return a.word[0] == b.word[0] && a.word[1] == b.word[1] && a.word[2] == b.word[2];
}

/// An order-preserving encoding of a double: unsigned comparison of the results orders the values.
NG_HD std::uint64_t orderedBits(double v)
{
  std::uint64_t bits;
#if defined(__CUDA_ARCH__)
  bits = static_cast<std::uint64_t>(__double_as_longlong(v + 0.0));
#else
  v += 0.0;
  std::memcpy(&bits, &v, sizeof bits);
#endif
  constexpr std::uint64_t sign = std::uint64_t(1) << 63;
  return (bits & sign) ? ~bits : (bits | sign);
}

NG_HD double fromOrderedBits(std::uint64_t bits)
{
  constexpr std::uint64_t sign = std::uint64_t(1) << 63;
  bits = (bits & sign) ? (bits & ~sign) : ~bits;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

/// How keys are made from cell coordinates; chosen on the host from the bounds (makeKeyLayout).
struct KeyLayout
{
  KeyMode mode = KeyMode::Bits32;
  double lowest[3] = { 0, 0, 0 }; // the lowest cell coordinate of the bounds, per axis
  double span[3] = { 1, 1, 1 };   // cells per axis (Bits modes)
  int shift[3] = { 0, 0, 0 };     // bit position of each axis in the key (Bits modes)
  int bits = 0;                   // bits the key uses (Bits modes)

  /// The key of cell c (Bits modes), or false when c lies outside the bounds' cells.
  NG_HD bool bitsKey(const double c[3], std::uint64_t& key) const
  {
    key = 0;
    for (int a = 0; a < 3; ++a)
    {
      const double offset = c[a] - lowest[a];
      if (!(offset >= 0.0 && offset < span[a]))
      {
        return false;
      }
      key |= static_cast<std::uint64_t>(offset) << shift[a];
    }
    return true;
  }
  NG_HD WideKey wideKey(const double c[3]) const
  {
    return WideKey{ { orderedBits(c[2]), orderedBits(c[1]), orderedBits(c[0]) } };
  }
  /// The cell coordinates of a Bits key.
  NG_HD void cellOfBitsKey(std::uint64_t key, double c[3]) const
  {
    const int next[3] = { shift[1], shift[2], bits };
    for (int a = 0; a < 3; ++a)
    {
      const int width = next[a] - shift[a];
      const std::uint64_t mask = width >= 64 ? ~std::uint64_t(0) : ((std::uint64_t(1) << width) - 1);
      c[a] = lowest[a] + static_cast<double>((key >> shift[a]) & mask);
    }
  }
  /// A Bits key's cell as integer offsets from the lowest cell of each axis.
  NG_HD void offsetsOfBitsKey(std::uint64_t key, std::int64_t offset[3]) const
  {
    const int next[3] = { shift[1], shift[2], bits };
    for (int a = 0; a < 3; ++a)
    {
      offset[a] = static_cast<std::int64_t>((key >> shift[a]) & ((std::uint64_t(1) << (next[a] - shift[a])) - 1));
    }
  }
  /// The Bits key of the cell at integer offsets from the lowest cells, or false where an offset
  /// leaves its axis' bits. Offsets within the bits but beyond the bounds give keys no point has
  /// (the lookup finds no cell), as bitsKey's out-of-bounds cells do. Integers only, for the GPU
  /// searches' lookups of hundreds of cells a block: with bitsKey from double coordinates those
  /// took about 8% of the 4M density search's instructions (RESULTS.md, issue 22).
  NG_HD bool bitsKeyOfOffsets(const std::int64_t offset[3], std::uint64_t& key) const
  {
    const int next[3] = { shift[1], shift[2], bits };
    key = 0;
    for (int a = 0; a < 3; ++a)
    {
      const std::uint64_t o = static_cast<std::uint64_t>(offset[a]);
      if ((o >> (next[a] - shift[a])) != 0)
      {
        return false;
      }
      key |= o << shift[a];
    }
    return true;
  }
  NG_HD void cellOfWideKey(const WideKey& key, double c[3]) const
  {
    c[0] = fromOrderedBits(key.word[2]);
    c[1] = fromOrderedBits(key.word[1]);
    c[2] = fromOrderedBits(key.word[0]);
  }
};

/// Bits for a span of cells: the smallest b with 2^b >= span.
inline int bitsForSpan(double span)
{
  int b = 0;
  while (b < 64 && std::ldexp(1.0, b) < span)
  {
    ++b;
  }
  return b;
}

/// The key layout for points whose coordinates lie in [lo, hi] per axis, cells of `size`.
inline KeyLayout makeKeyLayout(const double lo[3], const double hi[3], double size)
{
  KeyLayout layout;
  bool wide = false;
  int total = 0;
  for (int a = 0; a < 3; ++a)
  {
    const double first = cellCoordinate(lo[a], size);
    const double last = cellCoordinate(hi[a], size);
    layout.lowest[a] = first;
    layout.span[a] = last - first + 1.0;
    if (isHugeCell(first) || isHugeCell(last) || !(layout.span[a] < exactIntegerLimit))
    {
      wide = true;
      continue;
    }
    layout.shift[a] = total;
    total += bitsForSpan(layout.span[a]);
  }
  // All-ones is the empty slot of the lookup table: one bit short of the word keeps it unused.
  if (wide || total > 63)
  {
    layout.mode = KeyMode::Wide;
    layout.bits = 192;
  }
  else
  {
    layout.mode = total <= 31 ? KeyMode::Bits32 : KeyMode::Bits64;
    layout.bits = total;
  }
  return layout;
}

/// The cells of the points' own coordinates, and the neighbor cell at an offset: false where the
/// offset leaves a huge axis (no neighbor there) or, for Bits keys, the bounds.
NG_HD bool offsetCell(const double c[3], int dx, int dy, int dz, double out[3])
{
  const int d[3] = { dx, dy, dz };
  for (int a = 0; a < 3; ++a)
  {
    if (d[a] != 0 && isHugeCell(c[a]))
    {
      return false;
    }
    out[a] = c[a] + d[a];
  }
  return true;
}

// --- The lookup table: key -> cell ------------------------------------------------------------
/// One slot of the table for Bits keys. key = all ones marks an empty slot.
struct alignas(16) BitsSlot
{
  std::uint64_t key;
  std::int32_t cell;
  std::int32_t unused;
};
struct alignas(16) WideSlot
{
  WideKey key;
  std::int32_t cell;
  std::int32_t unused;
};
constexpr std::uint64_t emptyKey = ~std::uint64_t(0);

NG_HD std::uint64_t mixBits(std::uint64_t k)
{
  return k * 0x9E3779B97F4A7C15ull; // Fibonacci hashing: the top bits are well spread
}

NG_HD std::uint64_t mixWide(const WideKey& k)
{
  std::uint64_t h = mixBits(k.word[0]);
  h = mixBits(h ^ k.word[1] ^ (h >> 29));
  h = mixBits(h ^ k.word[2] ^ (h >> 31));
  return h;
}

/// Open addressing with linear probing over a power-of-two number of slots, at most half full.
/// Where the key space is no larger than the table ("identity"), the key is its own slot: no
/// probing, and the table is the dense grid of the bounding box (the data fill their bounds).
/// Such a table of cells sorted by key (RadixCells) holds only each slot's cell, 4 bytes instead
/// of a 16-byte BitsSlot (identityCells). On the H200, 64M points (2^27 slots): a quarter of the
/// bytes to clear, the insertion 373 -> 221 us, and Staged Tiles' search, whose blocks look up
/// their staged cells, 23.02 -> 22.71 ms (RESULTS.md, issue 22).
struct CellLookup
{
  KeyMode mode = KeyMode::Bits32;
  const BitsSlot* bitsSlots = nullptr;
  const WideSlot* wideSlots = nullptr;
  const std::int32_t* identityCells = nullptr; // identity tables of RadixCells: the cell of each key, or -1
  std::uint64_t mask = 0; // slots - 1
  int log2Slots = 1;
  bool identity = false;

  NG_HD std::uint64_t home(std::uint64_t key) const
  {
    return identity ? (key & mask) : (mixBits(key) >> (64 - log2Slots));
  }
  NG_HD std::uint64_t home(const WideKey& key) const { return mixWide(key) >> (64 - log2Slots); }

  NG_HD int findBits(std::uint64_t key) const
  {
    if (identityCells)
    {
      return identityCells[key & mask];
    }
    for (std::uint64_t s = home(key);; s = (s + 1) & mask)
    {
      const BitsSlot slot = bitsSlots[s];
      if (slot.key == key)
      {
        return slot.cell;
      }
      if (slot.key == emptyKey)
      {
        return -1;
      }
    }
  }
  NG_HD int findWide(const WideKey& key) const
  {
    for (std::uint64_t s = home(key);; s = (s + 1) & mask)
    {
      const WideSlot& slot = wideSlots[s];
      if (slot.cell < 0)
      {
        return -1;
      }
      if (slot.key == key)
      {
        return slot.cell;
      }
    }
  }
  /// The cell at coordinates c, or -1 when no point lies there.
  NG_HD int find(const KeyLayout& layout, const double c[3]) const
  {
    if (mode == KeyMode::Wide)
    {
      return findWide(layout.wideKey(c));
    }
    std::uint64_t key;
    return layout.bitsKey(c, key) ? findBits(key) : -1;
  }
};

/// Slots for `cells` keys: a power of two at least slotsPerCell (2: at most half full) times as
/// many; `identity` when the whole key space fits (Bits keys of at most that many bits).
inline void sizeLookup(KeyMode mode, int keyBits, std::int64_t cells, int& log2Slots, bool& identity, int slotsPerCell = 2)
{
  log2Slots = 1;
  while ((std::int64_t(1) << log2Slots) < slotsPerCell * cells)
  {
    ++log2Slots;
  }
  identity = mode != KeyMode::Wide && keyBits <= log2Slots + 1;
  if (identity)
  {
    log2Slots = keyBits < 1 ? 1 : keyBits;
  }
}

} // namespace detail
} // namespace neighborgrid
