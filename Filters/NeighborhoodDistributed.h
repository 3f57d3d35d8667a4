// Exact neighborhoods when the particles are spread over the ranks of a vtkMultiProcessController
// (pvbatch or pvserver over MPI), and when the input carries ghost points (vtkGhostType).
//
// Every rank sends the others the particles they need: a rank's *region* is the bounding box of
// its particles and of its query points (a probe's points, a volume's grid), and every particle
// it owns within R of another rank's region (periodic images included) travels to that rank as
// a halo point, with its mass and the arrays to smooth. The engine then runs on the rank's own
// particles plus its halo, and keeps the results of its own particles and queries, so each of
// them sees every particle within R on any rank: the serial result. For SPH smoothing the
// density of a halo point comes from the rank that owns it (a second, smaller exchange), since
// the receiving rank sees only part of that point's neighbors.
//
// How much travels: each owned particle once to each rank whose region it lies within R of. For
// a spatial partition (RedistributeDataSet) that is the layer of width R along the boundaries
// between ranks; for an arbitrary partition whose ranks' regions overlap, most particles travel
// to most ranks (the rank needs them: they are within R of its points). Per halo point: three
// doubles, the mass, the smoothed components (floats), and for SPH one more float.
//
// Ghost points of the input (vtkGhostType with DUPLICATEPOINT) are copies of points other ranks
// own: they are left out of the particles (never counted twice) and get the result of a query at
// their position, which is their owner's result (the owner's copy is a neighbor at distance 0,
// not counted in Neighbor Count, as a point is not its own neighbor).
//
// Per-particle radii (Request::radii): the halo is as wide as the largest radius of any rank, and
// the radii travel with it (one float per halo point). The gradient, like SPH smoothing, takes
// the density of every halo point from its owner (Request::particleVolumes). Not supported yet
// (an Error on every rank): radii or the gradient with ghost points (vtkGhostType) in the input.
//
// Every rank must call this the same number of times (it is collective); a rank that fails
// makes every rank fail with a message that names it, rather than leaving the others waiting.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <cstdint>
#include <string>

class vtkMultiProcessController;

namespace neighborgrid_filters
{

struct DistributedSummary
{
  int ranks = 1;
  int rank = 0;
  std::int64_t haloReceived = 0; // particles received from other ranks
  std::int64_t haloSent = 0;     // particle copies sent to other ranks
  std::int64_t ghostPoints = 0;  // input points flagged DUPLICATEPOINT (results by query)
  int cudaDevice = -1;           // the device this rank took (node-local rank modulo devices)
  // This rank's own work around the exchange, waits for other ranks excluded: ownership, region,
  // halo choice, the extended set (on all cores).
  double prologueMilliseconds = 0.0;
  double exchangeMilliseconds = 0.0;
};

/// Runs `request` (this rank's particles, queries and outputs, as for a serial run) so that the
/// results are those of one serial run over the particles of all ranks. `ghostFlags` (one per
/// particle, vtkGhostType, or null) marks the particles that are copies. `controller` may be
/// null or have one process. Throws neighborgrid::Error (and Aborted) as Engine::run does;
/// when another rank failed, the Error names that rank. With several ranks, the engine takes the
/// CUDA device of this rank's node-local rank (modulo the node's devices) on its first run.
/// `queriesAreParticles`: results at the particles (request.points), or at separate queries
/// (request.source holds the particles; on some ranks either may be empty).
neighborgrid::Report RunDistributed(neighborgrid::Engine& engine, const neighborgrid::Request& request,
  bool queriesAreParticles, const unsigned char* ghostFlags, vtkMultiProcessController* controller,
  DistributedSummary& summary);

/// Tells the other ranks that this rank failed before it could call RunDistributed (bad input
/// on this rank only), so that they fail too instead of waiting. Collective, like RunDistributed:
/// call it instead of RunDistributed.
void ReportFailureToOtherRanks(vtkMultiProcessController* controller, const std::string& message);

} // namespace neighborgrid_filters
