// Smoothing Length (Operation::SmoothingLength) as a layer over the backends' k-th neighbor search
// (KthNeighbor.h): validation, and periodic boxes through images.
#pragma once

#include "Periodic.h"

#include <functional>

namespace neighborgrid
{
namespace detail
{

/// One run of the backend's k-th neighbor search: out[q] for the first `queries` of
/// `request.points`, over all of them.
using KthRun = std::function<Report(const Request& request, std::int64_t queries, int k, float* out)>;

/// Throws Error for a Smoothing Length request that cannot run, before any output is written.
void validateSmoothingLength(const Request& request);

/// Runs a validated Smoothing Length request.
Report runSmoothingLength(const Request& request, int threads, const KthRun& run, PeriodicScratch& scratch);

} // namespace detail
} // namespace neighborgrid
