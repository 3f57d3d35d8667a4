// The order of passes for each operation, shared by the CPU and CUDA backends. An executor
// provides the primitives (where buffers live, how a search pass runs); this decides what runs.
#pragma once

#include "Backend.h"
#include "Operations.h"

#include <algorithm>
#include <type_traits>

namespace neighborgrid
{
namespace detail
{

/// Executor requirements:
///   KernelParams kernel()                                the kernel in the method's frame units
///   void setWeights(WeightMode)                          particle weight w: 1 or the mass
///   void divideWeightsByDensity(const float* ordered)    w = m / rho (SPH smoothing)
///   std::int32_t* countOutput(); float* densityOutput() (null when not wanted)
///   float* orderedDensity()                              scratch, the method's order
///   const float* gatherValues(size_t array, int first, int count)   values in the method's order
///   float* smoothingOutput(size_t array)                 input order, all components
///   template <class Op> void search(const Op&, const char* stage)
///   With separate queries (Problem::queries), in addition:
///   template <class Op> void searchQueries(const Op&, const char* stage)   over the queries
///   std::uint8_t* validOutput()                          query order, null when not wanted
///   void finishOutputs()                                 e.g. download
enum class WeightMode
{
  One,
  Mass
};

/// The operation of one smoothing pass: `Components` components of array `array` from `first`.
template <int Components, class Executor>
SmoothingOperation<Components> smoothingPass(Executor& ex, const Problem& p, std::size_t array, int first, bool shepard)
{
  SmoothingOperation<Components> op;
  op.kernel = ex.kernel();
  op.values = ex.gatherValues(array, first, Components);
  op.shepard = shepard;
  op.output = ex.smoothingOutput(array);
  op.outputStride = (*p.smoothed)[array].components;
  op.firstComponent = first;
  return op;
}

/// Every array's components in passes of at most maxComponentsPerPass: run(op) with each pass's
/// operation.
template <class Executor, class Run>
void forEachSmoothingPass(Executor& ex, const Problem& p, bool shepard, Run run)
{
  for (std::size_t a = 0; a < p.smoothed->size(); ++a)
  {
    const int components = (*p.smoothed)[a].components;
    for (int first = 0; first < components; first += maxComponentsPerPass)
    {
      switch (std::min(maxComponentsPerPass, components - first))
      {
        case 1:
          run(smoothingPass<1>(ex, p, a, first, shepard));
          break;
        case 2:
          run(smoothingPass<2>(ex, p, a, first, shepard));
          break;
        case 3:
          run(smoothingPass<3>(ex, p, a, first, shepard));
          break;
        default:
          run(smoothingPass<4>(ex, p, a, first, shepard));
          break;
      }
    }
  }
}

/// The passes when the queries are not the particles: results per query, neighbors among the
/// particles (the sources). SPH smoothing first needs the density at every source, computed by
/// the method's own search over the sources.
template <class Executor>
void runQueryOperation(Executor& ex, const Problem& p)
{
  switch (p.operation)
  {
    case Operation::NeighborCount:
    {
      ex.setWeights(WeightMode::One);
      QueryOperation<CountOperation> query;
      query.op.output = ex.countOutput();
      query.valid = ex.validOutput();
      ex.searchQueries(query, "search");
      break;
    }
    case Operation::Density:
    {
      ex.setWeights(WeightMode::Mass);
      QueryOperation<DensityOperation> query;
      query.op.kernel = ex.kernel();
      query.op.output = ex.densityOutput();
      query.valid = ex.validOutput();
      ex.searchQueries(query, "search");
      break;
    }
    case Operation::Smoothing:
    {
      const bool shepard = p.normalization == Normalization::Shepard;
      if (shepard)
      {
        ex.setWeights(WeightMode::One);
      }
      else if (p.sphWeightsGiven)
      {
        ex.setWeights(WeightMode::Mass); // m_j / rho_j, from the caller
      }
      else
      {
        ex.setWeights(WeightMode::Mass);
        if (float* queryDensity = ex.densityOutput())
        {
          QueryOperation<DensityOperation> query;
          query.op.kernel = ex.kernel();
          query.op.output = queryDensity;
          query.valid = ex.validOutput();
          ex.searchQueries(query, "density");
        }
        DensityOperation sourceDensity;
        sourceDensity.kernel = ex.kernel();
        sourceDensity.orderedOutput = ex.orderedDensity();
        ex.search(sourceDensity, "source density");
        ex.divideWeightsByDensity(sourceDensity.orderedOutput);
      }
      forEachSmoothingPass(ex, p, shepard, [&](const auto& op) {
        QueryOperation<std::decay_t<decltype(op)>> query;
        query.op = op;
        query.valid = ex.validOutput();
        query.nullValue = p.nullValue;
        ex.searchQueries(query, "smoothing");
      });
      break;
    }
    case Operation::Gradient:
      break; // the radius layer (Radii.h) runs gradients, as searches of its own
    case Operation::SmoothingLength:
      break; // its own search (KthNeighbor.h)
  }
  ex.finishOutputs();
}

template <class Executor>
void runOperation(Executor& ex, const Problem& p)
{
  if (p.queries.separate)
  {
    runQueryOperation(ex, p);
    return;
  }
  switch (p.operation)
  {
    case Operation::NeighborCount:
    {
      ex.setWeights(WeightMode::One);
      CountOperation op;
      op.output = ex.countOutput();
      ex.search(op, "search");
      break;
    }
    case Operation::Density:
    {
      ex.setWeights(WeightMode::Mass);
      DensityOperation op;
      op.kernel = ex.kernel();
      op.output = ex.densityOutput();
      ex.search(op, "search");
      break;
    }
    case Operation::Smoothing:
    {
      const bool shepard = p.normalization == Normalization::Shepard;
      if (shepard)
      {
        ex.setWeights(WeightMode::One);
      }
      else if (p.sphWeightsGiven)
      {
        ex.setWeights(WeightMode::Mass); // m_j / rho_j, from the caller
      }
      else
      {
        // SPH normalization needs rho_j of every neighbor: a density pass first.
        ex.setWeights(WeightMode::Mass);
        DensityOperation density;
        density.kernel = ex.kernel();
        density.output = ex.densityOutput();
        density.orderedOutput = ex.orderedDensity();
        ex.search(density, "density");
        ex.divideWeightsByDensity(density.orderedOutput);
      }
      forEachSmoothingPass(ex, p, shepard, [&](const auto& op) { ex.search(op, "smoothing"); });
      break;
    }
    case Operation::Gradient:
      break; // the radius layer (Radii.h) runs gradients, as searches of its own
    case Operation::SmoothingLength:
      break; // its own search (KthNeighbor.h)
  }
  ex.finishOutputs();
}

} // namespace detail
} // namespace neighborgrid
