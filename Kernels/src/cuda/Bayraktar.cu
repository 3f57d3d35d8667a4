// Bayraktar, Güdükbay and Özgüç 2009 ("GPU-based neighbor-search algorithm for particle
// simulations", Journal of Graphics, GPU, and Game Tools 14(1)), written for CUDA as the paper's
// conclusion proposes:
//  1. points sorted by cell (the paper's bitonic sort of grid coordinates; here the radix sort of
//     RadixCells, cells of size R keyed by their coordinates);
//  2. the grid map: for every cell its first point (R), its point count (G), the total of its
//     27-cell neighborhood (B), and, by a prefix sum of B, where its candidate list starts (A);
//  3. the candidate list ("fluid grid"): for every cell, the points of its 27 cells one after the
//     other, so each point appears up to 27 times;
//  4. the search: one thread per point reads its cell's candidate list, one contiguous range.
// A candidate is (point, offset of its cell from the listing cell): 8 bytes, as the paper's
// two-channel texture. Memory: about 27 x 8 bytes per point for the candidate lists, beside the
// sorted points; the benchmark reports it.
#include "GridSearch.cuh"
#include "ExclusiveSum.cuh"

namespace neighborgrid
{
namespace detail
{
namespace
{

/// The grid map's B channel: points in each cell's 27-cell neighborhood.
__global__ void neighborhoodTotals(CellTable table, std::int64_t* __restrict__ totals)
{
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= table.cells)
  {
    return;
  }
  double c[3];
  table.coordinates(k, c);
  std::int64_t total = 0;
  for (int t = 0; t < 27; ++t)
  {
    double neighbor[3];
    if (offsetCell(c, t % 3 - 1, (t / 3) % 3 - 1, t / 9 - 1, neighbor))
    {
      const int m = table.find(neighbor);
      if (m >= 0)
      {
        total += table.start[m + 1] - table.start[m];
      }
    }
  }
  totals[k] = total;
}

/// One warp per cell: lanes 0..26 take one neighbor cell each, a warp scan places their points in
/// the cell's candidate list; the lanes then also record the cell of each of the cell's own points.
__global__ void fillCandidates(CellTable table, const std::int64_t* __restrict__ listStart, int2* __restrict__ candidates,
  std::int32_t* __restrict__ cellOfPoint)
{
  const int k = static_cast<int>((blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (k >= table.cells)
  {
    return;
  }
  double c[3];
  table.coordinates(k, c);
  int begin = 0, count = 0;
  if (lane < 27)
  {
    double neighbor[3];
    if (offsetCell(c, lane % 3 - 1, (lane / 3) % 3 - 1, lane / 9 - 1, neighbor))
    {
      const int m = table.find(neighbor);
      if (m >= 0)
      {
        begin = table.start[m];
        count = table.start[m + 1] - begin;
      }
    }
  }
  int offset = count; // inclusive warp scan
  for (int d = 1; d < 32; d *= 2)
  {
    const int other = __shfl_up_sync(0xffffffffu, offset, d);
    if (lane >= d)
    {
      offset += other;
    }
  }
  offset -= count;
  int2* out = candidates + listStart[k] + offset;
  for (int e = 0; e < count; ++e)
  {
    out[e] = make_int2(begin + e, lane);
  }
  for (int s = table.start[k] + lane; s < table.start[k + 1]; s += 32)
  {
    cellOfPoint[s] = k;
  }
}

template <class Op>
__global__ void __launch_bounds__(gridSearchThreads) bayraktarSearch(const Particle* __restrict__ particles,
  const std::int32_t* __restrict__ orderToInput, const std::int32_t* __restrict__ cellOfPoint,
  const std::int64_t* __restrict__ listStart, const int2* __restrict__ candidates, int n, PairTest test, Op op,
  unsigned long long* decided)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const Particle pi = particles[s];
  const int k = cellOfPoint[s];
  const std::int64_t end = listStart[k + 1];
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
  for (std::int64_t e = listStart[k]; e < end; ++e)
  {
    const int2 candidate = candidates[e];
    const int j = candidate.x;
    const int code = candidate.y; // (dz + 1) * 9 + (dy + 1) * 3 + dx + 1
    const Particle pj = particles[j];
    const Particle q = shifted(pi, float(code % 3 - 1), float((code / 3) % 3 - 1), float(code / 9 - 1));
    float r2 = squaredDistance(q, pj);
    if (isNeighbor(test, r2, s, j, orderToInput, decidedHere))
    {
      acc.add(op, j, pj, r2);
    }
  }
  acc.finish(op, s, orderToInput[s]);
  addDecided(decided, decidedHere);
}

class Bayraktar final : public CudaMethod
{
public:
  explicit Bayraktar(DevicePool& pool)
    : cells_(pool), totals_(pool), listStart_(pool), candidates_(pool), cellOfPoint_(pool), scratch_(pool)
  {
  }
  Method id() const override { return Method::Bayraktar; }

  std::int64_t plannedBytes(const CudaRun& run) const override
  {
    const Problem& p = *run.problem;
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, cellSizeFor(p.radius, 1));
    const std::int64_t n = run.count;
    const std::int64_t cells = cellCapacity(n, layout);
    // Each point is listed by at most 27 cells.
    return RadixCells::plannedBytes(n, layout, true) + 16 * (cells + 1) + 4 * n + 27 * 8 * n + (std::int64_t(8) << 20);
  }

  void sort(CudaRun& run) override
  {
    const Problem& p = *run.problem;
    const int n = static_cast<int>(run.count);
    cellSize_ = cellSizeFor(p.radius, 1);
    test_ = makePairTest(p.radius, cellSize_, 2.0, run.input);
    cells_.build(run, makeKeyLayout(p.lo, p.hi, cellSize_), cellSize_, true);
    particlesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(
      run.input, cells_.orderToInput(), n, cellSize_, 1.0 / cellSize_, cells_.particleRegion());
    NG_CUDA_CHECK_LAUNCH("particlesInOrder");
    const CellTable& table = cells_.table();
    const int cells = table.cells;
    std::int64_t* totals = totals_.ensure(std::size_t(cells) + 1, "neighborhood totals");
    std::int64_t* listStart = listStart_.ensure(std::size_t(cells) + 1, "candidate list starts");
    NG_CUDA_CHECK(cudaMemsetAsync(totals + cells, 0, sizeof(std::int64_t), run.stream), "neighborhood totals");
    neighborhoodTotals<<<blocksFor(cells), 256, 0, run.stream>>>(table, totals);
    NG_CUDA_CHECK_LAUNCH("neighborhoodTotals");
    exclusiveSum(totals, listStart, cells + 1, scratch_, run.stream, "scanning neighborhood totals");
    std::int64_t* entries = entriesHost_.ensure(1, "candidate count (pinned host memory)");
    NG_CUDA_CHECK(cudaMemcpyAsync(entries, listStart + cells, sizeof(std::int64_t), cudaMemcpyDeviceToHost, run.stream),
      "reading the candidate count");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "sizing the candidate lists");
    int2* candidates = candidates_.ensure(std::size_t(*entries) + 1, "candidate lists");
    std::int32_t* cellOfPoint = cellOfPoint_.ensure(std::size_t(n), "cell of each point");
    fillCandidates<<<blocksFor(std::int64_t(cells) * 32), 256, 0, run.stream>>>(table, listStart, candidates, cellOfPoint);
    NG_CUDA_CHECK_LAUNCH("fillCandidates");
  }
  double cellSize() const override { return cellSize_; }
  bool sortWeighsOne() const override { return true; } // particlesInOrder writes weights of one
  Particle* particles() override { return cells_.particleRegion(); }
  const std::int32_t* orderToInput() const override { return cells_.orderToInput(); }
  QuerySource querySource() override { return cellQuerySource(cells_.table(), particles(), orderToInput(), 1); }
  std::int64_t heldBytes() const override
  {
    return cells_.heldBytes() +
      std::int64_t(totals_.bytes() + listStart_.bytes() + candidates_.bytes() + cellOfPoint_.bytes() + scratch_.bytes());
  }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    const int n = static_cast<int>(run.count);
    bayraktarSearch<<<blocksFor(n, gridSearchThreads), gridSearchThreads, 0, run.stream>>>(cells_.particleRegion(),
      cells_.orderToInput(), cellOfPoint_.get(), listStart_.get(), candidates_.get(), n, test_, op, run.decided);
  }

  RadixCells cells_;
  DeviceBuffer<std::int64_t> totals_;
  DeviceBuffer<std::int64_t> listStart_;
  DeviceBuffer<int2> candidates_;
  DeviceBuffer<std::int32_t> cellOfPoint_;
  DeviceBuffer<unsigned char> scratch_;
  PinnedBuffer<std::int64_t> entriesHost_;
  double cellSize_ = 1.0;
  PairTest test_;
};

} // namespace

std::unique_ptr<CudaMethod> makeBayraktar(DevicePool& pool)
{
  return std::make_unique<Bayraktar>(pool);
}

} // namespace detail
} // namespace neighborgrid
