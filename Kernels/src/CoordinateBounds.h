// Bounds of interleaved coordinates (x y z x y z ...) a piece at a time: the CUDA backend's upload
// copies the caller's coordinates into pinned memory in pieces of 64 KiB or 1 MiB anyway
// (TransferRing), and a worker that has just copied a piece finds its bounds in its own cache, so
// the bounds cost no pass over memory, on the host or on the device, and no wait for one.
#pragma once

#include <cstddef>

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

} // namespace detail
} // namespace neighborgrid
