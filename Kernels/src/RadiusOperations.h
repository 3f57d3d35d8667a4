// Per-particle support radii (Request::radii) and the SPH gradient: which pairs one search of the
// radius layer (Radii.h) takes, and the sums it adds, written once for the CPU and CUDA query
// searches. A search runs on a grid built for its largest radius (the bound); every candidate pair
// within the cells is then decided against its own radius, exactly as withinRadius() decides it:
// in float frame units where clearly inside or outside, in double from the input coordinates in
// the rounding band (PairTest.h). The band of the bound covers every smaller radius, because the
// float distance's error depends on the search's frames, not on the radius compared with.
#pragma once

#include "KernelFunctions.h"
#include "PairTest.h"

#include <cstdint>
#include <type_traits>

namespace neighborgrid
{
namespace detail
{

/// What one search sums per query.
enum class RadiusSum
{
  Count,     // neighbors (int)
  Density,   // sum_j w_j W, and the number of neighbors
  Smoothing, // sum_j w_j W f_j per component, sum_j w_j W, and the number of neighbors
  Gradient   // sum_j w_j (f_j - f_i) grad_i W per component and axis, and the number of neighbors
};

/// The pair rule of one search: whose radius decides a pair, and the float band.
struct RadiusRule
{
  SmoothingLengthMode mode = SmoothingLengthMode::Gather;
  // Symmetric mode runs in two halves: pairs with r <= R_i (queries by level), then pairs with
  // r <= R_j but not r <= R_i (sources by level), so that no pair is taken twice.
  bool secondHalf = false;
  double constantRadius = 0.0;         // where a side has no array (a fixed radius, exactly)
  const float* queryRadii = nullptr;   // query order
  const float* sourceRadii = nullptr;  // the method's order
  float cellSize = 1.0f;               // input units per frame unit
  float inverseCellSize = 1.0f;
  float band = 0.0f;                   // in squared frame units (PairTest.h), for the search's bound
  double frameScale = 1.0;             // 1 / cellSize^2, in double
  InputPoints sources;                 // the sources' input coordinates (double decisions)
  // Cells much coarser than the radius (FENNS and CLAWS's coarse grid): float frame coordinates
  // then lose digits the kernel needs, so every candidate's distance is taken in double.
  bool doubleDistances = false;
  const std::int32_t* orderToInput = nullptr; // method order to source input index; null: same

  NG_HD double sourceRadius(int j) const { return sourceRadii ? double(sourceRadii[j]) : constantRadius; }
  NG_HD double queryRadius(std::int64_t q) const { return queryRadii ? double(queryRadii[q]) : constantRadius; }

  /// r <= R, with r2f the pair's float squared distance in frame units (NaN: a huge cell).
  NG_HD bool within(float r2f, double radius, const double x[3], int j, double& exactSquared, unsigned& decided) const
  {
    const float rho = static_cast<float>(radius) * inverseCellSize;
    const float threshold = rho * rho;
    if (r2f < threshold - band)
    {
      return true;
    }
    if (r2f > threshold + band)
    {
      return false;
    }
    if (exactSquared < 0.0)
    {
      ++decided;
      double bx, by, bz;
      sources.get(orderToInput ? orderToInput[j] : j, bx, by, bz);
      exactSquared = exactSquaredDistance(x[0], x[1], x[2], bx, by, bz);
    }
    return exactSquared <= radius * radius;
  }

  /// Whether the search takes the pair of a query (at x, radius queryR) and source j. A pair
  /// decided in double gets its float distance from the double one.
  NG_HD bool takes(double queryR, const double x[3], int j, float& r2f, unsigned& decided) const
  {
    double exactSquared = -1.0;
    bool taken;
    switch (mode)
    {
      case SmoothingLengthMode::Gather:
        taken = within(r2f, queryR, x, j, exactSquared, decided);
        break;
      case SmoothingLengthMode::Scatter:
        taken = within(r2f, sourceRadius(j), x, j, exactSquared, decided);
        break;
      case SmoothingLengthMode::Symmetric:
      default:
        taken = secondHalf ? within(r2f, sourceRadius(j), x, j, exactSquared, decided) &&
            !within(r2f, queryR, x, j, exactSquared, decided)
                           : within(r2f, queryR, x, j, exactSquared, decided);
        break;
    }
    if (taken && exactSquared >= 0.0)
    {
      r2f = static_cast<float>(exactSquared * frameScale);
    }
    return taken;
  }
};

/// The frame of a search on cells of `cellSize` whose pair test (for its bound) is `test`.
inline void setRadiusFrame(RadiusRule& rule, const PairTest& test, double cellSize, InputPoints sources,
  const std::int32_t* orderToInput)
{
  rule.cellSize = static_cast<float>(cellSize);
  rule.inverseCellSize = static_cast<float>(1.0 / cellSize);
  rule.band = test.band;
  rule.frameScale = 1.0 / (cellSize * cellSize);
  rule.sources = sources;
  rule.orderToInput = orderToInput;
  rule.doubleDistances = cellSize > 1.5 * std::sqrt(test.radiusSquared);
}

/// W(r, R) and dW/dr with h = R / cutoff factor, in input units (DESIGN.md's kernels).
struct RadiusKernel
{
  Kernel type = Kernel::CubicSpline;
  int dimension = 3;
  float cutoff = 2.0f;
  float sigma = 1.0f;

  NG_HD float value(float r, float radius) const
  {
    const float inverseH = cutoff / radius;
    const float scale = dimension == 2 ? inverseH * inverseH : inverseH * inverseH * inverseH;
    return sigma * scale * kernelShape<float>(type, r * inverseH);
  }
  NG_HD float derivative(float r, float radius) const
  {
    const float inverseH = cutoff / radius;
    const float scale = dimension == 2 ? inverseH * inverseH * inverseH : inverseH * inverseH * inverseH * inverseH;
    return sigma * scale * kernelShapeDerivative<float>(type, r * inverseH);
  }
};

inline RadiusKernel makeRadiusKernel(Kernel type, int dimension)
{
  RadiusKernel k;
  k.type = type;
  k.dimension = dimension;
  k.cutoff = static_cast<float>(cutoffFactor(type));
  k.sigma = static_cast<float>(kernelSigma(type, dimension));
  return k;
}

/// The sums of one search. Terms per query (`output`, query order, Terms after Terms): see
/// RadiusSum; the last term of the float sums counts the neighbors (a query's validity). The
/// particle weight w_j (Particle::w) is the mass, 1, or m_j / rho_j, as the radius layer sets it.
template <RadiusSum Sum, int Components>
struct RadiusOperation
{
  using Value = std::conditional_t<Sum == RadiusSum::Count, std::int32_t, float>;
  static constexpr int Terms = Sum == RadiusSum::Count ? 1
    : Sum == RadiusSum::Density                        ? 2
    : Sum == RadiusSum::Smoothing                      ? Components + 2
                                                       : 3 * Components + 1;
  RadiusRule rule;
  RadiusKernel kernel;
  const float* values = nullptr;      // the method's order, Components per source
  const float* queryValues = nullptr; // query order, Components per query (Gradient: f_i)
  Value* output = nullptr;

  struct Query
  {
    double radius;
    float values[Components];
  };
  NG_HD Query query(std::int64_t q) const
  {
    Query s;
    s.radius = rule.queryRadius(q);
    for (int c = 0; c < Components; ++c)
    {
      s.values[c] = Sum == RadiusSum::Gradient ? queryValues[q * Components + c] : 0.0f;
    }
    return s;
  }

  /// The pair's kernel weight and its derivative by r, as the mode forms them.
  NG_HD void weights(const Query& s, int j, float r, float& w, float& dw) const
  {
    constexpr bool wantsDerivative = Sum == RadiusSum::Gradient;
    switch (rule.mode)
    {
      case SmoothingLengthMode::Gather:
      {
        const float radius = static_cast<float>(s.radius);
        w = wantsDerivative ? 0.0f : kernel.value(r, radius);
        dw = wantsDerivative ? kernel.derivative(r, radius) : 0.0f;
        break;
      }
      case SmoothingLengthMode::Scatter:
      {
        const float radius = static_cast<float>(rule.sourceRadius(j));
        w = wantsDerivative ? 0.0f : kernel.value(r, radius);
        dw = wantsDerivative ? kernel.derivative(r, radius) : 0.0f;
        break;
      }
      case SmoothingLengthMode::Symmetric:
      default:
      {
        const float own = static_cast<float>(s.radius), radius = static_cast<float>(rule.sourceRadius(j));
        w = wantsDerivative ? 0.0f : 0.5f * (kernel.value(r, own) + kernel.value(r, radius));
        dw = wantsDerivative ? 0.5f * (kernel.derivative(r, own) + kernel.derivative(r, radius)) : 0.0f;
        break;
      }
    }
  }

  /// Count and density push a pair's terms to the particle at its far side: the radius tree walks
  /// Symmetric and Scatter from one side (RadiusTree.h, TreePairs).
  static constexpr bool pushesTerms = Sum == RadiusSum::Count || Sum == RadiusSum::Density;

  /// A pair's terms for both of its sides at once (Symmetric, each pair taken once): t what source
  /// j adds to the query, u what the query, of weight wi, adds to j. The mode's kernel weight is
  /// symmetric in i and j.
  NG_HD void pairBothWays(Value (&t)[Terms], Value (&u)[Terms], const Query& s, float wi, int j, const Particle& pj,
    float r2f) const
  {
    static_assert(pushesTerms, "count and density only");
    if constexpr (Sum == RadiusSum::Count)
    {
      t[0] = u[0] = 1;
    }
    else
    {
      float w, dw;
      weights(s, j, sqrtf(r2f) * rule.cellSize, w, dw);
      t[0] = pj.w * w;
      u[0] = wi * w;
      t[1] = u[1] = 1.0f;
    }
  }

  /// Scatter walked from the sources' side: what a source (its state s, weight wj) whose own sphere
  /// takes the pair adds to the particle at the far side: w_j W(r, R_j).
  NG_HD void pairScattered(Value (&u)[Terms], const Query& s, float wj, float r2f) const
  {
    static_assert(pushesTerms, "count and density only");
    if constexpr (Sum == RadiusSum::Count)
    {
      u[0] = 1;
    }
    else
    {
      u[0] = wj * kernel.value(sqrtf(r2f) * rule.cellSize, static_cast<float>(s.radius));
      u[1] = 1.0f;
    }
  }

  /// The terms source j adds to the query: r2f its squared distance in frame units, d = x_i - x_j
  /// in input units.
  NG_HD void pair(Value (&t)[Terms], const Query& s, int j, const Particle& pj, float r2f, const float d[3]) const
  {
    if constexpr (Sum == RadiusSum::Count)
    {
      t[0] = 1;
    }
    else
    {
      const float r = sqrtf(r2f) * rule.cellSize;
      float w, dw;
      weights(s, j, r, w, dw);
      if constexpr (Sum == RadiusSum::Density)
      {
        t[0] = pj.w * w;
      }
      else if constexpr (Sum == RadiusSum::Smoothing)
      {
        const float f = pj.w * w;
        const float* v = values + static_cast<std::int64_t>(j) * Components;
        for (int c = 0; c < Components; ++c)
        {
          t[c] = f * v[c];
        }
        t[Components] = f;
      }
      else
      {
        // grad_i W = dW/dr (x_i - x_j) / r; 0 for a pair at the same position.
        const float g = r > 0.0f ? pj.w * dw / r : 0.0f;
        const float* v = values + static_cast<std::int64_t>(j) * Components;
        for (int c = 0; c < Components; ++c)
        {
          const float df = g * (v[c] - s.values[c]);
          for (int a = 0; a < 3; ++a)
          {
            t[3 * c + a] = df * d[a];
          }
        }
      }
      t[Terms - 1] = 1.0f;
    }
  }

  NG_HD void finish(const Value (&sum)[Terms], int /*i*/, int q) const
  {
    for (int k = 0; k < Terms; ++k)
    {
      output[static_cast<std::int64_t>(q) * Terms + k] = sum[k];
    }
  }
};

/// One search of the radius layer (Radii.h). A Problem that carries one runs this instead of its
/// operation: its queries are always separate (Problem::queries), its particle weights w_j are
/// Problem::mass (or constantMass), its radius is the largest radius the search needs.
struct RadiusPass
{
  RadiusSum sum = RadiusSum::Count;
  SmoothingLengthMode mode = SmoothingLengthMode::Gather;
  bool secondHalf = false;
  // One search of every pair by the mode's whole rule (Gather r <= R_i, Scatter r <= R_j,
  // Symmetric either): the queries are the particles themselves, so queryRadii and queryValues
  // are sourceRadii and sourceValues (the CUDA backend's radius tree, RadiusTree.h).
  bool wholeRule = false;
  double constantRadius = 0.0;
  const float* queryRadii = nullptr;   // per query, or null (constantRadius)
  const float* sourceRadii = nullptr;  // per source in input order, or null (constantRadius)
  const float* sourceValues = nullptr; // Smoothing, Gradient: per source, `components` each
  const float* queryValues = nullptr;  // Gradient: per query, `components` each (f_i)
  int components = 1;                  // 1 to 4
  std::int32_t* counts = nullptr;      // Count: per query
  float* sums = nullptr;               // otherwise: terms() per query

  int terms() const
  {
    switch (sum)
    {
      case RadiusSum::Count:
        return 1;
      case RadiusSum::Density:
        return 2;
      case RadiusSum::Smoothing:
        return components + 2;
      case RadiusSum::Gradient:
      default:
        return 3 * components + 1;
    }
  }
};

/// Calls run(op) with the operation of `pass`, its rule and kernel set but for the frame
/// (cellSize, band, sources): the caller completes those, the values and the output.
template <class Run>
void withRadiusOperation(const RadiusPass& pass, Kernel kernelType, int dimension, Run run)
{
  auto make = [&](auto op) {
    op.rule.mode = pass.mode;
    op.rule.secondHalf = pass.secondHalf;
    op.rule.constantRadius = pass.constantRadius;
    op.kernel = makeRadiusKernel(kernelType, dimension);
    run(op);
  };
  auto byComponents = [&](auto sum) {
    constexpr RadiusSum kind = decltype(sum)::value;
    switch (pass.components)
    {
      case 1:
        make(RadiusOperation<kind, 1>{});
        break;
      case 2:
        make(RadiusOperation<kind, 2>{});
        break;
      case 3:
        make(RadiusOperation<kind, 3>{});
        break;
      default:
        make(RadiusOperation<kind, 4>{});
        break;
    }
  };
  switch (pass.sum)
  {
    case RadiusSum::Count:
      make(RadiusOperation<RadiusSum::Count, 1>{});
      break;
    case RadiusSum::Density:
      make(RadiusOperation<RadiusSum::Density, 1>{});
      break;
    case RadiusSum::Smoothing:
      byComponents(std::integral_constant<RadiusSum, RadiusSum::Smoothing>{});
      break;
    case RadiusSum::Gradient:
    default:
      byComponents(std::integral_constant<RadiusSum, RadiusSum::Gradient>{});
      break;
  }
}

} // namespace detail
} // namespace neighborgrid
