// Per-particle support radii (Request::radii) and the SPH gradient (Operation::Gradient), on top
// of every backend and method.
//
// Levels: particles are binned by radius into levels k = 0, 1, ... of radii in
// (R_min 2^(k-1), R_min 2^k] (level 0 holds R_min). Each search runs on a grid of cells of its
// level's largest radius, built by the method as for a fixed radius, and decides every pair by its
// own radius (RadiusOperations.h):
//   Gather:    per level, its particles as queries against all particles: r <= R_i.
//   Scatter:   per level, all points as queries against its particles:    r <= R_j.
//   Symmetric: the Gather searches, then the Scatter searches taking only pairs with r <= R_j and
//              not r <= R_i, so every pair within max(R_i, R_j) is taken once.
// A query's candidates then lie in cells at most twice its radius (Gather) or twice the level's
// radii (Scatter): the work stays proportional to the neighbors, and no grid is finer than a
// level needs, however far the radii range. A range of 100x takes 8 levels.
//
// Sums that span several searches (a query in Scatter meets every level) are added in double on
// the host, and the results are formed once all searches are done, so no output is written
// before every search has succeeded. Shepard smoothing is sum_j W f_j / sum_j W of such sums; SPH
// smoothing and the gradient first compute the density over every search, then m_j / rho_j.
// A Gradient with a fixed radius runs here too, as one search.
//
// Where the backend has a search of its own for the whole rule (the CUDA backend's radius tree,
// RadiusTree.h), every sum is one search over all particles instead: no levels, no host sums.
#pragma once

#include "RadiusOperations.h"

#include <functional>

namespace neighborgrid
{
namespace detail
{

/// Whether a request runs through this layer: per-particle radii, a gradient, or the Radius Tree
/// asked for by name.
inline bool usesRadiusLayer(const Request& r)
{
  return r.radii != nullptr || r.operation == Operation::Gradient || r.method == Method::RadiusTree;
}

/// Runs one search: the request's points are the queries, its source the particles, its radius
/// the largest the search needs, its masses the particle weights w_j; the pass says what to sum.
using RadiusSearch = std::function<Report(const Request&, const RadiusPass&)>;

/// The largest of the request's radii (Request::radius without radii); an Error naming the first
/// radius that is not finite and in [1e-150, 1e150].
double largestRadiusOf(const Request& request, int threads);

/// Runs a validated request with usesRadiusLayer (masses and query points already checked).
/// wholeRule: the backend decides every pair by the mode's whole rule in one search per sum
/// (RadiusPass::wholeRule; the particles must be their own queries), so there are no levels.
Report runWithRadii(const Request& request, int threads, const RadiusSearch& search, bool wholeRule = false);

} // namespace detail
} // namespace neighborgrid
