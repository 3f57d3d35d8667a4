// Smoothing Length (Operation::SmoothingLength) as a layer over the backends' k-th neighbor search
// (KthNeighbor.h): validation, and periodic boxes through images.
#pragma once

#include "Periodic.h"

#include <functional>
#include <string>

namespace neighborgrid
{
namespace detail
{

/// One run of the backend's k-th neighbor search: out[q] for the first `queries` of
/// `request.points`, over all of them.
using KthRun = std::function<Report(const Request& request, std::int64_t queries, int k, float* out)>;

/// Throws Error for a Smoothing Length request that cannot run, before any output is written.
void validateSmoothingLength(const Request& request);

/// Throws Error("NeighborGrid: Smoothing Length: " + message).
[[noreturn]] void failSmoothingLength(const std::string& message);

/// Adds the stages of one run to `into` under a prefix, with what it says about the backend.
void mergeRun(Report& into, const Report& from, const std::string& prefix);

/// Smoothing Length of the first `queries` points over all of them, in slabs, for points that do
/// not fit one run; `oversubscribed` is how many times one run's memory they need (a first guess
/// of the slabs). SmoothingLengthSlabs.cxx.
Report runKthInSlabs(const Request& request, std::int64_t queries, int k, float* out, int threads, const KthRun& run,
  double oversubscribed);

/// Runs a validated Smoothing Length request.
Report runSmoothingLength(const Request& request, int threads, const KthRun& run, PeriodicScratch& scratch);

} // namespace detail
} // namespace neighborgrid
