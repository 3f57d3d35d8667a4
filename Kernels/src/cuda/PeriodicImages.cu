// DeviceImages (PeriodicImages.h): count, scan, write; the rule itself is PeriodicRanges.h's.
#include "../PeriodicRanges.h"
#include "PeriodicImages.h"

#include <cub/device/device_scan.cuh>

namespace neighborgrid
{
namespace detail
{
namespace
{

constexpr int imageThreads = 256;

template <class T>
__device__ void readWrapped(const T* __restrict__ raw, std::int64_t i, const ImageRanges& r, double w[3])
{
  for (int a = 0; a < 3; ++a)
  {
    w[a] = double(raw[3 * i + a]);
  }
  wrapPoint(r, w);
}

template <class T>
__global__ void countImagesKernel(const T* __restrict__ raw, std::int64_t n, ImageRanges r, long long* __restrict__ counts)
{
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    double w[3];
    readWrapped(raw, i, r, w);
    counts[i] = imageCount(r, w);
  }
}

template <class T>
__global__ void writeImagesKernel(const T* __restrict__ raw, std::int64_t n, ImageRanges r,
  const long long* __restrict__ offsets, double* __restrict__ xyz, std::int32_t* __restrict__ imageOf)
{
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    double w[3];
    readWrapped(raw, i, r, w);
    xyz[3 * i] = w[0], xyz[3 * i + 1] = w[1], xyz[3 * i + 2] = w[2];
    std::int64_t next = n + offsets[i];
    forEachImage(r, w, [&](const double x[3]) {
      xyz[3 * next] = x[0], xyz[3 * next + 1] = x[1], xyz[3 * next + 2] = x[2];
      imageOf[next - n] = static_cast<std::int32_t>(i);
      ++next;
    });
  }
}

__global__ void extendKernel(float* __restrict__ values, int components, std::int64_t particles, std::int64_t images,
  const std::int32_t* __restrict__ imageOf)
{
  const std::int64_t total = images * components;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < total; e += std::int64_t(gridDim.x) * blockDim.x)
  {
    const std::int64_t m = e / components;
    const int c = static_cast<int>(e - m * components);
    values[(particles + m) * components + c] = values[std::int64_t(imageOf[m]) * components + c];
  }
}

int gridFor(std::int64_t items)
{
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>((items + imageThreads - 1) / imageThreads, 65536)));
}

} // namespace

std::int64_t DeviceImages::count(const void* raw, bool isDouble, std::int64_t n, const PeriodicImages& box, cudaStream_t stream)
{
  box_ = box;
  const ImageRanges r = makeImageRanges(box);
  long long* counts = counts_.ensure(std::size_t(n) + 1, "periodic image counts");
  if (isDouble)
  {
    countImagesKernel<<<gridFor(n), imageThreads, 0, stream>>>(static_cast<const double*>(raw), n, r, counts);
  }
  else
  {
    countImagesKernel<<<gridFor(n), imageThreads, 0, stream>>>(static_cast<const float*>(raw), n, r, counts);
  }
  NG_CUDA_CHECK_LAUNCH("counting periodic images");
  NG_CUDA_CHECK(cudaMemsetAsync(counts + n, 0, sizeof(long long), stream), "counting periodic images");
  // Exclusive offsets over n + 1 entries, in place: the last is the total.
  std::size_t scanBytes = 0;
  NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, counts, counts, n + 1, stream), "scanning image counts");
  void* temp = scratch_.ensureBytes(scanBytes, "image count scan");
  NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, scanBytes, counts, counts, n + 1, stream), "scanning image counts");
  long long total = 0;
  NG_CUDA_CHECK(cudaMemcpyAsync(&total, counts + n, sizeof total, cudaMemcpyDeviceToHost, stream), "reading the image count");
  NG_CUDA_CHECK(cudaStreamSynchronize(stream), "counting periodic images");
  return static_cast<std::int64_t>(total);
}

void DeviceImages::write(const void* raw, bool isDouble, std::int64_t n, std::int64_t images, cudaStream_t stream)
{
  const ImageRanges r = makeImageRanges(box_);
  double* xyz = coordinates_.ensure(3 * std::size_t(n + images), "particles and their periodic images");
  std::int32_t* imageOf = imageOf_.ensure(std::size_t(std::max<std::int64_t>(1, images)), "periodic image map");
  if (isDouble)
  {
    writeImagesKernel<<<gridFor(n), imageThreads, 0, stream>>>(static_cast<const double*>(raw), n, r, counts_.get(), xyz, imageOf);
  }
  else
  {
    writeImagesKernel<<<gridFor(n), imageThreads, 0, stream>>>(static_cast<const float*>(raw), n, r, counts_.get(), xyz, imageOf);
  }
  NG_CUDA_CHECK_LAUNCH("writing periodic images");
}

void DeviceImages::extend(float* values, int components, std::int64_t particles, std::int64_t images, cudaStream_t stream) const
{
  if (images == 0)
  {
    return;
  }
  extendKernel<<<gridFor(images * components), imageThreads, 0, stream>>>(values, components, particles, images, imageOf_.get());
  NG_CUDA_CHECK_LAUNCH("extending arrays to the periodic images");
}

} // namespace detail
} // namespace neighborgrid
