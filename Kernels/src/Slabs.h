// Requests larger than one run of a backend: more points than a run indexes (2^31 - 2), or more
// memory than the device has free or the engine's memory limit allows. Space is cut into slabs
// (boxes, cut again where one still does not fit), each run with its halo, the points within R of
// it (with per-particle radii: within the largest radius), and only the slab's own results kept,
// so every result is that of one pass over all points.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

namespace neighborgrid
{
namespace detail
{

/// Whether the request has particles of its own (a source, or a grid of queries) apart from its
/// points, which are then the queries.
inline bool hasSeparateSource(const Request& r)
{
  return r.source.xyz || r.source.count || !r.queryGrid.empty();
}

/// Queries of a request with a separate source (points or grid points); 0 without one.
inline std::int64_t queryCount(const Request& r)
{
  return !hasSeparateSource(r) ? 0 : r.queryGrid.empty() ? r.points.count : r.queryGrid.count();
}

/// Points in one run of a backend (int32 indices on the device and in the CPU's sort).
constexpr std::int64_t maxPointsPerRun = std::numeric_limits<std::int32_t>::max() - 1;

/// How far outside a slab's face at `face` its halo reaches: R, and beyond it the few units in
/// the last place by which the double pair test may accept a pair.
double haloMargin(double face, double radius);

/// The points a run takes before the slab layer cuts a request: maxPointsPerRun, or fewer where
/// the testing knob NEIGHBORGRID_TEST_POINTS_PER_RUN says so (a request of a million points then
/// takes the paths of billions).
std::int64_t pointsPerRun();

/// A backend's memory check failed, before any output was written: the slab layer cuts the
/// request smaller; a caller that cannot sees an ordinary Error with this message.
class DoesNotFit : public Error
{
public:
  DoesNotFit(const std::string& message, std::int64_t needed, std::int64_t available)
    : Error(message), needed(needed), available(available)
  {
  }
  std::int64_t needed;
  std::int64_t available;
};

struct SlabBackend
{
  int threads = 1;
  /// One run of the backend: a validated request of at most maxPointsPerRun particles and queries.
  std::function<Report(const Request&)> runOnce;
  /// The bytes one run of `request` would need, its particles' bounds given.
  std::function<std::int64_t(const Request&, const double lo[3], const double hi[3])> bytesNeeded;
  /// The bytes one run can have (the device's free memory or the engine's limit).
  std::function<std::int64_t()> bytesAvailable;
  /// Optional: a request of more than pointsPerRun() particles in slabs the backend cuts where
  /// it holds every point (BackendImplementation::runResidentSlabs); false where it cannot.
  std::function<bool(const Request&, Report&)> runResident;
};

/// Runs a validated open-box request: in one run of the backend where it fits, else in slabs
/// (as many as the backend's estimate asks for, more where one still does not fit). SPH
/// smoothing in slabs runs as a density pass and a smoothing pass with the particle volumes.
/// Outputs stay in input order; the inputs are not modified. Progress goes to the request's
/// callback as progressBase + progressSpan * (the fraction done).
Report runFitting(const Request& request, const SlabBackend& backend, double progressBase = 0.0,
  double progressSpan = 1.0);

} // namespace detail
} // namespace neighborgrid
