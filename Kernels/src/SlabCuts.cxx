// Slab cuts from a histogram (SlabCuts.h).
#include "SlabCuts.h"

#include <algorithm>
#include <cmath>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// The histogram's prefix sums and the bound on a slab's points with its halo.
class SlabBound
{
public:
  SlabBound(const AxisHistogram& histogram, double halo) : prefix_(histogram.counts.size() + 1, 0)
  {
    for (std::size_t b = 0; b < histogram.counts.size(); ++b)
    {
      prefix_[b + 1] = prefix_[b] + histogram.counts[b];
    }
    const double binsOfHalo = std::ceil(halo / histogram.width);
    haloBins_ = binsOfHalo < double(bins()) ? static_cast<std::int64_t>(binsOfHalo) : bins();
  }
  std::int64_t bins() const { return static_cast<std::int64_t>(prefix_.size()) - 1; }
  std::uint64_t total() const { return prefix_.back(); }
  /// Points up to edge e (in bins 0 .. e - 1).
  std::uint64_t below(std::int64_t e) const { return prefix_[std::size_t(e)]; }
  /// The points of the slab that owns bins [a, b) (a = 0: no lower cut, b = bins: no upper one)
  /// and of its halo, from above: the bins within the halo's width, and one more each way for a
  /// point binned beside its bin by rounding.
  std::uint64_t most(std::int64_t a, std::int64_t b) const
  {
    const std::int64_t from = a == 0 ? 0 : std::max<std::int64_t>(0, a - haloBins_ - 1);
    const std::int64_t to = b == bins() ? bins() : std::min(bins(), b + haloBins_ + 2);
    return prefix_[std::size_t(to)] - prefix_[std::size_t(from)];
  }

private:
  std::vector<std::uint64_t> prefix_;
  std::int64_t haloBins_ = 0;
};

/// `slabs` slabs cut at the edges where the points divide evenly; false where two cuts fall on
/// one edge or a slab holds more than `capacity`.
bool evenCuts(const SlabBound& bound, const AxisHistogram& histogram, int slabs, std::uint64_t capacity, SlabCuts& out)
{
  std::vector<std::int64_t> edges{ 0 };
  for (int k = 1; k < slabs; ++k)
  {
    const double target = double(bound.total()) * k / slabs;
    std::int64_t lo = 1, hi = bound.bins() - 1; // the first edge with `target` points below it
    while (lo < hi)
    {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (double(bound.below(mid)) >= target)
      {
        hi = mid;
      }
      else
      {
        lo = mid + 1;
      }
    }
    if (lo <= edges.back())
    {
      return false;
    }
    edges.push_back(lo);
  }
  edges.push_back(bound.bins());
  SlabCuts cuts;
  for (int s = 0; s < slabs; ++s)
  {
    cuts.most.push_back(bound.most(edges[s], edges[s + 1]));
    if (cuts.most.back() > capacity)
    {
      return false;
    }
    if (s > 0)
    {
      cuts.cuts.push_back(histogram.edge(edges[s]));
    }
  }
  out = cuts;
  return true;
}

/// Slabs as wide as `capacity` allows, from the lowest bin up: for clouds whose dense bins
/// leave no even cut.
bool greedyCuts(const SlabBound& bound, const AxisHistogram& histogram, std::uint64_t capacity, int maxSlabs, SlabCuts& out)
{
  SlabCuts cuts;
  std::int64_t a = 0;
  while (a < bound.bins())
  {
    std::int64_t lo = a, hi = bound.bins(); // the last edge b > a with most(a, b) <= capacity
    while (lo < hi)
    {
      const std::int64_t mid = hi - (hi - lo) / 2;
      if (bound.most(a, mid) <= capacity)
      {
        lo = mid;
      }
      else
      {
        hi = mid - 1;
      }
    }
    if (lo == a || cuts.slabs() > maxSlabs || (lo == bound.bins() && cuts.cuts.empty()))
    {
      return false; // one bin is too full, too many slabs, or one slab (evenCuts takes that case)
    }
    cuts.most.push_back(bound.most(a, lo));
    if (lo < bound.bins())
    {
      cuts.cuts.push_back(histogram.edge(lo));
    }
    a = lo;
  }
  if (cuts.slabs() > maxSlabs)
  {
    return false;
  }
  out = cuts;
  return true;
}

} // namespace

SlabCuts cutSlabs(const AxisHistogram& histogram, double halo, std::uint64_t capacity, int maxSlabs)
{
  const SlabBound bound(histogram, halo);
  if (bound.bins() < 2 || capacity == 0)
  {
    return {};
  }
  SlabCuts cuts;
  const int fewest = static_cast<int>(std::max<std::uint64_t>(2, (bound.total() + capacity - 1) / capacity));
  for (int slabs = fewest; slabs <= std::min<std::int64_t>(maxSlabs, bound.bins()); ++slabs)
  {
    if (evenCuts(bound, histogram, slabs, capacity, cuts))
    {
      return cuts;
    }
  }
  if (greedyCuts(bound, histogram, capacity, maxSlabs, cuts))
  {
    return cuts;
  }
  return {};
}

} // namespace detail
} // namespace neighborgrid
