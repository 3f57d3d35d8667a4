// Bounds of interleaved coordinates (x y z x y z ...) a piece at a time: the CUDA backend's upload
// copies the caller's coordinates into pinned memory in pieces of 64 KiB or 1 MiB anyway
// (TransferRing), and a worker that has just copied a piece finds its bounds in its own cache, so
// the bounds cost no pass over memory, on the host or on the device, and no wait for one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace neighborgrid
{
namespace detail
{

/// Bounds of coordinates per axis in double (exact for float and double input), and whether
/// every coordinate was finite.
struct CoordinateBounds
{
  double lo[3];
  double hi[3];
  bool allFinite;

  CoordinateBounds() { reset(); }
  void reset();
  /// Widens these bounds by `other`'s.
  void merge(const CoordinateBounds& other);
};

/// Widens `bounds` by `count` coordinate values (float or double). The first value belongs to
/// axis `firstAxis` (0 = x), the next to the next axis, and so on. A NaN or an infinity clears
/// bounds.allFinite (the bounds then mean nothing).
void widenBounds(const void* values, std::size_t count, int firstAxis, bool isDouble, CoordinateBounds& bounds);

/// The index of sample point s of n in findBulkExtent: scattered by a hash, not strided, so that
/// the sample of a structured cloud (a lattice in row-major order, image data's points) does not
/// fall on one row or plane of it. Strided, a 160^3 lattice's sample all had x = 0, its bulk
/// was flat, and FENNS and CLAWS cut it into coarse cells of eight points: 41 and 40 ms for a
/// count that takes Counting Sort 2 ms (H200; RESULTS.md, issue 22).
std::int64_t bulkSampleIndex(int s, std::int64_t n);

/// The extent of the bulk of n points (x y z x y z ..., float or double) within their bounds lo,
/// hi: per axis, the third smallest and third largest value of a sample of 256 points,
/// widened by the share of a uniform cloud's extent that a sample leaves beyond them. A few far
/// points (escaped particles, stray returns) stretch the bounds by orders of magnitude; the bulk's
/// extent they leave alone. Where the bulk's volume is more than an eighth of the bounds' (even,
/// clustered or planar data), or for fewer than 1,024 points, the bounds are the bulk, so the
/// estimates of such data stay as they were. Returns whether the bulk is narrower than the
/// bounds. Reads 256 points: a few microseconds.
bool findBulkExtent(const void* xyz, std::int64_t n, bool isDouble, const double lo[3], const double hi[3],
  double bulkLo[3], double bulkHi[3]);

} // namespace detail
} // namespace neighborgrid
