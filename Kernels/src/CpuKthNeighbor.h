// Smoothing Length on the CPU backend (KthNeighbor.h).
#pragma once

#include "Backend.h"

namespace neighborgrid
{
namespace detail
{

/// out[q], for the first `queries` of the n points of `points` (bounds lo, hi): the distance to
/// its k-th nearest other point among all n, exact (KthNeighbor.h). Needs n > k. Returns the
/// levels searched.
int kthNeighborDistancesOnHost(const Points& points, std::int64_t queries, int k, const double lo[3],
  const double hi[3], int threads, const ProgressReporter& progress, float* out);

} // namespace detail
} // namespace neighborgrid
