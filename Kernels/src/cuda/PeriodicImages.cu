// DeviceImages (PeriodicImages.h): count and scan in one pass, then write (with the bounds); the
// rule itself is PeriodicRanges.h's.
#include "../PeriodicRanges.h"
#include "PeriodicImages.h"
#include "ExclusiveSum.cuh"

#include <cub/block/block_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

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

/// Point i's image count as the scan reads it, and a zero for i == n, so that the exclusive scan
/// over n + 1 entries ends in the total.
template <class T>
struct WrappedImageCount
{
  const T* raw;
  std::int64_t n;
  ImageRanges r;
  __device__ long long operator()(std::int64_t i) const
  {
    if (i >= n)
    {
      return 0;
    }
    double w[3];
    readWrapped(raw, i, r, w);
    return imageCount(r, w);
  }
};

/// Writes each wrapped point and its images, and the block's bounds of all it wrote to
/// partial[6 * block] (lo, then hi): the bounds need no pass of their own over the coordinates.
template <class T>
__global__ void __launch_bounds__(imageThreads) writeImagesKernel(const T* __restrict__ raw, std::int64_t n,
  ImageRanges r, const long long* __restrict__ offsets, double* __restrict__ xyz, std::int32_t* __restrict__ imageOf,
  double* __restrict__ partial)
{
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  const auto put = [&](std::int64_t at, const double x[3]) {
    for (int a = 0; a < 3; ++a)
    {
      xyz[3 * at + a] = x[a];
      lo[a] = fmin(lo[a], x[a]);
      hi[a] = fmax(hi[a], x[a]);
    }
  };
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    double w[3];
    readWrapped(raw, i, r, w);
    put(i, w);
    std::int64_t next = n + offsets[i];
    forEachImage(r, w, [&](const double x[3]) {
      put(next, x);
      imageOf[next - n] = static_cast<std::int32_t>(i);
      ++next;
    });
  }
  using Reduce = cub::BlockReduce<double, imageThreads>;
  __shared__ typename Reduce::TempStorage storage;
  for (int a = 0; a < 3; ++a)
  {
    const double blockLo = Reduce(storage).Reduce(lo[a], [](double x, double y) { return fmin(x, y); });
    __syncthreads();
    const double blockHi = Reduce(storage).Reduce(hi[a], [](double x, double y) { return fmax(x, y); });
    __syncthreads();
    if (threadIdx.x == 0)
    {
      partial[6 * blockIdx.x + a] = blockLo;
      partial[6 * blockIdx.x + 3 + a] = blockHi;
    }
  }
}

/// The blocks' partial bounds reduced by one warp per bound into bounds[0..5]: a lane reads every
/// 32nd block (one thread walking 528 blocks in turn waited on each load: 61 us at 4M points on
/// the H100).
__global__ void reduceBoundsKernel(const double* __restrict__ partial, int blocks, double* __restrict__ bounds)
{
  const int bound = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool isLo = bound < 3;
  double v = isLo ? HUGE_VAL : -HUGE_VAL;
  for (int b = lane; b < blocks; b += 32)
  {
    v = isLo ? fmin(v, partial[6 * b + bound]) : fmax(v, partial[6 * b + bound]);
  }
  for (int d = 16; d > 0; d /= 2)
  {
    const double other = __shfl_xor_sync(0xffffffffu, v, d);
    v = isLo ? fmin(v, other) : fmax(v, other);
  }
  if (lane == 0)
  {
    bounds[bound] = v;
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

template <class T>
void scanImageCounts(const T* raw, std::int64_t n, const ImageRanges& r, long long* offsets, DeviceBuffer<char>& scratch,
  cudaStream_t stream)
{
  const auto counts =
    thrust::make_transform_iterator(thrust::make_counting_iterator<std::int64_t>(0), WrappedImageCount<T>{ raw, n, r });
  exclusiveSum(counts, offsets, n + 1, scratch, stream, "counting periodic images");
}

} // namespace

std::int64_t DeviceImages::count(const void* raw, bool isDouble, std::int64_t n, const PeriodicImages& box, cudaStream_t stream)
{
  box_ = box;
  const ImageRanges r = makeImageRanges(box);
  long long* offsets = offsets_.ensure(std::size_t(n) + 1, "periodic image offsets");
  if (isDouble)
  {
    scanImageCounts(static_cast<const double*>(raw), n, r, offsets, scratch_, stream);
  }
  else
  {
    scanImageCounts(static_cast<const float*>(raw), n, r, offsets, scratch_, stream);
  }
  long long* total = totalHost_.ensure(1, "the image count (pinned host memory)");
  NG_CUDA_CHECK(cudaMemcpyAsync(total, offsets + n, sizeof(long long), cudaMemcpyDeviceToHost, stream),
    "reading the image count");
  NG_CUDA_CHECK(cudaStreamSynchronize(stream), "counting periodic images");
  return static_cast<std::int64_t>(*total);
}

void DeviceImages::write(const void* raw, bool isDouble, std::int64_t n, std::int64_t images, int multiprocessors,
  cudaStream_t stream, double lo[3], double hi[3])
{
  const ImageRanges r = makeImageRanges(box_);
  double* xyz = coordinates_.ensure(3 * std::size_t(n + images), "particles and their periodic images");
  std::int32_t* imageOf = imageOf_.ensure(std::size_t(std::max<std::int64_t>(1, images)), "periodic image map");
  // Enough blocks to fill the device, few enough that one warp a bound reduces their partials.
  const int blocks = static_cast<int>(std::max<std::int64_t>(1,
    std::min<std::int64_t>(8 * std::int64_t(multiprocessors), (n + imageThreads - 1) / imageThreads)));
  double* partial = partialBounds_.ensure(6 * std::size_t(blocks) + 6, "bounds of the periodic images");
  if (isDouble)
  {
    writeImagesKernel<<<blocks, imageThreads, 0, stream>>>(
      static_cast<const double*>(raw), n, r, offsets_.get(), xyz, imageOf, partial);
  }
  else
  {
    writeImagesKernel<<<blocks, imageThreads, 0, stream>>>(
      static_cast<const float*>(raw), n, r, offsets_.get(), xyz, imageOf, partial);
  }
  NG_CUDA_CHECK_LAUNCH("writing periodic images");
  reduceBoundsKernel<<<1, 6 * 32, 0, stream>>>(partial, blocks, partial + 6 * blocks);
  NG_CUDA_CHECK_LAUNCH("bounds of the periodic images");
  double* bounds = boundsHost_.ensure(6, "bounds (pinned host memory)");
  NG_CUDA_CHECK(cudaMemcpyAsync(bounds, partial + 6 * blocks, 6 * sizeof(double), cudaMemcpyDeviceToHost, stream),
    "reading the bounds of the periodic images");
  NG_CUDA_CHECK(cudaStreamSynchronize(stream), "writing periodic images");
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = bounds[a];
    hi[a] = bounds[3 + a];
  }
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
