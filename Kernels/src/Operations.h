// The operations, each written once as a functor pair used by every backend and method (the
// paper's neighbor iterator): pair() gives the terms that neighbor j adds to i's sums, for every j
// with |x_i - x_j| <= R, i itself included; finish() runs once when all of i's neighbors are done.
// Sums live where the method keeps them: in registers (one thread per particle) or in shared
// memory updated with atomics (FENNS, where many threads add to one particle), which is why an
// operation states its terms instead of updating an accumulator itself.
//
// Index conventions: j is an index into the method's particle order (sorted for grid methods,
// input order for brute force); finish() gets i's index in that order and in the input order.
#pragma once

#include "KernelFunctions.h"

#include <cstdint>
#include <type_traits>

namespace neighborgrid
{
namespace detail
{

struct CountOperation
{
  using Value = std::int32_t; // an int: counts stay exact past 2^24
  static constexpr int Terms = 1;
  static constexpr bool smooths = false;
  std::int32_t* output = nullptr; // input order

  NG_HD void pair(Value (&t)[Terms], int /*j*/, const Particle& /*pj*/, float /*r2*/) const { t[0] = 1; }
  NG_HD void finish(const Value (&sum)[Terms], int /*i*/, int inputIndex) const
  {
    output[inputIndex] = sum[0] - 1; // the point itself is not its own neighbor
  }
};

/// rho_i = sum_j m_j W_ij; the mass is the particle's weight w. The pairs add m_j w(q_ij), the
/// kernel's shape, and finish() multiplies the sum by sigma_d / h^d once: one multiplication less
/// per pair (4M density row on the H100: 2.71 -> 2.61 ms, RESULTS.md issue 22).
struct DensityOperation
{
  using Value = float;
  static constexpr int Terms = 1;
  static constexpr bool smooths = false;
  KernelParams kernel;
  float* output = nullptr;        // input order, optional
  float* orderedOutput = nullptr; // the method's order, optional (SPH smoothing reads it)

  NG_HD void pair(Value (&t)[Terms], int /*j*/, const Particle& pj, float r2) const
  {
    t[0] = pj.w * kernelShapeFromSquared(kernel, r2);
  }
  NG_HD void finish(const Value (&sum)[Terms], int i, int inputIndex) const
  {
    const float density = sum[0] * kernel.normalization;
    if (output)
    {
      output[inputIndex] = density;
    }
    if (orderedOutput)
    {
      orderedOutput[i] = density;
    }
  }
};

/// Smooths Components consecutive components of one array. The particle weight w is 1 for
/// Shepard normalization (divide by sum_j W_ij) and m_j / rho_j for SPH normalization.
/// Terms: the weighted sum of each component, then sum_j W_ij.
template <int Components>
struct SmoothingOperation
{
  using Value = float;
  static constexpr int Terms = Components + 1;
  static constexpr bool smooths = true;
  KernelParams kernel;
  const float* values = nullptr; // the method's order, Components per point
  bool shepard = true;
  float* output = nullptr; // input order, outputStride per point
  int outputStride = Components;
  int firstComponent = 0;

  NG_HD void pair(Value (&t)[Terms], int j, const Particle& pj, float r2) const
  {
    const float w = kernelShapeFromSquared(kernel, r2); // sigma_d / h^d at finish() (SPH) or cancelled (Shepard)
    const float f = w * pj.w;
    const float* v = values + static_cast<std::int64_t>(j) * Components;
    for (int c = 0; c < Components; ++c)
    {
      t[c] = f * v[c];
    }
    t[Components] = w;
  }
  NG_HD void finish(const Value (&sum)[Terms], int /*i*/, int inputIndex) const
  {
    // With the particles as queries the sum includes j = i with W(0) > 0; a separate query's
    // weights may all be zero (QueryOperation): its result is then the null value.
    const float scale = shepard ? 1.0f / sum[Components] : kernel.normalization;
    float* out = output + static_cast<std::int64_t>(inputIndex) * outputStride + firstComponent;
    for (int c = 0; c < Components; ++c)
    {
      out[c] = sum[c] * scale;
    }
  }
  NG_HD void finishNull(int inputIndex, float nullValue) const
  {
    float* out = output + static_cast<std::int64_t>(inputIndex) * outputStride + firstComponent;
    for (int c = 0; c < Components; ++c)
    {
      out[c] = nullValue;
    }
  }
};

/// An operation at query points whose neighbors are the source points (Request::source): the
/// operation's terms plus one term counting the neighbors, which says whether the query is valid.
/// The count is not reduced by one: a query is not a source. A query with no neighbor, or whose
/// Shepard weights sum to zero, gets the null value for smoothing (count and density are 0).
template <class Op>
struct QueryOperation
{
  using Value = typename Op::Value;
  static constexpr bool isCount = std::is_same<Op, CountOperation>::value;
  static constexpr int Terms = isCount ? 1 : Op::Terms + 1;
  static constexpr bool smooths = Op::smooths;
  Op op;
  std::uint8_t* valid = nullptr; // query order, optional
  float nullValue = 0.0f;

  NG_HD void pair(Value (&t)[Terms], int j, const Particle& pj, float r2) const
  {
    if constexpr (isCount)
    {
      t[0] = 1;
    }
    else
    {
      Value inner[Op::Terms];
      op.pair(inner, j, pj, r2);
      for (int k = 0; k < Op::Terms; ++k)
      {
        t[k] = inner[k];
      }
      t[Op::Terms] = 1;
    }
  }
  NG_HD void finish(const Value (&sum)[Terms], int i, int query) const
  {
    const bool any = sum[Terms - 1] > Value(0);
    if (valid)
    {
      valid[query] = any ? 1 : 0;
    }
    if constexpr (isCount)
    {
      op.output[query] = sum[0];
    }
    else
    {
      Value inner[Op::Terms];
      for (int k = 0; k < Op::Terms; ++k)
      {
        inner[k] = sum[k];
      }
      if constexpr (Op::smooths)
      {
        if (!any || (op.shepard && !(inner[Op::Terms - 1] > Value(0))))
        {
          op.finishNull(query, nullValue);
          return;
        }
      }
      op.finish(inner, i, query);
    }
  }
};

/// Sums in registers: one thread owns particle i and visits its neighbors. Float sums are
/// compensated (Kahan): a particle may have thousands of neighbors, and a plain float sum would
/// then drift past the 1e-5 agreement with a double-precision reference that users rely on.
template <class Op>
struct RegisterSums
{
  using Value = typename Op::Value;
  static constexpr bool compensated = !std::is_integral<Value>::value;
  Value sum[Op::Terms];
  Value carry[compensated ? Op::Terms : 1];

  NG_HD RegisterSums()
  {
    for (int k = 0; k < Op::Terms; ++k)
    {
      sum[k] = 0;
      if constexpr (compensated)
      {
        carry[k] = 0;
      }
    }
  }
  NG_HD void add(const Op& op, int j, const Particle& pj, float r2)
  {
    Value t[Op::Terms];
    op.pair(t, j, pj, r2);
    addTerms(t);
  }
  /// Adds terms accumulated elsewhere (CLAWS: what other threads added to this particle).
  NG_HD void addTerms(const Value* t)
  {
    for (int k = 0; k < Op::Terms; ++k)
    {
      if constexpr (compensated)
      {
        const Value y = t[k] - carry[k];
        const Value s = sum[k] + y;
        carry[k] = (s - sum[k]) - y;
        sum[k] = s;
      }
      else
      {
        sum[k] += t[k];
      }
    }
  }
  NG_HD void finish(const Op& op, int i, int inputIndex) const { op.finish(sum, i, inputIndex); }
};

} // namespace detail
} // namespace neighborgrid
