// Periodic images on the GPU (Backend.h, PeriodicImages): the caller's points, uploaded once as
// they are, are wrapped into the box and their images within R appended there, by the host's own
// rule and in its order (PeriodicRanges.h), so a periodic run moves its points over PCIe once and
// builds nothing on the host. Masses and arrays follow their particles to the images on the device.
#pragma once

#include "../Backend.h"
#include "CudaSupport.h"

namespace neighborgrid
{
namespace detail
{

class DeviceImages
{
public:
  explicit DeviceImages(DevicePool& pool)
    : offsets_(pool), scratch_(pool), coordinates_(pool), imageOf_(pool), partialBounds_(pool)
  {
  }

  /// Counts the images of the n points at `raw` (float or double xyz on the device); returns
  /// their number, leaving the offsets for write(). Synchronizes the stream (for the count).
  std::int64_t count(const void* raw, bool isDouble, std::int64_t n, const PeriodicImages& box, cudaStream_t stream);
  /// The n wrapped points, then the images: (n + images) x 3 doubles, and per image its particle;
  /// lo and hi get the bounds of them all, found as they are written. Synchronizes the stream (for
  /// the bounds). The caller's points are finite (the upload checks them).
  void write(const void* raw, bool isDouble, std::int64_t n, std::int64_t images, int multiprocessors,
    cudaStream_t stream, double lo[3], double hi[3]);
  const double* coordinates() const { return coordinates_.get(); }
  /// Per image, the index of its particle.
  const std::int32_t* imageOf() const { return imageOf_.get(); }
  /// values: (particles + images) x components floats, the particles' filled; fills the images'.
  void extend(float* values, int components, std::int64_t particles, std::int64_t images, cudaStream_t stream) const;
  std::int64_t heldBytes() const
  {
    return std::int64_t(offsets_.bytes() + scratch_.bytes() + coordinates_.bytes() + imageOf_.bytes() +
      partialBounds_.bytes());
  }
  void release()
  {
    offsets_.release();
    scratch_.release();
    coordinates_.release();
    imageOf_.release();
    partialBounds_.release();
  }
  /// Device bytes of the extended coordinates and the image map, for `images` images of n points.
  static std::int64_t bytesFor(std::int64_t n, std::int64_t images)
  {
    return std::int64_t(3 * sizeof(double)) * (n + images) + std::int64_t(sizeof(std::int32_t)) * images;
  }

private:
  PeriodicImages box_;
  DeviceBuffer<long long> offsets_; // per point, where its first image goes; the total after them
  DeviceBuffer<char> scratch_;
  DeviceBuffer<double> coordinates_;
  DeviceBuffer<std::int32_t> imageOf_;
  DeviceBuffer<double> partialBounds_; // lo and hi of every block of the write, then of them all
  PinnedBuffer<long long> totalHost_;
  PinnedBuffer<double> boundsHost_;
};

} // namespace detail
} // namespace neighborgrid
