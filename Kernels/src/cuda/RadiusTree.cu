// The radius tree's build (RadiusTree.h): Morton keys, the sort, the particles in tree order and
// the boxes of every level.
#include "RadiusTree.h"

#include "Morton.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace neighborgrid
{
namespace detail
{
namespace
{

struct MortonFrame
{
  double lo[3];
  double scale[3]; // cells a unit of length, 0 on a flat axis
};

__global__ void mortonKeys(InputPoints input, std::int64_t n, MortonFrame frame, unsigned long long* __restrict__ keys,
  std::int32_t* __restrict__ order)
{
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= n)
  {
    return;
  }
  double x[3];
  input.get(i, x[0], x[1], x[2]);
  unsigned long long key = 0;
  for (int a = 0; a < 3; ++a)
  {
    const double cell = fmin(fmax((x[a] - frame.lo[a]) * frame.scale[a], 0.0), double((1 << mortonAxisBits) - 1));
    key |= spreadBits(static_cast<std::uint64_t>(cell)) << (2 - a);
  }
  keys[i] = key;
  order[i] = static_cast<std::int32_t>(i);
}

__global__ void treeOrderParticles(InputPoints input, int n, const std::int32_t* __restrict__ order,
  const float* __restrict__ radii, double constantRadius, const float* __restrict__ weights, float constantWeight,
  TreePoint* __restrict__ positions, float* __restrict__ sortedRadii, float* __restrict__ sortedWeights)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const std::int32_t i = order[s];
  double x, y, z;
  input.get(i, x, y, z);
  const double radius = radii ? double(radii[i]) : constantRadius;
  positions[s] = TreePoint{ x, y, z, radius };
  if (radii)
  {
    sortedRadii[s] = radii[i];
  }
  sortedWeights[s] = weights ? weights[i] : constantWeight;
}

/// Level 0: the box of each cluster, corners rounded outward to float, its largest radius rounded
/// up (low.w) and its smallest rounded down (high.w).
__global__ void clusterBoxes(const TreePoint* __restrict__ positions, int n, int clusters, float4* __restrict__ low,
  float4* __restrict__ high)
{
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= clusters)
  {
    return;
  }
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  double largest = 0.0, smallest = HUGE_VAL;
  const int end = min(n, (c + 1) * radiusTreeCluster);
  for (int s = c * radiusTreeCluster; s < end; ++s)
  {
    const TreePoint p = positions[s];
    lo[0] = fmin(lo[0], p.x), lo[1] = fmin(lo[1], p.y), lo[2] = fmin(lo[2], p.z);
    hi[0] = fmax(hi[0], p.x), hi[1] = fmax(hi[1], p.y), hi[2] = fmax(hi[2], p.z);
    largest = fmax(largest, p.radius);
    smallest = fmin(smallest, p.radius);
  }
  // The largest radius rounded up: a float radius stays itself; a constant one only grows.
  low[c] = make_float4(__double2float_rd(lo[0]), __double2float_rd(lo[1]), __double2float_rd(lo[2]),
    __double2float_ru(largest));
  high[c] = make_float4(__double2float_ru(hi[0]), __double2float_ru(hi[1]), __double2float_ru(hi[2]),
    __double2float_rd(smallest));
}

/// A level above: each node the union of its (up to) 8 children.
__global__ void parentBoxes(const float4* __restrict__ childLow, const float4* __restrict__ childHigh, int children,
  int parents, float4* __restrict__ low, float4* __restrict__ high)
{
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= parents)
  {
    return;
  }
  float4 l = make_float4(HUGE_VALF, HUGE_VALF, HUGE_VALF, 0.0f),
         h = make_float4(-HUGE_VALF, -HUGE_VALF, -HUGE_VALF, HUGE_VALF);
  const int end = min(children, (p + 1) * radiusTreeFanOut);
  for (int c = p * radiusTreeFanOut; c < end; ++c)
  {
    const float4 a = childLow[c], b = childHigh[c];
    l.x = fminf(l.x, a.x), l.y = fminf(l.y, a.y), l.z = fminf(l.z, a.z), l.w = fmaxf(l.w, a.w);
    h.x = fmaxf(h.x, b.x), h.y = fmaxf(h.y, b.y), h.z = fmaxf(h.z, b.z), h.w = fminf(h.w, b.w);
  }
  low[p] = l;
  high[p] = h;
}

__global__ void gatherToTreeOrder(const float* __restrict__ values, int components, int n,
  const std::int32_t* __restrict__ order, float* __restrict__ out)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const std::int64_t i = order[s];
  for (int c = 0; c < components; ++c)
  {
    out[std::int64_t(s) * components + c] = values[i * components + c];
  }
}

/// Levels and their node counts for n particles: clusters, then groups of 8 up to one root.
int levelCounts(std::int64_t n, int counts[12])
{
  int levels = 0;
  std::int64_t nodes = std::max<std::int64_t>(1, (n + radiusTreeCluster - 1) / radiusTreeCluster);
  while (true)
  {
    counts[levels++] = static_cast<int>(nodes);
    if (nodes == 1)
    {
      return levels;
    }
    nodes = (nodes + radiusTreeFanOut - 1) / radiusTreeFanOut;
  }
}

/// Room for deferred ranges (DeferredRanges) and for the queries that queue them. Around dense
/// cores a few hundred queries queue a few hundred ranges each; where many do (a fixed radius of
/// thousands of neighbors), the rest walk their nodes themselves.
int deferredItemCapacity(std::int64_t n)
{
  return static_cast<int>(std::max<std::int64_t>(4096, n / 8));
}
int deferredSlotCapacity(std::int64_t n)
{
  return static_cast<int>(std::max<std::int64_t>(1024, n / 32));
}
constexpr int mostTerms = 3 * 4 + 1; // RadiusOperation: the gradient of 4 components
constexpr int mostPushedTerms = 2;   // RadiusOperation::pushesTerms: density

std::size_t sortScratchBytes(std::int64_t n)
{
  std::size_t bytes = 0;
  cub::DoubleBuffer<unsigned long long> keys(nullptr, nullptr);
  cub::DoubleBuffer<std::int32_t> values(nullptr, nullptr);
  NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, static_cast<int>(n), 0, 3 * mortonAxisBits),
    "sizing the radius tree's sort");
  return bytes;
}

} // namespace

CudaRadiusTree::CudaRadiusTree(DevicePool& pool)
  : keys_(pool), order_(pool), scratch_(pool), positions_(pool), radii_(pool), weights_(pool), values_(pool),
    low_(pool), high_(pool), deferredItems_(pool), slotQuery_(pool), deferredSums_(pool), deferredCounters_(pool),
    pushed_(pool)
{
}

std::int64_t CudaRadiusTree::plannedBytes(std::int64_t n, int components)
{
  int counts[12];
  const int levels = levelCounts(n, counts);
  std::int64_t nodes = 0;
  for (int k = 0; k < levels; ++k)
  {
    nodes += counts[k];
  }
  const std::int64_t deferredBytes = std::int64_t(deferredItemCapacity(n)) * 8 +
    std::int64_t(deferredSlotCapacity(n)) * (4 + 8 * mostTerms) + 2 * 4;
  return n * (2 * 8 + 2 * 4 + 32 + 4 + 4 + 4 * std::int64_t(components) + 8 * mostPushedTerms) + nodes * 32 +
    static_cast<std::int64_t>(sortScratchBytes(n)) + deferredBytes;
}

void CudaRadiusTree::build(CudaRun& run, const float* radii, double constantRadius, const float* weights,
  float constantWeight)
{
  const Problem& p = *run.problem;
  const std::int64_t n = run.count;
  hasRadii_ = radii != nullptr;
  view_ = RadiusTreeView{};
  view_.count = static_cast<int>(n);
  view_.levels = levelCounts(n, view_.levelCount);
  int nodes = 0;
  for (int k = 0; k < view_.levels; ++k)
  {
    view_.levelStart[k] = nodes;
    nodes += view_.levelCount[k];
  }
  if (n == 0)
  {
    return;
  }
  MortonFrame frame;
  for (int a = 0; a < 3; ++a)
  {
    frame.lo[a] = p.lo[a];
    const double extent = p.hi[a] - p.lo[a];
    frame.scale[a] = extent > 0.0 ? double(1 << mortonAxisBits) / extent : 0.0;
  }
  unsigned long long* keys = keys_.ensure(2 * std::size_t(n), "radius tree keys");
  std::int32_t* order = order_.ensure(2 * std::size_t(n), "radius tree order");
  mortonKeys<<<blocksFor(n), 256, 0, run.stream>>>(run.input, n, frame, keys, order);
  NG_CUDA_CHECK_LAUNCH("radius tree keys");
  cub::DoubleBuffer<unsigned long long> keyBuffer(keys, keys + n);
  cub::DoubleBuffer<std::int32_t> orderBuffer(order, order + n);
  std::size_t bytes = sortScratchBytes(n);
  void* scratch = scratch_.ensure(bytes, "radius tree sort scratch");
  NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, bytes, keyBuffer, orderBuffer, static_cast<int>(n), 0,
                  3 * mortonAxisBits, run.stream),
    "sorting the radius tree");
  view_.orderToInput = orderBuffer.Current();
  TreePoint* positions = positions_.ensure(std::size_t(n), "radius tree positions");
  float* sortedRadii = radii_.ensure(hasRadii_ ? std::size_t(n) : 1, "radii (tree order)");
  float* sortedWeights = weights_.ensure(std::size_t(n), "weights (tree order)");
  treeOrderParticles<<<blocksFor(n), 256, 0, run.stream>>>(run.input, static_cast<int>(n), view_.orderToInput, radii,
    constantRadius, weights, constantWeight, positions, sortedRadii, sortedWeights);
  NG_CUDA_CHECK_LAUNCH("particles in tree order");
  float4* low = low_.ensure(std::size_t(nodes), "radius tree boxes");
  float4* high = high_.ensure(std::size_t(nodes), "radius tree boxes");
  clusterBoxes<<<blocksFor(view_.levelCount[0]), 256, 0, run.stream>>>(positions, static_cast<int>(n),
    view_.levelCount[0], low, high);
  for (int k = 1; k < view_.levels; ++k)
  {
    parentBoxes<<<blocksFor(view_.levelCount[k]), 256, 0, run.stream>>>(low + view_.levelStart[k - 1],
      high + view_.levelStart[k - 1], view_.levelCount[k - 1], view_.levelCount[k], low + view_.levelStart[k],
      high + view_.levelStart[k]);
  }
  NG_CUDA_CHECK_LAUNCH("radius tree boxes");
  view_.positions = positions;
  view_.weights = sortedWeights;
  view_.low = low;
  view_.high = high;
}

const float* CudaRadiusTree::valuesInTreeOrder(CudaRun& run, const float* values, int components)
{
  const std::int64_t n = view_.count;
  float* out = values_.ensure(std::size_t(n) * components, "values (tree order)");
  gatherToTreeOrder<<<blocksFor(n), 256, 0, run.stream>>>(values, components, static_cast<int>(n), view_.orderToInput,
    out);
  NG_CUDA_CHECK_LAUNCH("values in tree order");
  return out;
}

void CudaRadiusTree::prepareDeferred(CudaRun& run, int terms)
{
  DeferredRanges& d = view_.deferred;
  d.itemCapacity = deferredItemCapacity(view_.count);
  d.slotCapacity = deferredSlotCapacity(view_.count);
  if (const char* knob = std::getenv("NEIGHBORGRID_TREE_DEFER")) // benchmarking knob: 0 never queues
  {
    d.fromLevel = std::atoi(knob);
  }
  if (const char* knob = std::getenv("NEIGHBORGRID_TREE_WARP_BUDGET")) // testing knob: 0 queues every node
  {
    d.warpBudget = std::atoi(knob);
  }
  if (const char* knob = std::getenv("NEIGHBORGRID_TREE_DEFER_CAPACITY")) // testing knob: full queues
  {
    d.itemCapacity = std::min(d.itemCapacity, std::max(0, std::atoi(knob)));
    d.slotCapacity = std::min(d.slotCapacity, std::max(0, std::atoi(knob)));
  }
  d.items = deferredItems_.ensure(std::max<std::size_t>(1, d.itemCapacity), "deferred ranges");
  d.slotQuery = slotQuery_.ensure(std::max<std::size_t>(1, d.slotCapacity), "deferred ranges' queries");
  d.sums = deferredSums_.ensure(std::max<std::size_t>(1, std::size_t(d.slotCapacity) * terms), "deferred ranges' sums");
  d.counters = deferredCounters_.ensure(2, "deferred ranges' counters");
  NG_CUDA_CHECK(cudaMemsetAsync(d.sums, 0, std::size_t(d.slotCapacity) * terms * sizeof(double), run.stream),
    "clearing the deferred ranges' sums");
  NG_CUDA_CHECK(cudaMemsetAsync(d.counters, 0, 2 * sizeof(int), run.stream), "clearing the deferred ranges");
}

void CudaRadiusTree::preparePushed(CudaRun& run, int terms)
{
  const std::size_t values = std::size_t(view_.count) * terms;
  view_.pushed = pushed_.ensure(std::max<std::size_t>(1, values), "what the sources receive");
  NG_CUDA_CHECK(cudaMemsetAsync(view_.pushed, 0, values * sizeof(double), run.stream),
    "clearing what the sources receive");
}

std::int64_t CudaRadiusTree::heldBytes() const
{
  return std::int64_t(keys_.bytes() + order_.bytes() + scratch_.bytes() + positions_.bytes() + radii_.bytes() +
    weights_.bytes() + values_.bytes() + low_.bytes() + high_.bytes() + deferredItems_.bytes() + slotQuery_.bytes() +
    deferredSums_.bytes() + deferredCounters_.bytes() + pushed_.bytes());
}

} // namespace detail
} // namespace neighborgrid
