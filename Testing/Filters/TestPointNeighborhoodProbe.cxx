// vtkPointNeighborhoodProbe and vtkPointNeighborhoodVolume against vtkSPHInterpolator, with the
// probe different from the particles: density and Shepard smoothing on an image grid, a line and
// an unstructured grid, with every kernel; SPH smoothing; empty regions and a probe far outside
// the particles (null value and validity mask as vtkSPHInterpolator's MASK_POINTS gives them);
// composite particles; the volume's grid as ParaView's Bounded Volume chooses it; bad input.
//
// Usage: TestPointNeighborhoodProbe [CPU|CUDA]. With CUDA it exits 77 (skipped) when no CUDA
// device is usable.
#include "NeighborGridFilterTesting.h"

#include "vtkPointNeighborhoodProbe.h"
#include "vtkPointNeighborhoodVolume.h"

#include <vtkInformation.h>
#include <vtkStreamingDemandDrivenPipeline.h>
#include <vtkImageData.h>
#include <vtkLineSource.h>
#include <vtkIntArray.h>
#include <vtkDoubleArray.h>
#include <vtkFieldData.h>
#include <vtkMultiBlockDataSet.h>
#include <vtkSPHCubicKernel.h>
#include <vtkSPHInterpolator.h>
#include <vtkSPHQuarticKernel.h>
#include <vtkSPHQuinticKernel.h>
#include <vtkUnsignedCharArray.h>
#include <vtkUnstructuredGrid.h>
#include <vtkWendlandQuinticKernel.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace
{

const char* const TestName = "TestPointNeighborhoodProbe";
constexpr double Tolerance = 1e-5;
int Backend = vtkPointNeighborhoodFilter::BACKEND_CPU;

/// |got - want| relative to max(|want|, `floor` times the largest |want|): float kernel values
/// near the cutoff carry about 1e-7 W(0) of rounding, which only matters where a value is tiny;
/// signed fields (velocity) cancel, so their error is measured against the field's scale.
double ScaledError(const std::vector<double>& got, const std::vector<double>& want, const std::vector<bool>* skip = nullptr,
  double floor = 1e-2)
{
  if (got.size() != want.size() || got.empty())
  {
    return HUGE_VAL;
  }
  double largest = 0.0;
  for (double v : want)
  {
    largest = std::max(largest, std::abs(v));
  }
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
  {
    if (skip && (*skip)[i])
    {
      continue;
    }
    const double error = std::abs(got[i] - want[i]) / std::max({ std::abs(want[i]), floor * largest, 1e-300 });
    worst = std::isnan(error) ? HUGE_VAL : std::max(worst, error);
  }
  return worst;
}

std::vector<double> Array(vtkDataSet* data, const char* name)
{
  vtkDataArray* array = data ? data->GetPointData()->GetArray(name) : nullptr;
  NG_CHECK(array, "no point array '" << name << "'");
  return array ? ngtest::ValuesOf(array) : std::vector<double>();
}

vtkSmartPointer<vtkSPHKernel> MakeKernel(int kernel, double radius)
{
  vtkSmartPointer<vtkSPHKernel> k;
  switch (kernel)
  {
    case vtkPointNeighborhoodFilter::QUARTIC_SPLINE:
      k = vtkSmartPointer<vtkSPHQuarticKernel>::New();
      break;
    case vtkPointNeighborhoodFilter::QUINTIC_SPLINE:
      k = vtkSmartPointer<vtkSPHQuinticKernel>::New();
      break;
    case vtkPointNeighborhoodFilter::WENDLAND_C2:
      k = vtkSmartPointer<vtkWendlandQuinticKernel>::New();
      break;
    default:
      k = vtkSmartPointer<vtkSPHCubicKernel>::New();
      break;
  }
  k->SetSpatialStep(radius / ngtest::CutoffFactor(kernel));
  k->SetDimension(3);
  return k;
}

/// vtkSPHInterpolator on `probe` with `particles` as its source: weights W * mass / density, the
/// Shepard sum, the valid mask; Shepard normalization on or off.
vtkSmartPointer<vtkDataSet> Interpolate(vtkPointSet* particles, vtkDataSet* probe, int kernel, double radius,
  const char* mass, const char* density, bool shepard)
{
  vtkNew<vtkSPHInterpolator> interpolator;
  interpolator->SetInputData(probe);
  interpolator->SetSourceData(particles);
  interpolator->SetKernel(MakeKernel(kernel, radius));
  interpolator->SetMassArrayName(mass);
  interpolator->SetDensityArrayName(density);
  interpolator->SetShepardNormalization(shepard);
  interpolator->ComputeShepardSumOn();
  interpolator->SetShepardSumArrayName("Shepard Summation");
  interpolator->SetNullPointsStrategy(vtkSPHInterpolator::MASK_POINTS);
  interpolator->SetValidPointsMaskArrayName("vtkValidPointMask");
  interpolator->Update();
  return vtkSmartPointer<vtkDataSet>(vtkDataSet::SafeDownCast(interpolator->GetOutput()));
}

vtkSmartPointer<vtkDataSet> Probe(vtkDataObject* particles, vtkDataSet* probe, int operation, int kernel,
  double radius, const std::string& what, const char* smoothed = nullptr, int normalization = 0)
{
  vtkNew<vtkPointNeighborhoodProbe> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetInputData(particles);
  filter->SetSourceData(probe);
  filter->SetBackend(Backend);
  filter->SetRadius(radius);
  filter->SetOperation(operation);
  filter->SetKernel(kernel);
  filter->SetNormalization(normalization);
  filter->SetNullValue(-7.0);
  filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  if (smoothed)
  {
    filter->AddSmoothedArray(smoothed);
  }
  filter->Update();
  NG_CHECK(messages->Errors.empty(), what << ": unexpected error " << messages->AllErrors());
  auto output = vtkSmartPointer<vtkDataSet>(vtkDataSet::SafeDownCast(filter->GetOutput()));
  NG_CHECK(output && output->GetNumberOfPoints() == probe->GetNumberOfPoints() &&
      std::string(output->GetClassName()) == probe->GetClassName(),
    what << ": the output is not the probe's structure");
  NG_CHECK(std::string(filter->GetLastRunInfo()).find(Backend == vtkPointNeighborhoodFilter::BACKEND_CUDA
                 ? "backend=CUDA" : "backend=CPU") != std::string::npos,
    what << ": wrong backend: " << filter->GetLastRunInfo());
  return output;
}

/// The probes: an image grid wider than the particles (empty regions), a line through them, an
/// unstructured grid of scattered points, and an image far outside.
std::vector<std::pair<std::string, vtkSmartPointer<vtkDataSet>>> Probes()
{
  std::vector<std::pair<std::string, vtkSmartPointer<vtkDataSet>>> probes;
  auto image = vtkSmartPointer<vtkImageData>::New();
  image->SetOrigin(-1.5, -1.0, -0.5);
  image->SetSpacing(0.5, 0.45, 0.6);
  image->SetDimensions(23, 24, 17);
  probes.emplace_back("image", image);

  vtkNew<vtkLineSource> line;
  line->SetPoint1(-1.0, 0.3, 7.5);
  line->SetPoint2(8.5, 7.7, 0.2);
  line->SetResolution(300);
  line->Update();
  probes.emplace_back("line", line->GetOutput());

  auto grid = vtkSmartPointer<vtkUnstructuredGrid>::New();
  vtkNew<vtkPoints> points;
  const auto xyz = ngtest::RandomCoordinates(1500, 10.0, 91, -1.0);
  points->SetNumberOfPoints(1500);
  for (vtkIdType i = 0; i < 1500; ++i)
  {
    points->SetPoint(i, &xyz[3 * i]);
  }
  grid->SetPoints(points);
  probes.emplace_back("unstructured grid", grid);

  auto far = vtkSmartPointer<vtkImageData>::New();
  far->SetOrigin(1e5, 1e5, -1e5);
  far->SetDimensions(4, 3, 2);
  probes.emplace_back("far image", far);
  return probes;
}

vtkSmartPointer<vtkPolyData> Particles()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(3000, 8.0, 90), VTK_FLOAT);
  ngtest::AddPointArray<vtkFloatArray>(cloud, "mass", 1, [](vtkIdType i, int) { return 1.0 + 0.25 * (i % 3); });
  ngtest::AddPointArray<vtkFloatArray>(cloud, "ones", 1, [](vtkIdType, int) { return 1.0; });
  const auto xyz = ngtest::CoordinatesOf(cloud);
  ngtest::AddPointArray<vtkFloatArray>(
    cloud, "temperature", 1, [&](vtkIdType i, int) { return 300.0 + 10.0 * std::sin(xyz[3 * i]) + xyz[3 * i + 2]; });
  ngtest::AddPointArray<vtkDoubleArray>(
    cloud, "velocity", 3, [&](vtkIdType i, int c) { return std::cos(xyz[3 * i + c]) - 0.5 * c; });
  return cloud;
}

/// Density and Shepard smoothing with every kernel, SPH smoothing, and the validity mask.
void TestAgainstSPHInterpolator(vtkPolyData* particles)
{
  const double radius = 0.9;
  for (const auto& entry : Probes())
  {
    const std::string& name = entry.first;
    vtkDataSet* probe = entry.second;
    for (int kernel : { vtkPointNeighborhoodFilter::CUBIC_SPLINE, vtkPointNeighborhoodFilter::QUARTIC_SPLINE,
           vtkPointNeighborhoodFilter::QUINTIC_SPLINE, vtkPointNeighborhoodFilter::WENDLAND_C2 })
    {
      const std::string what = name + ", kernel " + std::to_string(kernel);
      // Density: vtkSPHInterpolator's Shepard sum with density 1 is sum_j m_j W.
      auto reference = Interpolate(particles, probe, kernel, radius, "mass", "ones", false);
      auto density = Probe(particles, probe, vtkPointNeighborhoodFilter::DENSITY, kernel, radius, what);
      const auto wantDensity = Array(reference, "Shepard Summation");
      NG_CHECK(ScaledError(Array(density, "Density"), wantDensity) <= Tolerance,
        what << ": density vs vtkSPHInterpolator, error " << ScaledError(Array(density, "Density"), wantDensity));
      const auto mask = Array(density, "vtkValidPointMask");
      const auto wantMask = Array(reference, "vtkValidPointMask");
      NG_CHECK(mask == wantMask, what << ": the validity mask differs from vtkSPHInterpolator's");

      // Shepard smoothing: weights W (mass and density 1), normalized.
      auto shepardRef = Interpolate(particles, probe, kernel, radius, "ones", "ones", true);
      auto shepard = Probe(particles, probe, vtkPointNeighborhoodFilter::KERNEL_SMOOTHING, kernel, radius,
        what + ", Shepard", "velocity");
      const auto got = Array(shepard, "velocity_smoothed");
      const auto want = Array(shepardRef, "velocity");
      std::vector<bool> invalid(got.size(), false);
      int nulls = 0, wrongNulls = 0;
      for (size_t k = 0; k < got.size(); ++k)
      {
        invalid[k] = wantMask[k / 3] == 0;
        if (invalid[k])
        {
          ++nulls;
          wrongNulls += got[k] != -7.0;
        }
      }
      NG_CHECK(wrongNulls == 0, what << ": " << wrongNulls << " smoothed values without neighbors are not the null value");
      // Where all of a point's weights are small (sum W < W(0) / 10: every neighbor in the outer
      // part of the support), float kernel values near the cutoff carry relative errors of 1e-4
      // and more, and so does their normalized mean: those points are held to 1e-3, the rest to
      // 1e-5.
      const auto weightSum = Array(shepardRef, "Shepard Summation");
      const double center = ngtest::KernelW(kernel, 3, radius, 0.0);
      std::vector<bool> weak(got.size(), false), strong(got.size(), false);
      int weakCount = 0;
      for (size_t k = 0; k < got.size(); ++k)
      {
        const bool tiny = weightSum[k / 3] < 0.1 * center;
        weak[k] = invalid[k] || !tiny;
        strong[k] = invalid[k] || tiny;
        weakCount += !invalid[k] && tiny;
      }
      NG_CHECK(ScaledError(got, want, &strong, 0.1) <= Tolerance,
        what << ": Shepard smoothing vs vtkSPHInterpolator, error " << ScaledError(got, want, &strong, 0.1));
      NG_CHECK(ScaledError(got, want, &weak, 0.1) <= 1e-3,
        what << ": Shepard smoothing of weakly supported points, error " << ScaledError(got, want, &weak, 0.1));
      if (std::getenv("NEIGHBORGRID_TEST_VERBOSE"))
      {
        std::cout << what << ": " << weakCount / 3 << " weakly supported points\n";
      }
      if (name == "far image")
      {
        NG_CHECK(nulls == int(got.size()), what << ": a probe far outside has " << got.size() - nulls << " valid values");
      }
      else if (name == "image" && kernel == vtkPointNeighborhoodFilter::CUBIC_SPLINE)
      {
        NG_CHECK(nulls > 0 && nulls < int(got.size()), what << ": the image should have empty regions, " << nulls);
      }
    }
    // SPH smoothing: sum_j m_j / rho_j f_j W with rho_j at the particles from the particles.
    const int kernel = vtkPointNeighborhoodFilter::WENDLAND_C2;
    auto rhoAtParticles = Interpolate(particles, particles, kernel, radius, "mass", "ones", false);
    vtkNew<vtkPolyData> withDensity;
    withDensity->ShallowCopy(particles);
    vtkNew<vtkFloatArray> rho;
    rho->SetName("rho");
    rho->DeepCopy(rhoAtParticles->GetPointData()->GetArray("Shepard Summation"));
    rho->SetName("rho");
    withDensity->GetPointData()->AddArray(rho);
    auto sphRef = Interpolate(withDensity, probe, kernel, radius, "mass", "rho", false);
    auto sph = Probe(particles, probe, vtkPointNeighborhoodFilter::KERNEL_SMOOTHING, kernel, radius, name + ", SPH",
      "temperature", vtkPointNeighborhoodFilter::SPH);
    const auto mask = Array(sphRef, "vtkValidPointMask");
    std::vector<bool> invalid(mask.size());
    for (size_t k = 0; k < mask.size(); ++k)
    {
      invalid[k] = mask[k] == 0;
    }
    const double error = ScaledError(Array(sph, "temperature_smoothed"), Array(sphRef, "temperature"), &invalid);
    NG_CHECK(error <= Tolerance, name << ": SPH smoothing vs vtkSPHInterpolator, error " << error);
  }
}

/// Counts against a double brute force, and composite particles equal to the same particles whole.
void TestCountsAndComposite(vtkPolyData* particles)
{
  const double radius = 0.7;
  const auto xyz = ngtest::CoordinatesOf(particles);
  for (const auto& entry : Probes())
  {
    vtkDataSet* probe = entry.second;
    auto counts = Probe(particles, probe, vtkPointNeighborhoodFilter::NEIGHBOR_COUNT, 0, radius, entry.first + ", count");
    const auto got = Array(counts, "NeighborCount");
    int wrong = 0;
    for (vtkIdType q = 0; q < probe->GetNumberOfPoints(); ++q)
    {
      double x[3];
      probe->GetPoint(q, x);
      int want = 0;
      for (size_t j = 0; j < xyz.size() / 3; ++j)
      {
        want += neighborgrid::withinRadius(x, &xyz[3 * j], radius) ? 1 : 0;
      }
      wrong += got.size() > size_t(q) && got[q] != want;
    }
    NG_CHECK(wrong == 0, entry.first << ": " << wrong << " probe counts differ from the double brute force");
  }

  // The particles split into two blocks and an empty one: the same results as whole.
  const vtkIdType n = particles->GetNumberOfPoints();
  vtkNew<vtkMultiBlockDataSet> blocks;
  for (int b = 0; b < 2; ++b)
  {
    vtkNew<vtkPolyData> part;
    vtkNew<vtkPoints> points;
    const vtkIdType first = b * n / 2, last = (b + 1) * n / 2;
    part->GetPointData()->CopyAllocate(particles->GetPointData(), last - first);
    for (vtkIdType i = first; i < last; ++i)
    {
      points->InsertNextPoint(particles->GetPoint(i));
      part->GetPointData()->CopyData(particles->GetPointData(), i, i - first);
    }
    part->SetPoints(points);
    blocks->SetBlock(b, part);
  }
  blocks->SetBlock(2, vtkNew<vtkPolyData>());
  auto probe = Probes()[0].second;
  auto whole = Probe(particles, probe, vtkPointNeighborhoodFilter::DENSITY, 0, radius, "whole particles");
  auto split = Probe(blocks, probe, vtkPointNeighborhoodFilter::DENSITY, 0, radius, "composite particles");
  NG_CHECK(ScaledError(Array(split, "Density"), Array(whole, "Density")) <= Tolerance,
    "composite particles differ from the same particles whole");
}

/// The volume: Bounded Volume's grid rules, and values equal to probing that grid.
void TestVolume(vtkPolyData* particles)
{
  const double radius = 0.8;
  double bounds[6];
  particles->GetBounds(bounds);
  vtkNew<vtkPointNeighborhoodVolume> volume;
  volume->SetInputData(particles);
  volume->SetBackend(Backend);
  volume->SetRadius(radius);
  volume->SetResolution(20, 24, 16);
  volume->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  volume->Update();
  vtkImageData* image = vtkImageData::SafeDownCast(volume->GetOutputDataObject(0));
  int dims[3];
  image->GetDimensions(dims);
  NG_CHECK(dims[0] == 21 && dims[1] == 25 && dims[2] == 17, "resolution 20 x 24 x 16 gave " << dims[0] << " x "
                                                              << dims[1] << " x " << dims[2] << " points");
  for (int a = 0; a < 3; ++a)
  {
    const int cells[3] = { 20, 24, 16 };
    NG_CHECK(std::abs(image->GetOrigin()[a] - (bounds[2 * a] - radius)) < 1e-12, "origin " << a << " is not the bounds padded by R");
    const double spacing = (bounds[2 * a + 1] - bounds[2 * a] + 2 * radius) / cells[a];
    NG_CHECK(std::abs(image->GetSpacing()[a] - spacing) < 1e-12, "spacing " << a);
  }
  vtkNew<vtkImageData> same;
  same->CopyStructure(image);
  auto probed = Probe(particles, same, vtkPointNeighborhoodFilter::DENSITY, 0, radius, "volume as a probe");
  // Not bit for bit: the GPU's counting sort orders a cell's particles by atomics, so sums may
  // round differently from run to run.
  NG_CHECK(ScaledError(Array(image, "Density"), Array(probed, "Density")) <= 1e-6,
    "the volume differs from probing its grid");
  NG_CHECK(image->GetPointData()->GetArray("vtkValidPointMask"), "the volume has no validity mask");

  // Cell-size refinement of a given box: ceil(length / size) cells, centered.
  volume->SetUseParticleBounds(false);
  volume->SetOrigin(0.0, 0.0, 0.0);
  volume->SetScale(8.0, 4.0, 2.0);
  volume->SetRefinementMode(vtkPointNeighborhoodVolume::USE_CELL_SIZE);
  volume->SetCellSize(0.3);
  volume->Update();
  image = vtkImageData::SafeDownCast(volume->GetOutputDataObject(0));
  image->GetDimensions(dims);
  NG_CHECK(dims[0] == 28 && dims[1] == 15 && dims[2] == 8, "cell size 0.3 gave " << dims[0] << " x " << dims[1] << " x " << dims[2]);
  NG_CHECK(std::abs(image->GetOrigin()[0] - (4.0 - 0.5 * 27 * 0.3)) < 1e-12, "cell-size origin is not centered");
  int whole[6];
  volume->GetOutputInformation(0)->Get(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), whole);
  NG_CHECK(whole[1] == 27 && whole[3] == 14 && whole[5] == 7, "the whole extent does not match the volume");

  // Cell-size refinement of the particles' box: the extent depends on the particles, and still
  // belongs to RequestInformation (consumers such as ParaView's volume representation size their
  // requests by it; a late extent rendered nothing).
  volume->SetUseParticleBounds(true);
  volume->UpdateInformation();
  volume->GetOutputInformation(0)->Get(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), whole);
  const int expectedCells = static_cast<int>(std::ceil((bounds[1] - bounds[0] + 2 * radius) / 0.3));
  NG_CHECK(whole[0] == 0 && whole[1] == expectedCells,
    "before the data, the whole extent along x is " << whole[0] << ".." << whole[1] << ", expected 0.." << expectedCells);
  volume->Update();
  image = vtkImageData::SafeDownCast(volume->GetOutputDataObject(0));
  image->GetDimensions(dims);
  const int expected = static_cast<int>(std::ceil((bounds[1] - bounds[0] + 2 * radius) / 0.3)) + 1;
  NG_CHECK(dims[0] == expected, "cell size over the particles' box: " << dims[0] << " points, expected " << expected);
  NG_CHECK(image->GetPointData()->GetArray("Density")->GetNumberOfTuples() == image->GetNumberOfPoints(),
    "the density does not cover the volume");
  int extent[6];
  image->GetExtent(extent);
  volume->GetOutputInformation(0)->Get(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), whole);
  NG_CHECK(std::equal(extent, extent + 6, whole), "the volume's extent is not its whole extent");
}

void TestErrors(vtkPolyData* particles)
{
  auto probe = Probes()[0].second;
  vtkNew<vtkPointNeighborhoodProbe> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetInputData(particles);
  filter->SetSourceData(probe);
  filter->SetBackend(Backend);
  filter->SetOperation(vtkPointNeighborhoodFilter::KERNEL_SMOOTHING);
  filter->AddSmoothedArray("no such array");
  filter->Update();
  NG_CHECK(messages->ErrorContains("'no such array'"), "a missing array: " << messages->AllErrors());
  NG_CHECK(vtkDataSet::SafeDownCast(filter->GetOutput())->GetNumberOfPoints() == 0, "a failed run left an output");

  messages->Clear();
  vtkNew<vtkPolyData> empty;
  filter->SetInputData(empty);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  filter->Update();
  NG_CHECK(messages->ErrorContains("no points"), "empty particles: " << messages->AllErrors());

  messages->Clear();
  vtkNew<vtkPointNeighborhoodVolume> volume;
  messages->Watch(volume);
  volume->SetInputData(particles);
  volume->SetResolution(0, 4, 4);
  volume->Update();
  NG_CHECK(messages->ErrorContains("Resolution"), "a zero resolution: " << messages->AllErrors());
}

/// Periodic boxes through the filters: counts against a brute force over the images, the box
/// from the properties or from the particles' field data, the input untouched, a missing box.
void TestPeriodic(vtkPolyData* particles)
{
  const double radius = 1.1, L = 8.0;
  vtkNew<vtkPolyData> unwrapped;
  unwrapped->DeepCopy(particles);
  for (vtkIdType i = 0; i < unwrapped->GetNumberOfPoints(); i += 5)
  {
    double x[3];
    unwrapped->GetPoint(i, x);
    x[0] += L * double(int(i % 3) - 1); // an unwrapped trajectory: some atoms a box length away
    x[2] += 2.0 * L;
    unwrapped->GetPoints()->SetPoint(i, x);
  }
  const auto xyz = ngtest::CoordinatesOf(unwrapped); // as the filter reads them (float to double)
  const vtkIdType n = unwrapped->GetNumberOfPoints();
  auto wrap = [&](double x) {
    if (x >= 0.0 && x < L)
    {
      return x;
    }
    double w = x - L * std::floor(x / L);
    if (w >= L)
    {
      w -= L;
    }
    return w < 0.0 ? 0.0 : w;
  };
  std::vector<double> w(xyz.size());
  std::transform(xyz.begin(), xyz.end(), w.begin(), wrap);
  auto countNear = [&](const double q[3]) {
    int count = 0;
    for (vtkIdType j = 0; j < n; ++j)
    {
      for (int kx = -1; kx <= 1; ++kx)
        for (int ky = -1; ky <= 1; ++ky)
          for (int kz = -1; kz <= 1; ++kz)
          {
            const double dx = q[0] - (w[3 * j] + kx * L), dy = q[1] - (w[3 * j + 1] + ky * L),
                         dz = q[2] - (w[3 * j + 2] + kz * L);
            count += dx * dx + dy * dy + dz * dz <= radius * radius;
          }
    }
    return count;
  };

  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetInputData(unwrapped);
  filter->SetBackend(Backend);
  filter->SetRadius(radius);
  filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  filter->SetPeriodic(1, 1, 1);
  filter->Update();
  NG_CHECK(messages->ErrorContains("BoxLengths"), "periodic without a box: " << messages->AllErrors());

  auto checkCounts = [&](const char* what) {
    auto* counts = vtkIntArray::SafeDownCast(
      vtkDataSet::SafeDownCast(filter->GetOutputDataObject(0))->GetPointData()->GetArray("NeighborCount"));
    NG_CHECK(counts, what << ": no NeighborCount");
    if (!counts)
    {
      return;
    }
    int bad = 0;
    for (vtkIdType i = 0; i < n; i += 7)
    {
      const int want = countNear(&w[3 * i]) - 1;
      if (counts->GetValue(i) != want && bad++ < 5)
      {
        NG_CHECK(false, what << ": point " << i << " count " << counts->GetValue(i) << ", reference " << want);
      }
    }
  };
  messages->Clear();
  filter->SetBoxOrigin(0.0, 0.0, 0.0);
  filter->SetBoxLengths(L, L, L);
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "periodic run: " << messages->AllErrors());
  checkCounts("box from the properties");
  NG_CHECK(ngtest::CoordinatesOf(unwrapped) == xyz, "the input's coordinates changed");

  vtkNew<vtkDoubleArray> lengths;
  lengths->SetName("BoxLengths");
  for (int a = 0; a < 3; ++a)
  {
    lengths->InsertNextValue(L);
  }
  unwrapped->GetFieldData()->AddArray(lengths);
  filter->SetBoxLengths(0.0, 0.0, 0.0);
  filter->Modified();
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "box from field data: " << messages->AllErrors());
  checkCounts("box from the field data");
  NG_CHECK(std::string(filter->GetLastRunInfo()).find("field data") != std::string::npos,
    "the run info does not say where the box came from");

  // A probe outside the box sees the particles' images; the particles themselves count.
  vtkNew<vtkLineSource> line;
  line->SetPoint1(-3.0, 2.0, 9.5);
  line->SetPoint2(11.0, 7.0, -1.0);
  line->SetResolution(60);
  line->Update();
  vtkNew<vtkPointNeighborhoodProbe> probe;
  messages->Watch(probe);
  probe->SetInputData(unwrapped);
  probe->SetSourceData(line->GetOutput());
  probe->SetBackend(Backend);
  probe->SetRadius(radius);
  probe->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  probe->SetPeriodic(1, 1, 1);
  probe->Update();
  NG_CHECK(messages->Errors.empty(), "periodic probe: " << messages->AllErrors());
  auto* counts = vtkIntArray::SafeDownCast(
    vtkDataSet::SafeDownCast(probe->GetOutputDataObject(0))->GetPointData()->GetArray("NeighborCount"));
  NG_CHECK(counts && counts->GetNumberOfTuples() == 61, "periodic probe: no counts");
  for (vtkIdType q = 0; counts && q < 61; ++q)
  {
    double x[3];
    line->GetOutput()->GetPoint(q, x);
    for (double& v : x)
    {
      v = wrap(v);
    }
    NG_CHECK(counts->GetValue(q) == countNear(x), "periodic probe point " << q << ": count " << counts->GetValue(q)
                                                                         << ", reference " << countNear(x));
  }
}

} // namespace

int main(int argc, char* argv[])
{
  Backend = ngtest::BackendFromArguments(argc, argv, TestName);
  auto particles = Particles();
  TestAgainstSPHInterpolator(particles);
  TestCountsAndComposite(particles);
  TestVolume(particles);
  TestErrors(particles);
  TestPeriodic(particles);
  return ngtest::ExitCode(TestName);
}
