// Smoothing Length on the CPU backend (KthNeighbor.h): the levels' grids sorted with the host
// radix sort, a hash of occupied cells per level, and per query a max-heap of its k nearest exact
// (double) squared distances.
#include "CpuKthNeighbor.h"

#include "CellGrid.h"
#include "HostSort.h"
#include "KthNeighbor.h"
#include "PairTest.h"
#include "Parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace neighborgrid
{
namespace detail
{
namespace
{

constexpr std::uint64_t emptySlot = ~std::uint64_t(0);
constexpr int keyBitsPerAxis = 21;

/// All points sorted by cells of one level, and a hash table from a cell to its points.
class HostLevelGrid
{
public:
  HostLevelGrid(const Points& points, const double lo[3], double cellSize, int threads) : size_(cellSize)
  {
    const std::int64_t n = points.count;
    const InputPoints input{ points.xyz, points.type == ScalarType::Float64 };
    for (int a = 0; a < 3; ++a)
    {
      firstCell_[a] = cellCoordinate(lo[a], size_);
    }
    std::vector<std::uint64_t> keys(static_cast<std::size_t>(n));
    order_.resize(static_cast<std::size_t>(n));
    parallelSlices(threads, n, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        double x[3];
        input.get(i, x[0], x[1], x[2]);
        keys[i] = keyOf(x);
        order_[i] = static_cast<std::int32_t>(i);
      }
    });
    radixSortPairs(keys, order_, 3 * keyBitsPerAxis, threads);
    std::int64_t cells = 0;
    for (std::int64_t s = 0; s < n; ++s)
    {
      cells += (s == 0 || keys[s] != keys[s - 1]) ? 1 : 0;
    }
    std::size_t slots = 16;
    log2Slots_ = 4;
    while (slots < 2 * static_cast<std::size_t>(cells))
    {
      slots *= 2;
      ++log2Slots_;
    }
    slotKey_.assign(slots, emptySlot);
    slotCell_.assign(slots, 0);
    start_.clear();
    start_.reserve(static_cast<std::size_t>(cells) + 1);
    for (std::int64_t s = 0; s < n; ++s)
    {
      if (s == 0 || keys[s] != keys[s - 1])
      {
        std::size_t slot = home(keys[s]);
        while (slotKey_[slot] != emptySlot)
        {
          slot = (slot + 1) & (slotKey_.size() - 1);
        }
        slotKey_[slot] = keys[s];
        slotCell_[slot] = static_cast<std::int32_t>(start_.size());
        start_.push_back(s);
      }
    }
    start_.push_back(n);
  }

  double cellSize() const { return size_; }
  const std::vector<std::int32_t>& order() const { return order_; }
  /// The key of the cell holding x: 21 bits per axis counted from the bounds' first cell
  /// (kthLevelRange keeps every level within 2^20 cells per axis).
  std::uint64_t keyOf(const double x[3]) const
  {
    std::uint64_t key = 0;
    for (int a = 2; a >= 0; --a)
    {
      key = (key << keyBitsPerAxis) | static_cast<std::uint64_t>(cellCoordinate(x[a], size_) - firstCell_[a]);
    }
    return key;
  }
  /// The points [first, last) of the cell at cell coordinates c relative to the first cell;
  /// false when no point lies there.
  bool find(const std::int64_t c[3], std::int64_t& first, std::int64_t& last) const
  {
    const std::int64_t limit = std::int64_t(1) << keyBitsPerAxis;
    if (c[0] < 0 || c[1] < 0 || c[2] < 0 || c[0] >= limit || c[1] >= limit || c[2] >= limit)
    {
      return false;
    }
    const std::uint64_t key = (std::uint64_t(c[2]) << (2 * keyBitsPerAxis)) | (std::uint64_t(c[1]) << keyBitsPerAxis) |
      std::uint64_t(c[0]);
    for (std::size_t slot = home(key);; slot = (slot + 1) & (slotKey_.size() - 1))
    {
      if (slotKey_[slot] == emptySlot)
      {
        return false;
      }
      if (slotKey_[slot] == key)
      {
        first = start_[slotCell_[slot]];
        last = start_[slotCell_[slot] + 1];
        return true;
      }
    }
  }
  /// The cell coordinates of x relative to the first cell, and x's frame coordinates in it.
  void cellOf(const double x[3], std::int64_t c[3], double f[3]) const
  {
    for (int a = 0; a < 3; ++a)
    {
      const double cell = cellCoordinate(x[a], size_);
      c[a] = static_cast<std::int64_t>(cell - firstCell_[a]);
      f[a] = (x[a] - cell * size_) / size_;
    }
  }

private:
  std::size_t home(std::uint64_t key) const
  {
    return static_cast<std::size_t>(mixBits(key) >> (64 - log2Slots_)); // Fibonacci hashing: the top bits
  }

  double size_;
  double firstCell_[3];
  int log2Slots_ = 4;
  std::vector<std::int32_t> order_;
  std::vector<std::int64_t> start_;
  std::vector<std::uint64_t> slotKey_;
  std::vector<std::int32_t> slotCell_;
};

/// One query's search at one level: its k nearest exact squared distances (a max-heap in
/// `heap`); false when the k-th nearest may lie beyond the level's reach (never at the coarsest).
bool searchLevel(const HostLevelGrid& grid, const InputPoints& input, const std::vector<KthCellOffset>& offsets,
  std::int64_t query, int k, bool coarsest, std::vector<double>& heap)
{
  double x[3], f[3];
  input.get(query, x[0], x[1], x[2]);
  std::int64_t c[3];
  grid.cellOf(x, c, f);
  const double inverseCell2 = 1.0 / (grid.cellSize() * grid.cellSize());
  const double slack = 1.0 + 1e-9;
  heap.clear();
  const auto& order = grid.order();
  for (const KthCellOffset& o : offsets)
  {
    const bool full = static_cast<int>(heap.size()) == k;
    if (full && double(o.lowerBound2) > heap.front() * inverseCell2 * slack)
    {
      break; // every cell left in the table lies farther than the k-th nearest
    }
    if (full)
    {
      auto gap = [](double fa, int oa) { return oa > 0 ? oa - fa : (oa < 0 ? fa - (oa + 1) : 0.0); };
      const double gx = gap(f[0], o.x), gy = gap(f[1], o.y), gz = gap(f[2], o.z);
      if ((gx * gx + gy * gy + gz * gz) > heap.front() * inverseCell2 * slack)
      {
        continue;
      }
    }
    const std::int64_t cell[3] = { c[0] + o.x, c[1] + o.y, c[2] + o.z };
    std::int64_t first = 0, last = 0;
    if (!grid.find(cell, first, last))
    {
      continue;
    }
    for (std::int64_t s = first; s < last; ++s)
    {
      const std::int64_t j = order[s];
      if (j == query)
      {
        continue;
      }
      double y[3];
      input.get(j, y[0], y[1], y[2]);
      const double r2 = exactSquaredDistance(x[0], x[1], x[2], y[0], y[1], y[2]);
      if (static_cast<int>(heap.size()) < k)
      {
        heap.push_back(r2);
        std::push_heap(heap.begin(), heap.end());
      }
      else if (r2 < heap.front())
      {
        std::pop_heap(heap.begin(), heap.end());
        heap.back() = r2;
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  // Every point outside the table lies at least kthReach cells away: nearer k-th are final. At the
  // coarsest level every point lies within one cell (even where squared distances overflow).
  return static_cast<int>(heap.size()) == k &&
    (coarsest || heap.front() * inverseCell2 * slack < double(kthReach * kthReach));
}

} // namespace

int kthNeighborDistancesOnHost(const Points& points, std::int64_t queries, int k, const double lo[3],
  const double hi[3], int threads, const ProgressReporter& progress, float* out)
{
  const std::int64_t n = points.count;
  const InputPoints input{ points.xyz, points.type == ScalarType::Float64 };
  const double base = kthBaseCellSize(n, k, lo, hi);
  int lowest = 0, highest = 0;
  kthLevelRange(base, lo, hi, lowest, highest);
  const std::vector<KthCellOffset> offsets = kthOffsetTable();

  // Each query's level from its cell of c_0; clusters are denser at their cores than that cell
  // shows, so queries estimated finer than a level look again at that level's cells, down to the
  // finest. Queries stay in the base grid's order (neighbors together).
  const float expected = kthExpectedPerBaseCell(k);
  std::unique_ptr<HostLevelGrid> grid(new HostLevelGrid(points, lo, base, threads));
  std::vector<std::int32_t> queryOrder;
  queryOrder.reserve(static_cast<std::size_t>(queries));
  for (std::int32_t i : grid->order())
  {
    if (i < queries)
    {
      queryOrder.push_back(i);
    }
  }
  std::vector<signed char> levelOf(static_cast<std::size_t>(queries), 0);
  auto ownCount = [&](std::int32_t i) {
    double x[3], f[3];
    input.get(i, x[0], x[1], x[2]);
    std::int64_t c[3], first = 0, last = 0;
    grid->cellOf(x, c, f);
    grid->find(c, first, last);
    return static_cast<std::int32_t>(last - first);
  };
  int finest = 0;
  for (std::int32_t i : queryOrder)
  {
    levelOf[i] = static_cast<signed char>(kthLevelFor(ownCount(i), expected, lowest, highest));
    finest = std::min<int>(finest, levelOf[i]);
  }
  int gridLevel = 0;
  for (int level = -1; level > finest - 1 && level >= lowest; --level)
  {
    grid.reset();
    grid.reset(new HostLevelGrid(points, lo, std::ldexp(base, level), threads));
    gridLevel = level;
    finest = level;
    for (std::int32_t i : queryOrder)
    {
      if (levelOf[i] < level)
      {
        levelOf[i] = static_cast<signed char>(level + kthLevelFor(ownCount(i), expected, lowest - level, 0));
        finest = std::min<int>(finest, levelOf[i]);
      }
    }
  }
  std::vector<std::vector<std::int32_t>> pending(static_cast<std::size_t>(highest - lowest + 2));
  for (std::int32_t i : queryOrder)
  {
    pending[static_cast<std::size_t>(levelOf[i] - lowest)].push_back(i);
  }
  std::int64_t done = 0;
  int searched = 0;
  for (int level = lowest; level <= highest; ++level)
  {
    std::vector<std::int32_t>& mine = pending[static_cast<std::size_t>(level - lowest)];
    if (mine.empty())
    {
      continue;
    }
    if (level != gridLevel)
    {
      grid.reset();
      grid.reset(new HostLevelGrid(points, lo, std::ldexp(base, level), threads));
      gridLevel = level;
    }
    ++searched;
    const int slices = std::max(1, threads);
    std::vector<std::vector<std::int32_t>> unfinished(static_cast<std::size_t>(slices));
    parallelSlices(slices, static_cast<std::int64_t>(mine.size()), [&](int slice, std::int64_t begin, std::int64_t end) {
      std::vector<double> heap;
      heap.reserve(static_cast<std::size_t>(k));
      for (std::int64_t q = begin; q < end; ++q)
      {
        const std::int32_t i = mine[static_cast<std::size_t>(q)];
        if (searchLevel(*grid, input, offsets, i, k, level == highest, heap))
        {
          out[i] = supportRadiusOf(heap.front());
        }
        else
        {
          unfinished[static_cast<std::size_t>(slice)].push_back(i);
        }
      }
    });
    std::vector<std::int32_t>& next = pending[static_cast<std::size_t>(level - lowest + 1)];
    std::int64_t carried = 0;
    for (auto& list : unfinished)
    {
      carried += static_cast<std::int64_t>(list.size());
      next.insert(next.end(), list.begin(), list.end());
    }
    if (level == highest && carried > 0)
    {
      throw Error("NeighborGrid: Smoothing Length: " + std::to_string(carried) +
        " points found fewer than k neighbors at the coarsest level (an internal error; please report it)");
    }
    done += static_cast<std::int64_t>(mine.size()) - carried;
    std::vector<std::int32_t>().swap(mine);
    progress(0.2 + 0.8 * double(done) / double(std::max<std::int64_t>(1, queries)), "smoothing length");
  }
  return searched;
}

} // namespace detail
} // namespace neighborgrid
