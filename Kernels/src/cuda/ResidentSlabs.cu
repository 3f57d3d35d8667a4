// The device's part of resident slabs (ResidentSlabs.h): the histogram along the cut axis, the
// gather of a slab (a stable compaction: per tile counts, a scan, per tile writes), and the
// results' scatter.
#include "ResidentSlabs.h"
#include "ExclusiveSum.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cmath>

namespace neighborgrid
{
namespace detail
{
namespace
{

constexpr int gatherThreads = 256;
constexpr int gatherRounds = 16;
constexpr std::int64_t tilePoints = std::int64_t(gatherThreads) * gatherRounds;
constexpr int histogramThreads = 256;
constexpr int maxHistogramBins = 8192; // 32 KB of shared counts a block

/// 1: the slab's own point, 2: its halo, 0: neither.
__device__ __forceinline__ int slabKind(double x, const SlabRange& s)
{
  const bool own = x >= s.lower && x < s.upper;
  const bool halo = !own && x >= s.haloLower && x <= s.haloUpper;
  return own ? 1 : (halo ? 2 : 0);
}

template <class T>
__global__ void axisHistogramKernel(const T* __restrict__ xyz, std::int64_t n, int axis, double lo,
  double inverseWidth, int bins, unsigned long long* __restrict__ counts)
{
  __shared__ unsigned int local[maxHistogramBins];
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
  {
    local[b] = 0;
  }
  __syncthreads();
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
  {
    const double at = (double(xyz[3 * i + axis]) - lo) * inverseWidth;
    const int b = at <= 0.0 ? 0 : (at >= double(bins - 1) ? bins - 1 : int(at));
    atomicAdd(&local[b], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
  {
    if (local[b])
    {
      atomicAdd(&counts[b], static_cast<unsigned long long>(local[b]));
    }
  }
}

/// Per tile of tilePoints points: its own points in counts[tile], its halo in counts[tiles + 1 + tile].
template <class T>
__global__ void countSlabKernel(const T* __restrict__ xyz, std::int64_t n, SlabRange slab, std::int64_t tiles,
  unsigned long long* __restrict__ counts)
{
  using Reduce = cub::BlockReduce<unsigned long long, gatherThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const std::int64_t first = std::int64_t(blockIdx.x) * tilePoints;
  unsigned long long mine = 0; // own in the low 32 bits, halo in the high ones (at most 16 each)
  for (int r = 0; r < gatherRounds; ++r)
  {
    const std::int64_t i = first + r * gatherThreads + threadIdx.x;
    const int kind = i < n ? slabKind(double(xyz[3 * i + slab.axis]), slab) : 0;
    mine += kind == 1 ? 1ull : (kind == 2 ? (1ull << 32) : 0ull);
  }
  const unsigned long long tile = Reduce(storage).Sum(mine);
  if (threadIdx.x == 0)
  {
    counts[blockIdx.x] = tile & 0xffffffffull;
    counts[tiles + 1 + blockIdx.x] = tile >> 32;
  }
}

/// Writes each tile's own and halo points at its offsets, in input order (a block scan a round).
template <class T>
__global__ void writeSlabKernel(const T* __restrict__ xyz, std::int64_t n, SlabRange slab, std::int64_t tiles,
  const unsigned long long* __restrict__ offsets, T* __restrict__ slabXyz, std::int64_t* __restrict__ indices)
{
  using Scan = cub::BlockScan<unsigned long long, gatherThreads>;
  __shared__ typename Scan::TempStorage storage;
  const std::int64_t first = std::int64_t(blockIdx.x) * tilePoints;
  const unsigned long long ownTotal = offsets[tiles];
  unsigned long long ownNext = offsets[blockIdx.x];
  unsigned long long haloNext = ownTotal + offsets[tiles + 1 + blockIdx.x];
  for (int r = 0; r < gatherRounds; ++r)
  {
    const std::int64_t i = first + r * gatherThreads + threadIdx.x;
    const int kind = i < n ? slabKind(double(xyz[3 * i + slab.axis]), slab) : 0;
    // A round holds at most 256 of each kind: both ranks in one scan.
    const unsigned long long flags = kind == 1 ? 1ull : (kind == 2 ? (1ull << 32) : 0ull);
    unsigned long long before = 0, round = 0;
    Scan(storage).ExclusiveSum(flags, before, round);
    if (kind)
    {
      const std::int64_t to = std::int64_t(kind == 1 ? ownNext + (before & 0xffffffffull) : haloNext + (before >> 32));
      slabXyz[3 * to] = xyz[3 * i];
      slabXyz[3 * to + 1] = xyz[3 * i + 1];
      slabXyz[3 * to + 2] = xyz[3 * i + 2];
      indices[to] = i;
    }
    ownNext += round & 0xffffffffull;
    haloNext += round >> 32;
    __syncthreads(); // the scan's storage is used again
  }
}

__global__ void scatterWordsKernel(const std::uint32_t* __restrict__ slab, int words, std::int64_t count,
  const std::int64_t* __restrict__ indices, std::uint32_t* __restrict__ whole)
{
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < count; k += stride)
  {
    const std::int64_t to = indices[k];
    for (int w = 0; w < words; ++w)
    {
      whole[to * words + w] = slab[k * words + w];
    }
  }
}

__global__ void gatherWordsKernel(const std::uint32_t* __restrict__ whole, int words, std::int64_t count,
  const std::int64_t* __restrict__ indices, std::uint32_t* __restrict__ slab)
{
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < count; k += stride)
  {
    const std::int64_t from = indices[k];
    for (int w = 0; w < words; ++w)
    {
      slab[k * words + w] = whole[from * words + w];
    }
  }
}

/// Blocks of a grid-stride loop over `count` items: enough to fill the device, no more.
int strideBlocks(std::int64_t count)
{
  return static_cast<int>(std::min<std::int64_t>(std::int64_t(1) << 16, std::max<std::int64_t>(1, (count + 255) / 256)));
}

} // namespace

DeviceSlabGather::DeviceSlabGather(DevicePool& pool)
  : histogram_(pool), tileCounts_(pool), tileOffsets_(pool), scanScratch_(pool)
{
}

AxisHistogram DeviceSlabGather::histogram(const void* xyz, bool isDouble, std::int64_t n, int axis, double lo,
  double hi, int bins, int multiprocessors, cudaStream_t stream)
{
  bins = std::max(2, std::min(bins, maxHistogramBins));
  AxisHistogram h;
  h.lo = lo;
  h.width = hi > lo ? (hi - lo) / bins : 1.0;
  h.counts.assign(std::size_t(bins), 0);
  unsigned long long* counts = histogram_.ensure(std::size_t(bins), "the slabs' histogram");
  NG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * bins, stream), "clearing the slabs' histogram");
  const int blocks = static_cast<int>(std::min<std::int64_t>(8 * multiprocessors, (n + histogramThreads - 1) / histogramThreads));
  if (isDouble)
  {
    axisHistogramKernel<<<std::max(1, blocks), histogramThreads, 0, stream>>>(
      static_cast<const double*>(xyz), n, axis, lo, 1.0 / h.width, bins, counts);
  }
  else
  {
    axisHistogramKernel<<<std::max(1, blocks), histogramThreads, 0, stream>>>(
      static_cast<const float*>(xyz), n, axis, lo, 1.0 / h.width, bins, counts);
  }
  NG_CUDA_CHECK_LAUNCH("the slabs' histogram");
  NG_CUDA_CHECK(cudaMemcpyAsync(h.counts.data(), counts, sizeof(unsigned long long) * bins, cudaMemcpyDeviceToHost, stream),
    "reading the slabs' histogram");
  NG_CUDA_CHECK(cudaStreamSynchronize(stream), "the slabs' histogram");
  return h;
}

SlabCounts DeviceSlabGather::count(const void* xyz, bool isDouble, std::int64_t n, const SlabRange& slab, cudaStream_t stream)
{
  tiles_ = (n + tilePoints - 1) / tilePoints;
  const std::size_t entries = 2 * std::size_t(tiles_ + 1);
  unsigned long long* counts = tileCounts_.ensure(entries, "the slab's counts per tile");
  unsigned long long* offsets = tileOffsets_.ensure(entries, "the slab's offsets per tile");
  NG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(unsigned long long) * entries, stream), "clearing the slab's counts");
  const int blocks = static_cast<int>(tiles_);
  if (isDouble)
  {
    countSlabKernel<<<blocks, gatherThreads, 0, stream>>>(static_cast<const double*>(xyz), n, slab, tiles_, counts);
  }
  else
  {
    countSlabKernel<<<blocks, gatherThreads, 0, stream>>>(static_cast<const float*>(xyz), n, slab, tiles_, counts);
  }
  NG_CUDA_CHECK_LAUNCH("counting the slab's points");
  // Exclusive sums of tiles + 1 entries each (the last count is 0): the last offset is the total.
  for (int kind = 0; kind < 2; ++kind)
  {
    const std::size_t at = std::size_t(kind) * std::size_t(tiles_ + 1);
    exclusiveSum(counts + at, offsets + at, tiles_ + 1, scanScratch_, stream, "the slab's offsets");
  }
  unsigned long long* totals = totals_.ensure(2, "the slab's totals");
  NG_CUDA_CHECK(cudaMemcpyAsync(&totals[0], offsets + tiles_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
    "reading the slab's totals");
  NG_CUDA_CHECK(cudaMemcpyAsync(&totals[1], offsets + 2 * tiles_ + 1, sizeof(unsigned long long),
                  cudaMemcpyDeviceToHost, stream), "reading the slab's totals");
  NG_CUDA_CHECK(cudaStreamSynchronize(stream), "counting the slab's points");
  ownTotal_ = std::int64_t(totals[0]);
  return SlabCounts{ std::int64_t(totals[0]), std::int64_t(totals[1]) };
}

void DeviceSlabGather::write(const void* xyz, bool isDouble, std::int64_t n, const SlabRange& slab, void* slabXyz,
  std::int64_t* indices, cudaStream_t stream)
{
  const unsigned long long* offsets = tileOffsets_.get();
  const int blocks = static_cast<int>(tiles_);
  if (isDouble)
  {
    writeSlabKernel<<<blocks, gatherThreads, 0, stream>>>(static_cast<const double*>(xyz), n, slab, tiles_, offsets,
      static_cast<double*>(slabXyz), indices);
  }
  else
  {
    writeSlabKernel<<<blocks, gatherThreads, 0, stream>>>(static_cast<const float*>(xyz), n, slab, tiles_, offsets,
      static_cast<float*>(slabXyz), indices);
  }
  NG_CUDA_CHECK_LAUNCH("gathering the slab's points");
}

void scatterSlabWords(const std::uint32_t* slab, int words, std::int64_t count, const std::int64_t* indices,
  std::uint32_t* whole, cudaStream_t stream)
{
  scatterWordsKernel<<<strideBlocks(count), 256, 0, stream>>>(slab, words, count, indices, whole);
  NG_CUDA_CHECK_LAUNCH("scattering the slab's results");
}

void gatherSlabWords(const std::uint32_t* whole, int words, std::int64_t count, const std::int64_t* indices,
  std::uint32_t* slab, cudaStream_t stream)
{
  gatherWordsKernel<<<strideBlocks(count), 256, 0, stream>>>(whole, words, count, indices, slab);
  NG_CUDA_CHECK_LAUNCH("gathering the slab's masses and values");
}

} // namespace detail
} // namespace neighborgrid
