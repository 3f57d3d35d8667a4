#include "SmoothingLength.h"

#include "Backend.h"
#include "Parallel.h"
#include "Slabs.h"
#include "Timer.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace neighborgrid
{
namespace detail
{

[[noreturn]] void failSmoothingLength(const std::string& message)
{
  throw Error("NeighborGrid: Smoothing Length: " + message);
}

void mergeRun(Report& into, const Report& from, const std::string& prefix)
{
  for (const StageTime& s : from.stages)
  {
    addStage(into, prefix + s.stage, s.milliseconds);
  }
  into.backend = from.backend;
  into.method = from.method;
  into.device = from.device;
  into.backendReason = from.backendReason;
  into.extraDeviceBytes = std::max(into.extraDeviceBytes, from.extraDeviceBytes);
  into.radiusLevels = std::max(into.radiusLevels, from.radiusLevels);
  into.slabHaloPoints += from.slabHaloPoints;
}

namespace
{

/// The periodic box: the k-th nearest over every image. First over the wrapped particles (and,
/// with k or fewer of them, enough images to have k others), which bounds each point's k-th
/// distance from above; then again for the points whose bound reaches past a face of the box,
/// over the particles and their images within the largest such bound, those points put first as
/// the queries.
Report runPeriodicSmoothingLength(
  const Request& r, std::int64_t queries, int threads, const KthRun& run, PeriodicScratch& scratch)
{
  const std::int64_t n = r.points.count;
  const int k = r.neighborTarget;
  const Timer timer;
  double firstRadius = 0.0;
  std::int64_t total = wrappedWithImages(r, firstRadius, threads, scratch);
  while (total - 1 < k)
  {
    double widest = 0.0;
    for (int a = 0; a < 3; ++a)
    {
      widest = std::max(widest, r.periodic[a] ? r.boxLengths[a] : 0.0);
    }
    firstRadius = std::max(2.0 * firstRadius, widest);
    total = wrappedWithImages(r, firstRadius, threads, scratch);
  }
  Report report;
  addStage(report, "periodic images", timer.milliseconds());
  Request first = r;
  first.points = Points(scratch.source.data(), total);
  for (int a = 0; a < 3; ++a)
  {
    first.periodic[a] = false;
  }
  std::vector<float> bound(static_cast<std::size_t>(queries));
  const Report bounding = run(first, queries, k, bound.data());
  mergeRun(report, bounding, "bound: ");
  report.slabs = bounding.slabs;

  // The points whose bound reaches past a periodic face further than the images made so far, and
  // the largest such bound (per slice, on every thread).
  const Timer selecting;
  const std::vector<double> wrapped(scratch.source.begin(), scratch.source.begin() + 3 * n);
  const int slices = std::max(1, threads);
  std::vector<std::vector<std::int64_t>> nearPerSlice(static_cast<std::size_t>(slices));
  std::vector<double> reachPerSlice(static_cast<std::size_t>(slices), firstRadius);
  parallelSlices(slices, queries, [&](int slice, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
    {
      const double u = double(bound[i]) * (1.0 + 1e-6);
      bool touches = false;
      for (int a = 0; a < 3 && !touches; ++a)
      {
        const double x = wrapped[3 * i + a];
        touches = r.periodic[a] && (x - u < r.boxOrigin[a] || x + u > r.boxOrigin[a] + r.boxLengths[a]);
      }
      if (touches && u > firstRadius)
      {
        nearPerSlice[slice].push_back(i);
        reachPerSlice[slice] = std::max(reachPerSlice[slice], u);
      }
      else
      {
        r.supportRadius[i] = bound[i];
      }
    }
  });
  std::vector<std::int64_t> near;
  double reach = firstRadius;
  for (int slice = 0; slice < slices; ++slice)
  {
    near.insert(near.end(), nearPerSlice[slice].begin(), nearPerSlice[slice].end());
    reach = std::max(reach, reachPerSlice[slice]);
  }
  double selectMs = selecting.milliseconds();
  if (near.empty())
  {
    addStage(report, "periodic images", selectMs);
    report.periodicImages = total - n;
    return report;
  }
  const Timer imaging;
  total = wrappedWithImages(r, reach, threads, scratch);
  // The wrapped particles reordered, those near the faces first (the queries), then their images.
  const std::int64_t nearCount = static_cast<std::int64_t>(near.size());
  std::vector<char> isNear(static_cast<std::size_t>(n), 0);
  for (std::int64_t i : near)
  {
    isNear[static_cast<std::size_t>(i)] = 1;
  }
  std::vector<double> points(static_cast<std::size_t>(3 * total));
  std::int64_t next = nearCount;
  for (std::int64_t i = 0, q = 0; i < n; ++i)
  {
    const std::int64_t to = isNear[static_cast<std::size_t>(i)] ? q++ : next++;
    std::copy(wrapped.begin() + 3 * i, wrapped.begin() + 3 * i + 3, points.begin() + 3 * to);
  }
  std::copy(scratch.source.begin() + 3 * n, scratch.source.begin() + 3 * total, points.begin() + 3 * n);
  addStage(report, "periodic images", selectMs + imaging.milliseconds());
  Request second = first;
  second.points = Points(points.data(), total);
  std::vector<float> exact(static_cast<std::size_t>(nearCount));
  const Report nearFaces = run(second, nearCount, k, exact.data());
  mergeRun(report, nearFaces, "near the faces: ");
  report.slabs = std::max(report.slabs, nearFaces.slabs);
  for (std::int64_t q = 0; q < nearCount; ++q)
  {
    r.supportRadius[near[q]] = exact[q];
  }
  report.periodicImages = total - n;
  return report;
}

} // namespace

void validateSmoothingLength(const Request& r)
{
  if (hasSeparateSource(r))
  {
    failSmoothingLength("it is computed at the particles (the distance to a particle's k-th nearest other "
                        "particle): give the points only, without a source or a query grid");
  }
  if (r.points.count <= 0 || !r.points.xyz)
  {
    failSmoothingLength("the input has no points");
  }
  if (r.radii)
  {
    failSmoothingLength("it makes per-particle radii; it takes none (Request::radii must be null)");
  }
  if (!r.supportRadius)
  {
    failSmoothingLength("it needs Request::supportRadius (a float array of one value per point)");
  }
  if (r.valid)
  {
    failSmoothingLength("Request::valid is for queries with a separate source");
  }
  if (r.neighborTarget < 1 || r.neighborTarget > maxNeighborTarget)
  {
    failSmoothingLength("the neighbor target k must lie in [1, " + std::to_string(maxNeighborTarget) + "] (got " +
      std::to_string(r.neighborTarget) + ")");
  }
  if (r.method != Method::Auto)
  {
    failSmoothingLength(std::string("it has one search per backend; leave the method at Auto (got ") +
      toString(r.method) + ")");
  }
  const bool periodic = r.periodic[0] || r.periodic[1] || r.periodic[2];
  if (!periodic && r.points.count <= r.neighborTarget)
  {
    std::ostringstream s;
    s << "each point needs k = " << r.neighborTarget << " other points, but the input has " << r.points.count
      << " points in all; lower the neighbor target";
    failSmoothingLength(s.str());
  }
  if (r.smoothingLengthQueries < -1 || r.smoothingLengthQueries > r.points.count)
  {
    failSmoothingLength("smoothingLengthQueries must be -1 (every point) or in [0, " +
      std::to_string(r.points.count) + "], the number of points (got " + std::to_string(r.smoothingLengthQueries) + ")");
  }
}

Report runSmoothingLength(const Request& r, int threads, const KthRun& run, PeriodicScratch& scratch)
{
  const std::int64_t queries = r.smoothingLengthQueries < 0 ? r.points.count : r.smoothingLengthQueries;
  if (queries == 0)
  {
    return Report();
  }
  // Points that do not fit one run go in slabs, whoever calls (the periodic layer too).
  const KthRun fitting = [&](const Request& points, std::int64_t q, int k, float* out) {
    double oversubscribed = double(points.points.count) / double(maxPointsPerRun);
    if (points.points.count <= maxPointsPerRun)
    {
      try
      {
        return run(points, q, k, out);
      }
      catch (const DoesNotFit& tooLarge)
      {
        oversubscribed = tooLarge.available > 0 ? double(tooLarge.needed) / double(tooLarge.available) : 2.0;
      }
    }
    return runKthInSlabs(points, q, k, out, threads, run, oversubscribed);
  };
  if (r.periodic[0] || r.periodic[1] || r.periodic[2])
  {
    return runPeriodicSmoothingLength(r, queries, threads, fitting, scratch);
  }
  return fitting(r, queries, r.neighborTarget, r.supportRadius);
}

} // namespace detail
} // namespace neighborgrid
