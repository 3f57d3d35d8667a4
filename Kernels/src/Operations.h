// The operations, each written once as a functor pair used by every backend and method (the
// paper's neighbor iterator): neighbor() is called for every j with |x_i - x_j| <= R, i itself
// included, and finish() once when all of i's neighbors are done.
//
// Index conventions: j is an index into the method's particle order (sorted for grid methods,
// input order for brute force); finish() gets i's index in that order and in the input order.
#pragma once

#include "KernelFunctions.h"

#include <cstdint>

namespace neighborgrid
{
namespace detail
{

struct CountOperation
{
  std::int32_t* output = nullptr; // input order

  using Accumulator = std::int32_t;
  NG_HD Accumulator begin() const { return 0; }
  NG_HD void neighbor(Accumulator& a, int /*j*/, const Particle& /*pj*/, float /*r2*/) const
  {
    ++a;
  }
  NG_HD void finish(const Accumulator& a, int /*i*/, int inputIndex) const
  {
    output[inputIndex] = a - 1; // the point itself is not its own neighbor
  }
};

/// rho_i = sum_j m_j W_ij; the mass is the particle's weight w.
struct DensityOperation
{
  KernelParams kernel;
  float* output = nullptr;       // input order, optional
  float* orderedOutput = nullptr; // the method's order, optional (SPH smoothing reads it)

  using Accumulator = float;
  NG_HD Accumulator begin() const { return 0.0f; }
  NG_HD void neighbor(Accumulator& a, int /*j*/, const Particle& pj, float r2) const
  {
    a += pj.w * kernelValueFromSquared(kernel, r2);
  }
  NG_HD void finish(const Accumulator& a, int i, int inputIndex) const
  {
    if (output)
    {
      output[inputIndex] = a;
    }
    if (orderedOutput)
    {
      orderedOutput[i] = a;
    }
  }
};

/// Smooths Components consecutive components of one array. The particle weight w is 1 for
/// Shepard normalization (divide by sum_j W_ij) and m_j / rho_j for SPH normalization.
template <int Components>
struct SmoothingOperation
{
  KernelParams kernel;
  const float* values = nullptr; // the method's order, Components per point
  bool shepard = true;
  float* output = nullptr;       // input order, outputStride per point
  int outputStride = Components;
  int firstComponent = 0;

  struct Accumulator
  {
    float sum[Components];
    float weight;
  };
  NG_HD Accumulator begin() const
  {
    Accumulator a;
    for (int c = 0; c < Components; ++c)
    {
      a.sum[c] = 0.0f;
    }
    a.weight = 0.0f;
    return a;
  }
  NG_HD void neighbor(Accumulator& a, int j, const Particle& pj, float r2) const
  {
    const float w = kernelValueFromSquared(kernel, r2);
    a.weight += w;
    const float f = w * pj.w;
    const float* v = values + static_cast<std::int64_t>(j) * Components;
    for (int c = 0; c < Components; ++c)
    {
      a.sum[c] += f * v[c];
    }
  }
  NG_HD void finish(const Accumulator& a, int /*i*/, int inputIndex) const
  {
    // The sum includes j = i with W(0) > 0, so the Shepard weight is never zero.
    const float scale = shepard ? 1.0f / a.weight : 1.0f;
    float* out = output + static_cast<std::int64_t>(inputIndex) * outputStride + firstComponent;
    for (int c = 0; c < Components; ++c)
    {
      out[c] = a.sum[c] * scale;
    }
  }
};

} // namespace detail
} // namespace neighborgrid
