// Smoothing Length for points that do not fit one run of a backend (KthRun throws DoesNotFit, or
// more than 2^31 - 2 points): the points cut into slabs along the longest axis, each slab alone,
// then the points whose k-th may lie past their slab again over every point near enough.
#include "Backend.h"
#include "KthNeighbor.h"
#include "PairTest.h"
#include "Parallel.h"
#include "Slabs.h"
#include "SmoothingLength.h"
#include "Timer.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// The indices [0, n) sorted by bucketOf(i) in [0, buckets), stably (a counting sort on every
/// thread): bucket c is order[start[c], start[c + 1]).
template <class BucketOf>
void sortIntoBuckets(std::int64_t n, std::int64_t buckets, int threads, const BucketOf& bucketOf,
  std::vector<std::int64_t>& start, std::vector<std::int64_t>& order)
{
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 65536)));
  std::vector<std::vector<std::int64_t>> next(static_cast<std::size_t>(slices),
    std::vector<std::int64_t>(static_cast<std::size_t>(buckets), 0));
  std::vector<std::int32_t> bucketOfPoint(static_cast<std::size_t>(n));
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
    {
      bucketOfPoint[i] = static_cast<std::int32_t>(bucketOf(i));
      ++next[slice][bucketOfPoint[i]];
    }
  });
  start.assign(static_cast<std::size_t>(buckets) + 1, 0);
  std::int64_t running = 0;
  for (std::size_t bucket = 0; bucket < static_cast<std::size_t>(buckets); ++bucket)
  {
    start[bucket] = running;
    for (auto& counts : next)
    {
      const std::int64_t c = counts[bucket];
      counts[bucket] = running;
      running += c;
    }
  }
  start[static_cast<std::size_t>(buckets)] = running;
  order.resize(static_cast<std::size_t>(n));
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
    {
      order[next[slice][bucketOfPoint[i]]++] = i;
    }
  });
}

/// The points grouped by their coordinate along one axis, in about equal buckets cut at
/// quantiles of a sample: a slab, or the reach of a box along the axis, is a run of buckets.
struct AxisBuckets
{
  int axis = 0;
  std::vector<double> cuts;          // bucket b holds the x in [cuts[b - 1], cuts[b])
  std::vector<std::int64_t> start;   // bucket b is order[start[b], start[b + 1])
  std::vector<std::int64_t> order;   // point indices, ascending within each bucket

  int buckets() const { return static_cast<int>(cuts.size()) + 1; }
  int bucketOf(double x) const
  {
    return static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), x) - cuts.begin());
  }
  /// Where bucket b begins along the axis (-inf for the first).
  double low(int b) const { return b == 0 ? -HUGE_VAL : cuts[static_cast<std::size_t>(b) - 1]; }
};

/// The points in buckets along `axis`: a counting sort by bucket, stable, on every thread.
AxisBuckets bucketAlong(const Points& p, int axis, int threads)
{
  const std::int64_t n = p.count;
  AxisBuckets b;
  b.axis = axis;
  std::vector<double> sample;
  const std::int64_t step = std::max<std::int64_t>(1, n / 262144);
  for (std::int64_t i = 0; i < n; i += step)
  {
    sample.push_back(coordinateOf(p, i, axis));
  }
  std::sort(sample.begin(), sample.end());
  const std::int64_t wanted = std::max<std::int64_t>(1, std::min<std::int64_t>(65536, n / 512));
  for (std::int64_t c = 1; c < wanted; ++c)
  {
    const double cut = sample[static_cast<std::size_t>(c * std::int64_t(sample.size()) / wanted)];
    if (b.cuts.empty() || cut > b.cuts.back())
    {
      b.cuts.push_back(cut);
    }
  }
  sortIntoBuckets(n, b.buckets(), threads, [&](std::int64_t i) { return b.bucketOf(coordinateOf(p, i, axis)); },
    b.start, b.order);
  return b;
}

/// The points in the cells of a coarse 3-D grid (about 64 points a cell on average), for the
/// boxes of the second pass: a box reads the cells it overlaps.
struct CellBuckets
{
  double lo[3] = { 0, 0, 0 };
  double inverseSize = 1.0;
  std::int64_t dims[3] = { 1, 1, 1 };
  std::vector<std::int64_t> start; // cell (x, y, z), x fastest, is order[start[c], start[c + 1])
  std::vector<std::int64_t> order;

  std::int64_t cellAlong(int a, double x) const
  {
    const double c = std::floor((x - lo[a]) * inverseSize);
    return c < 0.0 ? 0 : c >= double(dims[a]) ? dims[a] - 1 : static_cast<std::int64_t>(c);
  }
  /// Calls visit(begin, end) for each run of `order` that holds the cells a box overlaps: one
  /// run per row of cells along x.
  template <class Visit>
  void forRunsInBox(const double low[3], const double high[3], const Visit& visit) const
  {
    const std::int64_t x0 = cellAlong(0, low[0]), x1 = cellAlong(0, high[0]);
    for (std::int64_t z = cellAlong(2, low[2]); z <= cellAlong(2, high[2]); ++z)
    {
      for (std::int64_t y = cellAlong(1, low[1]); y <= cellAlong(1, high[1]); ++y)
      {
        const std::int64_t row = dims[0] * (y + dims[1] * z);
        visit(start[static_cast<std::size_t>(row + x0)], start[static_cast<std::size_t>(row + x1 + 1)]);
      }
    }
  }
};

CellBuckets cellsOf(const Points& p, const double lo[3], const double hi[3], int threads)
{
  CellBuckets c;
  const double cells = std::max(1.0, std::min(double(1 << 24), double(p.count) / 64.0));
  double volume = 1.0, widest = 0.0;
  for (int a = 0; a < 3; ++a)
  {
    widest = std::max(widest, hi[a] - lo[a]);
  }
  widest = widest > 0.0 ? widest : 1.0;
  for (int a = 0; a < 3; ++a)
  {
    volume *= std::max(hi[a] - lo[a], widest * 1e-3); // flat clouds: cells as if 1e-3 thick
  }
  const double size = std::cbrt(volume / cells);
  c.inverseSize = 1.0 / size;
  for (int a = 0; a < 3; ++a)
  {
    c.lo[a] = lo[a];
    c.dims[a] = std::max<std::int64_t>(1, std::min<std::int64_t>(1 << 12, static_cast<std::int64_t>(std::ceil((hi[a] - lo[a]) / size))));
  }
  sortIntoBuckets(p.count, c.dims[0] * c.dims[1] * c.dims[2], threads,
    [&](std::int64_t i) {
      return c.cellAlong(0, coordinateOf(p, i, 0)) +
        c.dims[0] * (c.cellAlong(1, coordinateOf(p, i, 1)) + c.dims[1] * c.cellAlong(2, coordinateOf(p, i, 2)));
    },
    c.start, c.order);
  return c;
}

/// One run of the k-th search over the points `order` names (its first `queries` the queries),
/// gathered in double: out[q] for them. Throws DoesNotFit (nothing written) when it is too large.
/// Its progress is reported as [base, base + span] of the caller's.
Report runGathered(const Request& r, const std::vector<std::int64_t>& order, std::int64_t queries, int k,
  const KthRun& run, std::vector<float>& out, double base, double span)
{
  if (static_cast<std::int64_t>(order.size()) > maxPointsPerRun)
  {
    throw DoesNotFit("NeighborGrid: Smoothing Length: " + std::to_string(order.size()) +
        " points exceed one run",
      0, 0);
  }
  std::vector<double> xyz(3 * order.size());
  parallelSlices(8, static_cast<std::int64_t>(order.size()), [&](int, std::int64_t begin, std::int64_t end) {
    for (std::int64_t j = begin; j < end; ++j)
    {
      for (int a = 0; a < 3; ++a)
      {
        xyz[3 * j + a] = coordinateOf(r.points, order[j], a);
      }
    }
  });
  Request part = r;
  part.points = Points(xyz.data(), static_cast<std::int64_t>(order.size()));
  if (r.progress)
  {
    part.progress = [&r, base, span](double fraction, const char* stage) {
      return r.progress(base + span * fraction, stage);
    };
  }
  out.assign(static_cast<std::size_t>(queries), 0.0f);
  return run(part, queries, k, out.data());
}

/// A query whose k-th over its slab alone may not be its k-th: `bound` is its k-th there, an
/// upper bound (float-rounded) on the true one.
struct OpenQuery
{
  std::int64_t point;
  double bound;
};

/// How far a float-rounded k-th distance d may lie below the double one, with room to spare.
double reachOf(double d)
{
  return d * (1.0 + 1e-6);
}

/// The first pass in slabs: each slab (a run of buckets) alone, its queries first. A query whose
/// k-th ball lies inside its slab along the axis has its k-th (every point within it is in the
/// slab); the others come back open. Thinner slabs where one does not fit. `largestRun` is the
/// most points a run took.
std::vector<OpenQuery> runSlabsAlone(const Request& r, const AxisBuckets& b, std::int64_t queries, int k,
  const KthRun& run, double oversubscribed, float* out, Report& report, std::int64_t& largestRun,
  std::vector<std::size_t>& openPerSlab)
{
  const std::int64_t n = r.points.count;
  const int axis = b.axis;
  // As many slabs as the whole run's shortfall asks for, with room; more where one still fails.
  for (int slabs = static_cast<int>(std::max(2.0, std::ceil(1.25 * oversubscribed)));;
       slabs = static_cast<int>(std::ceil(1.5 * slabs)))
  {
    if (slabs > b.buckets())
    {
      std::int64_t thickest = 0; // points of one coordinate along the axis share a bucket
      for (int bucket = 0; bucket < b.buckets(); ++bucket)
      {
        thickest = std::max(thickest, b.start[bucket + 1] - b.start[bucket]);
      }
      failSmoothingLength("the points do not fit one run, and slabs as thin as the points allow (up to " +
        std::to_string(thickest) + " points) do not fit either; raise the Memory Limit");
    }
    std::vector<OpenQuery> open;
    openPerSlab.clear();
    Report passed;
    passed.slabs = 0;
    largestRun = 0;
    std::vector<float> part;
    try
    {
      for (int s = 0; s < slabs; ++s)
      {
        // Slab s: the buckets from the one holding point n s / slabs of the order.
        auto bucketAt = [&](int cut) {
          return cut == slabs ? b.buckets()
                              : static_cast<int>(std::lower_bound(b.start.begin(), b.start.end() - 1, n * cut / slabs) -
                                  b.start.begin());
        };
        const int first = bucketAt(s), last = bucketAt(s + 1);
        openPerSlab.push_back(open.size());
        if (first == last)
        {
          continue;
        }
        const double low = b.low(first), high = last == b.buckets() ? HUGE_VAL : b.low(last);
        std::vector<std::int64_t> order;
        for (int pass = 0; pass < 2; ++pass) // the slab's queries, then its other points
        {
          for (std::int64_t j = b.start[first]; j < b.start[last]; ++j)
          {
            if ((b.order[j] < queries) == (pass == 0))
            {
              order.push_back(b.order[j]);
            }
          }
        }
        const std::int64_t own = std::count_if(order.begin(), order.end(), [&](std::int64_t i) { return i < queries; });
        if (own == 0)
        {
          continue;
        }
        if (static_cast<std::int64_t>(order.size()) <= k)
        {
          failSmoothingLength("a slab holds " + std::to_string(order.size()) + " points, k = " + std::to_string(k) +
            " or fewer; raise the Memory Limit");
        }
        mergeRun(passed, runGathered(r, order, own, k, run, part, 0.6 * s / slabs, 0.6 / slabs), "slabs: ");
        ++passed.slabs;
        largestRun = std::max(largestRun, static_cast<std::int64_t>(order.size()));
        for (std::int64_t q = 0; q < own; ++q)
        {
          const double x = coordinateOf(r.points, order[q], axis), u = reachOf(part[q]);
          const double slack = 1e-12 * (std::fabs(x) + u);
          if (x - u - slack > low && x + u + slack < high)
          {
            out[order[q]] = part[q];
          }
          else
          {
            open.push_back(OpenQuery{ order[q], part[q] });
          }
        }
      }
    }
    catch (const DoesNotFit&)
    {
      continue; // thinner slabs
    }
    mergeRun(report, passed, "");
    report.slabs = passed.slabs; // runs so far
    openPerSlab.push_back(open.size());
    return open;
  }
}

/// The box around every open query's ball in [begin, end): every point a query may need is in it.
void boxOfBalls(const Points& p, const std::vector<OpenQuery>& open, std::size_t begin, std::size_t end,
  double low[3], double high[3])
{
  for (int a = 0; a < 3; ++a)
  {
    low[a] = HUGE_VAL, high[a] = -HUGE_VAL;
  }
  for (std::size_t g = begin; g < end; ++g)
  {
    const double u = reachOf(open[g].bound);
    for (int a = 0; a < 3; ++a)
    {
      const double x = coordinateOf(p, open[g].point, a), slack = 1e-12 * (std::fabs(x) + u);
      low[a] = std::min(low[a], x - u - slack);
      high[a] = std::max(high[a], x + u + slack);
    }
  }
}

/// Calls take(slice, i) for every point in the box except those marked in isQuery, on every
/// thread (slices in order): only the cells the box overlaps are read.
template <class Take>
void forPointsInBox(const Points& p, const CellBuckets& cells, const double low[3], const double high[3],
  const std::vector<char>& isQuery, int slices, const Take& take)
{
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  cells.forRunsInBox(low, high, [&](std::int64_t begin, std::int64_t end) {
    if (begin < end)
    {
      runs.push_back({ begin, end });
    }
  });
  parallelSlices(slices, static_cast<std::int64_t>(runs.size()), [&](int slice, std::int64_t first, std::int64_t last) {
    for (std::int64_t run = first; run < last; ++run)
    {
      for (std::int64_t j = runs[run].first; j < runs[run].second; ++j)
      {
        const std::int64_t i = cells.order[j];
        bool inside = !isQuery[static_cast<std::size_t>(i)];
        for (int a = 0; a < 3 && inside; ++a)
        {
          const double x = coordinateOf(p, i, a);
          inside = x >= low[a] && x <= high[a];
        }
        if (inside)
        {
          take(slice, i);
        }
      }
    }
  });
}

/// The points in the box (but the marked queries), when at most `most`; else nothing, and false.
bool pointsInBox(const Points& p, const CellBuckets& b, const double low[3], const double high[3],
  const std::vector<char>& isQuery, int threads, std::int64_t most, std::vector<std::int64_t>& points)
{
  const int slices = std::max(1, threads);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(slices), 0);
  forPointsInBox(p, b, low, high, isQuery, slices, [&](int slice, std::int64_t) { ++counts[slice]; });
  std::vector<std::int64_t> at(static_cast<std::size_t>(slices) + 1, 0);
  for (int slice = 0; slice < slices; ++slice)
  {
    at[slice + 1] = at[slice] + counts[slice];
  }
  points.clear();
  if (at[slices] > most)
  {
    return false;
  }
  points.resize(static_cast<std::size_t>(at[slices]));
  forPointsInBox(p, b, low, high, isQuery, slices, [&](int slice, std::int64_t i) { points[at[slice]++] = i; });
  return true;
}

/// The support radius of open query q on the host, exact: the k-th smallest exact squared
/// distance (the backends' formula) over the points in a cube around it that grows from a
/// sixteenth of its bound, doubling, until the k-th lies within the cube's half-width (then
/// every point that near is in the cube) or the cube holds the bound's ball. A far query's
/// bound from a thin slab can be many times its k-th: the cube reads the points near the
/// k-th, not those near the bound.
float kthOnHost(const Points& p, const CellBuckets& cells, const OpenQuery& q, int k)
{
  const double x[3] = { coordinateOf(p, q.point, 0), coordinateOf(p, q.point, 1), coordinateOf(p, q.point, 2) };
  const double reach = reachOf(q.bound);
  std::vector<double> squared;
  for (double half = reach / 16.0;; half *= 2.0)
  {
    const bool whole = half >= reach;
    half = std::min(half, reach);
    double low[3], high[3];
    for (int a = 0; a < 3; ++a)
    {
      const double slack = 1e-12 * (std::fabs(x[a]) + half);
      low[a] = x[a] - half - slack, high[a] = x[a] + half + slack;
    }
    squared.clear();
    cells.forRunsInBox(low, high, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t j = first; j < last; ++j)
      {
        const std::int64_t i = cells.order[j];
        const double y[3] = { coordinateOf(p, i, 0), coordinateOf(p, i, 1), coordinateOf(p, i, 2) };
        if (i != q.point && y[0] >= low[0] && y[0] <= high[0] && y[1] >= low[1] && y[1] <= high[1] &&
          y[2] >= low[2] && y[2] <= high[2])
        {
          squared.push_back(exactSquaredDistance(x[0], x[1], x[2], y[0], y[1], y[2]));
        }
      }
    });
    if (static_cast<int>(squared.size()) >= k)
    {
      std::nth_element(squared.begin(), squared.begin() + (k - 1), squared.end());
      const double kth = squared[static_cast<std::size_t>(k - 1)];
      if (whole || kth * (1.0 + 1e-9) < half * half)
      {
        return supportRadiusOf(kth);
      }
    }
    if (whole)
    {
      failSmoothingLength("internal: a point's bound holds fewer than k points"); // the first pass saw k
    }
  }
}

/// Halves [begin, end) of the open queries: at the median bound where the bounds differ by more
/// than 4x (so a few wide balls do not widen every box), else at the median of the longest side
/// of their box (a k-d split). Returns the middle.
std::size_t splitAtMedian(const Points& p, std::vector<OpenQuery>& open, std::size_t begin, std::size_t end)
{
  const std::size_t middle = begin + (end - begin) / 2;
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL }, hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  double smallest = HUGE_VAL, largest = 0.0;
  for (std::size_t g = begin; g < end; ++g)
  {
    smallest = std::min(smallest, open[g].bound), largest = std::max(largest, open[g].bound);
  }
  if (largest > 4.0 * smallest)
  {
    std::nth_element(open.begin() + begin, open.begin() + middle, open.begin() + end,
      [](const OpenQuery& x, const OpenQuery& y) { return x.bound < y.bound; });
    return middle;
  }
  for (std::size_t g = begin; g < end; ++g)
  {
    for (int a = 0; a < 3; ++a)
    {
      const double x = coordinateOf(p, open[g].point, a);
      lo[a] = std::min(lo[a], x), hi[a] = std::max(hi[a], x);
    }
  }
  int side = 0;
  for (int a = 1; a < 3; ++a)
  {
    side = hi[a] - lo[a] > hi[side] - lo[side] ? a : side;
  }
  std::nth_element(open.begin() + begin, open.begin() + middle, open.begin() + end,
    [&](const OpenQuery& x, const OpenQuery& y) { return coordinateOf(p, x.point, side) < coordinateOf(p, y.point, side); });
  return middle;
}

/// Groups of at most this many open queries find their k-th on the host (kthOnHost).
constexpr std::int64_t hostQueries = 32;

/// The second pass: the open queries again, over every point in the box around their balls,
/// a slab's at a time, halved (splitAtMedian) until a group's box holds no more points than the
/// largest run of the first pass and fits, or the group is small enough for the host.
void runOpenQueries(const Request& r, const CellBuckets& b, std::vector<OpenQuery>& open,
  const std::vector<std::size_t>& openPerSlab, int k, const KthRun& run, float* out, std::int64_t largestRun,
  int threads, Report& report)
{
  const Points& p = r.points;
  std::vector<char> isQuery(static_cast<std::size_t>(p.count), 0);
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  for (std::size_t s = openPerSlab.size() - 1; s-- > 0;)
  {
    groups.push_back({ openPerSlab[s], openPerSlab[s + 1] });
  }
  std::vector<std::int64_t> order;
  std::vector<float> part;
  std::size_t done = 0;
  double hostMs = 0.0;
  while (!groups.empty())
  {
    const auto [begin, end] = groups.back();
    groups.pop_back();
    if (begin == end)
    {
      continue;
    }
    const std::int64_t own = static_cast<std::int64_t>(end - begin);
    bool ran = false;
    if (own <= hostQueries)
    {
      // A few queries (far ones, whose boxes can hold more than a run) cost less on the host.
      const Timer hostTimer;
      part.resize(static_cast<std::size_t>(own));
      parallelSlices(threads, own, [&](int, std::int64_t first, std::int64_t last) {
        for (std::int64_t g = first; g < last; ++g)
        {
          part[g] = kthOnHost(p, b, open[begin + g], k);
        }
      });
      hostMs += hostTimer.milliseconds();
      ran = true;
    }
    else
    {
      // More run on the backend where their box fits the largest run of the first pass.
      double low[3], high[3];
      boxOfBalls(p, open, begin, end, low, high);
      for (std::size_t g = begin; g < end; ++g)
      {
        isQuery[static_cast<std::size_t>(open[g].point)] = 1;
      }
      std::vector<std::int64_t> sources;
      if (pointsInBox(p, b, low, high, isQuery, threads, largestRun - own, sources))
      {
        order.assign(sources.size() + static_cast<std::size_t>(own), 0);
        for (std::size_t g = begin; g < end; ++g)
        {
          order[g - begin] = open[g].point;
        }
        std::copy(sources.begin(), sources.end(), order.begin() + own);
        try
        {
          const double base = 0.6 + 0.4 * double(done) / double(open.size());
          mergeRun(report, runGathered(r, order, own, k, run, part, base, 0.4 * double(own) / double(open.size())),
            "slabs: ");
          ++report.slabs;
          report.slabHaloPoints += static_cast<std::int64_t>(sources.size()); // each ran in its slab already
          ran = true;
        }
        catch (const DoesNotFit&)
        {
        }
      }
      for (std::size_t g = begin; g < end; ++g)
      {
        isQuery[static_cast<std::size_t>(open[g].point)] = 0;
      }
    }
    if (ran)
    {
      for (std::size_t g = begin; g < end; ++g)
      {
        out[open[g].point] = part[g - begin];
      }
      done += end - begin;
      continue;
    }
    const std::size_t middle = splitAtMedian(p, open, begin, end);
    groups.push_back({ middle, end });
    groups.push_back({ begin, middle });
  }
  if (hostMs > 0.0)
  {
    addStage(report, "slabs: k-th of far points on the host", hostMs);
  }
}

} // namespace

/// Smoothing Length of the first `queries` points over all of them, in slabs along the longest
/// axis, for points that do not fit one run (Memory Limit, GPU memory, 2^31 - 2 points). First
/// each slab alone: a point's k-th over a subset bounds its k-th from above, and is its k-th
/// where that ball lies inside the slab. The others run again over every point in the box
/// around their bound's ball, in groups small enough to fit.
Report runKthInSlabs(const Request& r, std::int64_t queries, int k, float* out, int threads, const KthRun& run,
  double oversubscribed)
{
  const Timer timer;
  double lo[3], hi[3];
  findBoundsOnHost(r.points, threads, lo, hi);
  int axis = 0;
  for (int a = 1; a < 3; ++a)
  {
    axis = hi[a] - lo[a] > hi[axis] - lo[axis] ? a : axis;
  }
  const AxisBuckets buckets = bucketAlong(r.points, axis, threads);
  Report report;
  std::int64_t largestRun = 0;
  std::vector<std::size_t> openPerSlab;
  std::vector<OpenQuery> open =
    runSlabsAlone(r, buckets, queries, k, run, oversubscribed, out, report, largestRun, openPerSlab);
  const CellBuckets cells = cellsOf(r.points, lo, hi, threads);
  runOpenQueries(r, cells, open, openPerSlab, k, run, out, largestRun, threads, report);
  addStage(report, "smoothing length in slabs", timer.milliseconds());
  return report;
}

} // namespace detail
} // namespace neighborgrid
