// vtkPointNeighborhoodFilter against double-precision brute force: neighbor count, density with
// every kernel, kernel smoothing (Shepard and SPH) of arrays of several types and component
// counts, coordinates of several types and far from the origin, and vtkSPHInterpolator.
//
// Usage: TestPointNeighborhoodFilter [CPU|CUDA]. With CUDA it exits 77 (skipped) when no CUDA
// device is usable.
#include "NeighborGridFilterTesting.h"

#include <vtkIdTypeArray.h>
#include <vtkSOADataArrayTemplate.h>
#include <vtkSPHCubicKernel.h>
#include <vtkSPHInterpolator.h>
#include <vtkShortArray.h>

#include <numeric>
#include <sstream>

namespace
{

const char* const TestName = "TestPointNeighborhoodFilter";
constexpr double Tolerance = 1e-5; // DESIGN.md: results agree with double brute force to 1e-5

int Backend = vtkPointNeighborhoodFilter::BACKEND_CPU;

/// Runs a configured filter on `input` and checks what every successful run must satisfy: no
/// error or warning, the input unchanged, NeighborGridInfo naming the requested backend.
vtkSmartPointer<vtkPointSet> Run(vtkPointNeighborhoodFilter* filter, vtkPointSet* input,
  const std::string& what)
{
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  const ngtest::Snapshot before = ngtest::Snapshot::Of(input);
  filter->SetBackend(Backend);
  filter->SetInputData(input);
  filter->Update();
  auto output = vtkSmartPointer<vtkPointSet>(vtkPointSet::SafeDownCast(filter->GetOutput()));
  NG_CHECK(messages->Errors.empty(), what << ": unexpected error " << messages->AllErrors());
  NG_CHECK(messages->Warnings.empty(), what << ": unexpected warning");
  NG_CHECK(ngtest::Snapshot::Of(input) == before, what << ": the input was modified");
  NG_CHECK(output && output->GetNumberOfPoints() == input->GetNumberOfPoints(),
    what << ": the output does not have the input's points");
  const auto info = ngtest::InfoEntries(output);
  const std::string backendName =
    Backend == vtkPointNeighborhoodFilter::BACKEND_CUDA ? "CUDA" : "CPU";
  NG_CHECK(ngtest::InfoValue(info, "backend") == backendName,
    what << ": NeighborGridInfo backend is '" << ngtest::InfoValue(info, "backend") << "'");
  NG_CHECK(!ngtest::InfoValue(info, "method").empty(), what << ": no method in NeighborGridInfo");
  NG_CHECK(!ngtest::InfoValue(info, "device").empty(), what << ": no device in NeighborGridInfo");
  NG_CHECK(ngtest::HasEntryStartingWith(info, "stage."), what << ": no stage times");
  NG_CHECK(std::string(filter->GetLastRunInfo()).find("backend=" + backendName) != std::string::npos,
    what << ": GetLastRunInfo() lacks the backend: " << filter->GetLastRunInfo());
  // Every input array is passed (shallow copy).
  for (int a = 0; a < input->GetPointData()->GetNumberOfArrays(); ++a)
  {
    const char* name = input->GetPointData()->GetArrayName(a);
    NG_CHECK(output && output->GetPointData()->GetAbstractArray(name) ==
        input->GetPointData()->GetAbstractArray(name),
      what << ": input array " << name << " is not passed to the output");
  }
  return output;
}

std::vector<double> Values(vtkPointSet* output, const char* name)
{
  return ngtest::ValuesOf(output ? output->GetPointData()->GetArray(name) : nullptr);
}

// ---------------------------------------------------------------------------------------------
void TestEngineKernelValuesMatchDesign()
{
  for (int kernel = vtkPointNeighborhoodFilter::CUBIC_SPLINE;
       kernel <= vtkPointNeighborhoodFilter::WENDLAND_C2; ++kernel)
  {
    for (int dimension = 2; dimension <= 3; ++dimension)
    {
      for (double r : { 0.0, 0.1, 0.3, 0.5, 0.74, 0.75, 0.9 })
      {
        const double expected = ngtest::KernelW(kernel, dimension, 0.75, r);
        const double got = neighborgrid::kernelValue(
          static_cast<neighborgrid::Kernel>(kernel), dimension, 0.75, r);
        NG_CHECK(std::abs(got - expected) <= 1e-12 * std::max(1.0, std::abs(expected)),
          "neighborgrid::kernelValue(kernel " << kernel << ", d " << dimension << ", r " << r
                                              << ") = " << got << ", DESIGN.md: " << expected);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
void CheckCounts(vtkPointSet* output, const ngtest::NeighborLists& reference, const std::string& what)
{
  auto* counts = vtkIntArray::SafeDownCast(output->GetPointData()->GetAbstractArray("NeighborCount"));
  NG_CHECK(counts, what << ": no vtkIntArray NeighborCount");
  if (!counts)
  {
    return;
  }
  NG_CHECK(counts->GetNumberOfComponents() == 1, what << ": NeighborCount has several components");
  int wrong = 0;
  long long sum = 0;
  for (vtkIdType i = 0; i < counts->GetNumberOfTuples(); ++i)
  {
    const int count = counts->GetValue(i);
    sum += count;
    if (count < reference.sure[i] || count > reference.sure[i] + reference.borderline[i])
    {
      if (++wrong <= 5)
      {
        std::cerr << what << ": point " << i << " has " << count << " neighbors, brute force "
                  << reference.sure[i] << " (+" << reference.borderline[i] << " borderline)\n";
      }
    }
  }
  NG_CHECK(wrong == 0, what << ": " << wrong << " wrong neighbor counts");
  const auto info = ngtest::InfoEntries(output);
  NG_CHECK(ngtest::InfoValue(info, "neighbor_pairs") == std::to_string(sum),
    what << ": neighbor_pairs=" << ngtest::InfoValue(info, "neighbor_pairs") << ", sum " << sum);
}

void TestNeighborCountRandom()
{
  const double radius = 0.75;
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(3000, 8.0, 1), VTK_FLOAT);
  const auto reference = ngtest::BruteForceNeighbors(ngtest::CoordinatesOf(cloud), radius);
  NG_CHECK(reference.totalBorderline < 10, "too many borderline pairs for a meaningful test");
  const double mean = std::accumulate(reference.sure.begin(), reference.sure.end(), 0.0) / 3000;
  NG_CHECK(mean > 5, "the test cloud is too sparse: " << mean << " neighbors per point");

  std::vector<double> first;
  std::vector<int> methods{ vtkPointNeighborhoodFilter::METHOD_AUTO, vtkPointNeighborhoodFilter::METHOD_COUNTING_SORT,
    vtkPointNeighborhoodFilter::METHOD_BRUTE_FORCE };
  if (Backend == vtkPointNeighborhoodFilter::BACKEND_CUDA)
  {
    methods.push_back(vtkPointNeighborhoodFilter::METHOD_FENNS);
    methods.push_back(vtkPointNeighborhoodFilter::METHOD_RADIX_SORT);
    methods.push_back(vtkPointNeighborhoodFilter::METHOD_CLAWS);
    methods.push_back(vtkPointNeighborhoodFilter::METHOD_BAYRAKTAR);
  }
  for (int method : methods)
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
    filter->SetRadius(radius);
    filter->SetMethod(method);
    const std::string what = "neighbor count, method " + std::to_string(method);
    auto output = Run(filter, cloud, what);
    CheckCounts(output, reference, what);
    NG_CHECK(!output->GetPointData()->GetArray("Density"), what << ": unexpected Density");
    const auto counts = Values(output, "NeighborCount");
    if (first.empty())
    {
      first = counts;
    }
    NG_CHECK(counts == first, what << ": methods disagree on the neighbor counts");
  }
}

/// Integer lattices: distances of exactly R must count (|x_i - x_j| <= R), coincident points
/// count as neighbors of each other, and integer coordinates are accepted.
void TestNeighborCountLattice()
{
  std::vector<double> xyz;
  for (int z = 0; z < 6; ++z)
  {
    for (int y = 0; y < 6; ++y)
    {
      for (int x = 0; x < 6; ++x)
      {
        xyz.insert(xyz.end(), { double(x), double(y), double(z) });
      }
    }
  }
  for (int duplicate = 0; duplicate < 3; ++duplicate)
  {
    xyz.insert(xyz.end(), { 2.0, 2.0, 2.0 });
  }
  const vtkIdType count = static_cast<vtkIdType>(xyz.size() / 3);

  for (int type : { VTK_INT, VTK_DOUBLE, VTK_FLOAT })
  {
    for (double offset : { 0.0, 1e6 })
    {
      if (offset != 0.0 && type != VTK_DOUBLE)
      {
        continue; // 1e6 + 5 is exact in double only (and int covers offset 0 only)
      }
      std::vector<double> shifted = xyz;
      for (double& v : shifted)
      {
        v += offset;
      }
      auto cloud = ngtest::MakeCloud(shifted, type);
      // R^2 = 1, 2, 4: double R rounds up or is exact, so distances of exactly R are inside
      // (sqrt(3) would round down, leaving distance sqrt(3) mathematically outside R).
      for (int squaredRadius : { 1, 2, 4 })
      {
        std::vector<int> expected(static_cast<size_t>(count), 0);
        for (vtkIdType i = 0; i < count; ++i)
        {
          for (vtkIdType j = 0; j < count; ++j)
          {
            const double dx = xyz[3 * i] - xyz[3 * j], dy = xyz[3 * i + 1] - xyz[3 * j + 1],
                         dz = xyz[3 * i + 2] - xyz[3 * j + 2];
            expected[i] += (i != j && dx * dx + dy * dy + dz * dz <= squaredRadius) ? 1 : 0;
          }
        }
        vtkNew<vtkPointNeighborhoodFilter> filter;
        filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
        filter->SetRadius(std::sqrt(double(squaredRadius)));
        std::ostringstream what;
        what << "lattice, type " << type << ", offset " << offset << ", R^2 " << squaredRadius;
        auto output = Run(filter, cloud, what.str());
        const auto counts = Values(output, "NeighborCount");
        int wrong = 0;
        for (vtkIdType i = 0; i < count && counts.size() == size_t(count); ++i)
        {
          wrong += counts[i] != expected[i] ? 1 : 0;
        }
        NG_CHECK(counts.size() == size_t(count) && wrong == 0,
          what.str() << ": " << wrong << " counts differ from the exact ones");
        // Point (2,2,2) of the lattice (index 86) and its 3 duplicates see each other.
        NG_CHECK(counts.size() == size_t(count) && counts[86] == counts[count - 1] &&
            counts[86] == expected[86] && expected[86] >= 3,
          what.str() << ": coincident points are not counted as neighbors");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
/// Result arrays above 32 MiB live in huge pages the filter allocates itself
/// (NeighborhoodRequestBuilder.cxx): a 204^3 lattice (34 MB of counts), run twice so that the
/// second run frees the first's array, every count exact (6 inside, fewer on the faces).
void TestLargeResultArrays()
{
  const int side = 204;
  std::vector<double> xyz;
  xyz.reserve(3 * std::size_t(side) * side * side);
  for (int z = 0; z < side; ++z)
  {
    for (int y = 0; y < side; ++y)
    {
      for (int x = 0; x < side; ++x)
      {
        xyz.insert(xyz.end(), { double(x), double(y), double(z) });
      }
    }
  }
  auto cloud = ngtest::MakeCloud(xyz, VTK_FLOAT);
  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  filter->SetRadius(1.05);
  for (int run = 0; run < 2; ++run)
  {
    const std::string what = "204^3 lattice, run " + std::to_string(run);
    filter->Modified();
    auto output = Run(filter, cloud, what);
    vtkIntArray* counts = vtkIntArray::SafeDownCast(output->GetPointData()->GetArray("NeighborCount"));
    NG_CHECK(counts && counts->GetNumberOfTuples() == vtkIdType(side) * side * side &&
        counts->GetNumberOfComponents() == 1,
      what << ": no NeighborCount array of one value a point");
    if (!counts)
    {
      continue;
    }
    vtkIdType wrong = 0, i = 0;
    for (int z = 0; z < side; ++z)
    {
      for (int y = 0; y < side; ++y)
      {
        for (int x = 0; x < side; ++x, ++i)
        {
          const int expected = (x > 0) + (x < side - 1) + (y > 0) + (y < side - 1) + (z > 0) + (z < side - 1);
          wrong += counts->GetValue(i) != expected ? 1 : 0;
        }
      }
    }
    NG_CHECK(wrong == 0, what << ": " << wrong << " counts differ from the lattice's");
    double range[2];
    counts->GetRange(range);
    NG_CHECK(range[0] == 3 && range[1] == 6, what << ": range " << range[0] << ".." << range[1]);
  }
}

// ---------------------------------------------------------------------------------------------
void TestDensity()
{
  const double radius = 0.75;
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(3000, 8.0, 2), VTK_FLOAT);
  const auto xyz = ngtest::CoordinatesOf(cloud);
  const auto lists = ngtest::BruteForceNeighbors(xyz, radius);
  const std::vector<double> constantMass(3000, 2.5);

  for (int kernel = vtkPointNeighborhoodFilter::CUBIC_SPLINE;
       kernel <= vtkPointNeighborhoodFilter::WENDLAND_C2; ++kernel)
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
    filter->SetRadius(radius);
    filter->SetKernel(kernel);
    filter->SetMass(2.5);
    const std::string what = "density, kernel " + std::to_string(kernel);
    auto output = Run(filter, cloud, what);
    NG_CHECK(vtkFloatArray::SafeDownCast(output->GetPointData()->GetAbstractArray("Density")),
      what << ": Density is not a vtkFloatArray");
    const double error = ngtest::MaxRelativeError(Values(output, "Density"),
      ngtest::ReferenceDensity(lists, constantMass, kernel, 3, radius));
    NG_CHECK(error <= Tolerance, what << ": relative error " << error);
    NG_CHECK(!output->GetPointData()->GetArray("NeighborCount"), what << ": unexpected NeighborCount");
    const auto info = ngtest::InfoEntries(output);
    NG_CHECK(ngtest::InfoValue(info, "neighbor_pairs").empty(),
      what << ": neighbor_pairs reported for Density");
  }

  // Mass arrays of several numeric types; "None" (ParaView's none entry) means constant Mass.
  std::vector<double> masses(3000);
  for (size_t i = 0; i < masses.size(); ++i)
  {
    masses[i] = 1 + int(i % 3); // exact in every type
  }
  auto withMass = vtkSmartPointer<vtkPolyData>::New();
  withMass->ShallowCopy(cloud);
  ngtest::AddPointArray<vtkDoubleArray>(withMass, "massDouble", 1, [&](vtkIdType i, int) { return masses[i]; });
  ngtest::AddPointArray<vtkShortArray>(withMass, "massShort", 1, [&](vtkIdType i, int) { return masses[i]; });
  ngtest::AddPointArray<vtkFloatArray>(withMass, "massFloat", 1, [&](vtkIdType i, int) { return masses[i]; });
  const auto expected =
    ngtest::ReferenceDensity(lists, masses, vtkPointNeighborhoodFilter::WENDLAND_C2, 3, radius);
  for (const char* name : { "massDouble", "massShort", "massFloat" })
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
    filter->SetRadius(radius);
    filter->SetKernel(vtkPointNeighborhoodFilter::WENDLAND_C2);
    filter->SetMass(1000.0); // must be ignored: the array wins
    filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, name);
    const std::string what = std::string("density with mass array ") + name;
    auto output = Run(filter, withMass, what);
    const double error = ngtest::MaxRelativeError(Values(output, "Density"), expected);
    NG_CHECK(error <= Tolerance, what << ": relative error " << error);
    NG_CHECK(ngtest::InfoValue(ngtest::InfoEntries(output), "mass") == std::string("array '") + name + "'",
      what << ": NeighborGridInfo mass entry is wrong");
  }
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetRadius(radius);
    filter->SetMass(2.5);
    filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "None");
    auto output = Run(filter, withMass, "density with mass array None");
    const double error = ngtest::MaxRelativeError(Values(output, "Density"),
      ngtest::ReferenceDensity(lists, constantMass, vtkPointNeighborhoodFilter::CUBIC_SPLINE, 3, radius));
    NG_CHECK(error <= Tolerance, "mass array None: not the constant mass, relative error " << error);
  }

  // 2D kernels on a planar cloud.
  auto planar = ngtest::MakeCloud(ngtest::RandomCoordinates(1500, 8.0, 3, 0.0, true), VTK_DOUBLE);
  const auto planarLists = ngtest::BruteForceNeighbors(ngtest::CoordinatesOf(planar), 0.5);
  for (int kernel = vtkPointNeighborhoodFilter::CUBIC_SPLINE;
       kernel <= vtkPointNeighborhoodFilter::WENDLAND_C2; ++kernel)
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetRadius(0.5);
    filter->SetKernel(kernel);
    filter->SetDimension(2);
    const std::string what = "2D density, kernel " + std::to_string(kernel);
    auto output = Run(filter, planar, what);
    const double error = ngtest::MaxRelativeError(Values(output, "Density"),
      ngtest::ReferenceDensity(planarLists, std::vector<double>(1500, 1.0), kernel, 2, 0.5));
    NG_CHECK(error <= Tolerance, what << ": relative error " << error);
  }
}

// ---------------------------------------------------------------------------------------------
void TestSmoothing()
{
  const double radius = 0.75;
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(3000, 8.0, 4), VTK_FLOAT);
  const auto xyz = ngtest::CoordinatesOf(cloud);
  const auto lists = ngtest::BruteForceNeighbors(xyz, radius);

  // Positive fields, so relative errors are meaningful.
  ngtest::AddPointArray<vtkDoubleArray>(cloud, "temperature", 1,
    [&](vtkIdType i, int) { return 2.0 + std::sin(xyz[3 * i]) + 0.1 * xyz[3 * i + 1]; });
  auto* velocity = ngtest::AddPointArray<vtkFloatArray>(cloud, "velocity", 3,
    [&](vtkIdType i, int c) { return 1.5 + std::cos(xyz[3 * i + c] + c); });
  velocity->SetComponentName(0, "vx");
  velocity->SetComponentName(1, "vy");
  velocity->SetComponentName(2, "vz");
  ngtest::AddPointArray<vtkIdTypeArray>(cloud, "label", 1, [&](vtkIdType i, int) { return 1 + i % 7; });
  // Structure-of-arrays storage: not contiguous AOS float, so the filter converts it.
  vtkNew<vtkSOADataArrayTemplate<float>> soa;
  soa->SetName("soaField");
  soa->SetNumberOfComponents(2);
  soa->SetNumberOfTuples(3000);
  for (vtkIdType i = 0; i < 3000; ++i)
  {
    soa->SetTypedComponent(i, 0, static_cast<float>(3.0 + xyz[3 * i + 2]));
    soa->SetTypedComponent(i, 1, static_cast<float>(1.0 + 0.5 * std::sin(xyz[3 * i])));
  }
  cloud->GetPointData()->AddArray(soa);
  std::vector<double> masses(3000);
  for (size_t i = 0; i < masses.size(); ++i)
  {
    masses[i] = 0.5 + 0.25 * double(i % 5);
  }
  ngtest::AddPointArray<vtkDoubleArray>(cloud, "mass", 1, [&](vtkIdType i, int) { return masses[i]; });

  struct Field
  {
    const char* name;
    int components;
  };
  const Field fields[] = { { "temperature", 1 }, { "velocity", 3 }, { "label", 1 }, { "soaField", 2 } };

  for (int normalization : { vtkPointNeighborhoodFilter::SHEPARD, vtkPointNeighborhoodFilter::SPH })
  {
    for (int kernel : { vtkPointNeighborhoodFilter::CUBIC_SPLINE, vtkPointNeighborhoodFilter::QUINTIC_SPLINE })
    {
      const bool sph = normalization == vtkPointNeighborhoodFilter::SPH;
      vtkNew<vtkPointNeighborhoodFilter> filter;
      filter->SetOperation(vtkPointNeighborhoodFilter::KERNEL_SMOOTHING);
      filter->SetRadius(radius);
      filter->SetKernel(kernel);
      filter->SetNormalization(normalization);
      filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
      for (const Field& field : fields)
      {
        filter->AddSmoothedArray(field.name);
      }
      filter->AddSmoothedArray("velocity"); // a duplicate is ignored
      NG_CHECK(filter->GetNumberOfSmoothedArrays() == 4, "AddSmoothedArray kept a duplicate");
      const std::string what = std::string("smoothing, ") + (sph ? "SPH" : "Shepard") +
        ", kernel " + std::to_string(kernel);
      auto output = Run(filter, cloud, what);
      for (const Field& field : fields)
      {
        const std::string name = std::string(field.name) + "_smoothed";
        auto* smoothed = vtkFloatArray::SafeDownCast(output->GetPointData()->GetAbstractArray(name.c_str()));
        NG_CHECK(smoothed, what << ": no vtkFloatArray " << name);
        if (!smoothed)
        {
          continue;
        }
        NG_CHECK(smoothed->GetNumberOfComponents() == field.components,
          what << ": " << name << " has " << smoothed->GetNumberOfComponents() << " components");
        const auto expected = ngtest::ReferenceSmoothing(lists,
          ngtest::ValuesOf(cloud->GetPointData()->GetArray(field.name)), field.components, masses,
          kernel, 3, radius, sph);
        const double error = ngtest::MaxRelativeError(ngtest::ValuesOf(smoothed), expected);
        NG_CHECK(error <= Tolerance, what << ": " << name << " relative error " << error);
      }
      auto* smoothedVelocity = output->GetPointData()->GetArray("velocity_smoothed");
      NG_CHECK(smoothedVelocity && smoothedVelocity->GetComponentName(1) &&
          std::string(smoothedVelocity->GetComponentName(1)) == "vy",
        what << ": component names are not copied");
      // SPH normalization also outputs the density it used; Shepard does not.
      if (sph)
      {
        const double error = ngtest::MaxRelativeError(Values(output, "Density"),
          ngtest::ReferenceDensity(lists, masses, kernel, 3, radius));
        NG_CHECK(error <= Tolerance, what << ": Density relative error " << error);
      }
      else
      {
        NG_CHECK(!output->GetPointData()->GetArray("Density"), what << ": Density with Shepard");
      }
    }
  }

  // Shepard normalization reproduces a constant field (up to float rounding).
  auto constantCloud = vtkSmartPointer<vtkPolyData>::New();
  constantCloud->ShallowCopy(cloud);
  ngtest::AddPointArray<vtkFloatArray>(constantCloud, "seven", 1, [](vtkIdType, int) { return 7.0; });
  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetOperation(vtkPointNeighborhoodFilter::KERNEL_SMOOTHING);
  filter->SetRadius(radius);
  filter->AddSmoothedArray("seven");
  auto output = Run(filter, constantCloud, "Shepard smoothing of a constant");
  const double error = ngtest::MaxRelativeError(
    Values(output, "seven_smoothed"), std::vector<double>(3000, 7.0));
  NG_CHECK(error <= Tolerance, "Shepard smoothing of a constant: relative error " << error);
}

// ---------------------------------------------------------------------------------------------
/// Coordinates far from the origin keep their precision (pairs are tested relative to their cells).
void TestFarFromOrigin()
{
  const double radius = 0.75;
  struct Case
  {
    int type;
    double offset;
  };
  for (const Case& c : { Case{ VTK_DOUBLE, 1e6 }, Case{ VTK_DOUBLE, -3e7 }, Case{ VTK_FLOAT, 1e5 } })
  {
    auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(2000, 8.0, 5, c.offset), c.type);
    const auto lists = ngtest::BruteForceNeighbors(ngtest::CoordinatesOf(cloud), radius);
    std::ostringstream what;
    what << "far from the origin, type " << c.type << ", offset " << c.offset;

    vtkNew<vtkPointNeighborhoodFilter> counter;
    counter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
    counter->SetRadius(radius);
    CheckCounts(Run(counter, cloud, what.str()), lists, what.str());

    vtkNew<vtkPointNeighborhoodFilter> density;
    density->SetRadius(radius);
    auto output = Run(density, cloud, what.str());
    const double error = ngtest::MaxRelativeError(Values(output, "Density"),
      ngtest::ReferenceDensity(lists, std::vector<double>(2000, 1.0),
        vtkPointNeighborhoodFilter::CUBIC_SPLINE, 3, radius));
    NG_CHECK(error <= Tolerance, what.str() << ": density relative error " << error);
  }
}

// ---------------------------------------------------------------------------------------------
/// One far point (an escaped particle, a stray return, a sentinel coordinate) beside a dense
/// lattice: 60^3 points of spacing 1e-5 and one at (1e6, 1e6, 1e6), float coordinates, R = 1.05e-5.
/// Each lattice point has exactly its axis neighbors (6 inside, fewer on the faces), the far point
/// none. A grid sized from the bounding box put every lattice point into one cell, and float
/// coordinates relative to the bounds' minimum could not tell them apart.
void TestFarOutlier()
{
  const int side = 60;
  const double spacing = 1e-5;
  std::vector<double> xyz;
  xyz.reserve(3 * (side * side * side + 1));
  for (int z = 0; z < side; ++z)
  {
    for (int y = 0; y < side; ++y)
    {
      for (int x = 0; x < side; ++x)
      {
        xyz.insert(xyz.end(), { x * spacing, y * spacing, z * spacing });
      }
    }
  }
  xyz.insert(xyz.end(), { 1e6, 1e6, 1e6 });
  auto cloud = ngtest::MakeCloud(xyz, VTK_FLOAT);
  for (int method : { int(vtkPointNeighborhoodFilter::METHOD_AUTO), int(vtkPointNeighborhoodFilter::METHOD_COUNTING_SORT),
         int(vtkPointNeighborhoodFilter::METHOD_RADIX_SORT), int(vtkPointNeighborhoodFilter::METHOD_CLAWS) })
  {
    if (Backend == vtkPointNeighborhoodFilter::BACKEND_CPU && method > vtkPointNeighborhoodFilter::METHOD_COUNTING_SORT)
    {
      continue;
    }
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
    filter->SetRadius(1.05 * spacing);
    filter->SetMethod(method);
    const std::string what = "far outlier, method " + std::to_string(method);
    const auto counts = Values(Run(filter, cloud, what), "NeighborCount");
    NG_CHECK(counts.size() == xyz.size() / 3, what << ": no counts");
    if (counts.size() != xyz.size() / 3)
    {
      continue;
    }
    int wrong = 0;
    size_t i = 0;
    for (int z = 0; z < side; ++z)
    {
      for (int y = 0; y < side; ++y)
      {
        for (int x = 0; x < side; ++x, ++i)
        {
          const int expected = (x > 0) + (x < side - 1) + (y > 0) + (y < side - 1) + (z > 0) + (z < side - 1);
          wrong += counts[i] != expected ? 1 : 0;
        }
      }
    }
    NG_CHECK(wrong == 0, what << ": " << wrong << " lattice counts differ from their axis neighbors");
    NG_CHECK(counts.back() == 0, what << ": the far point has " << counts.back() << " neighbors");
  }
}

// ---------------------------------------------------------------------------------------------
/// DESIGN.md's cross-check: vtkSPHInterpolator with probe = source, SpatialStep = h, a mass
/// array and a density array of ones gives sum_j m_j W_ij as its "Shepard Summation".
void TestAgainstSPHInterpolator()
{
  const double radius = 0.75;
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(2000, 8.0, 6), VTK_FLOAT);
  ngtest::AddPointArray<vtkFloatArray>(cloud, "mass", 1, [](vtkIdType i, int) { return 1.0 + 0.5 * (i % 2); });
  ngtest::AddPointArray<vtkFloatArray>(cloud, "ones", 1, [](vtkIdType, int) { return 1.0; });

  vtkNew<vtkSPHCubicKernel> kernel;
  kernel->SetSpatialStep(radius / 2.0);
  kernel->SetDimension(3);
  vtkNew<vtkSPHInterpolator> interpolator;
  interpolator->SetInputData(cloud);
  interpolator->SetSourceData(cloud);
  interpolator->SetKernel(kernel);
  interpolator->SetMassArrayName("mass");
  interpolator->SetDensityArrayName("ones");
  interpolator->ComputeShepardSumOn();
  interpolator->SetShepardSumArrayName("Shepard Summation");
  interpolator->Update();
  auto* shepard = vtkPointSet::SafeDownCast(interpolator->GetOutput())
                    ->GetPointData()->GetArray("Shepard Summation");
  NG_CHECK(shepard, "vtkSPHInterpolator produced no Shepard Summation");

  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetRadius(radius);
  filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  auto output = Run(filter, cloud, "density vs vtkSPHInterpolator");
  const double error =
    ngtest::MaxRelativeError(Values(output, "Density"), ngtest::ValuesOf(shepard));
  NG_CHECK(error <= Tolerance, "density vs vtkSPHInterpolator: relative error " << error);
}

// ---------------------------------------------------------------------------------------------
/// One filter, several updates: the engine is reused, and each output holds only the arrays of
/// the current operation.
void TestReuse()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(2000, 8.0, 7), VTK_DOUBLE);
  const auto xyz = ngtest::CoordinatesOf(cloud);
  vtkNew<vtkPointNeighborhoodFilter> filter;
  for (double radius : { 0.75, 0.5, 0.9 })
  {
    const auto lists = ngtest::BruteForceNeighbors(xyz, radius);
    filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
    filter->SetRadius(radius);
    const std::string what = "reused filter, R " + std::to_string(radius);
    auto output = Run(filter, cloud, what);
    const double error = ngtest::MaxRelativeError(Values(output, "Density"),
      ngtest::ReferenceDensity(lists, std::vector<double>(2000, 1.0),
        vtkPointNeighborhoodFilter::CUBIC_SPLINE, 3, radius));
    NG_CHECK(error <= Tolerance, what << ": density relative error " << error);

    filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
    output = Run(filter, cloud, what + ", count");
    CheckCounts(output, lists, what + ", count");
    NG_CHECK(!output->GetPointData()->GetArray("Density"), what << ": stale Density array");
  }

  std::ostringstream printed;
  filter->AddSmoothedArray("someArray");
  filter->Print(printed);
  for (const char* expected : { "Radius: 0.9", "Operation: 0 (Neighbor Count)", "Kernel: 0",
         "Dimension: 3", "Mass: 1", "SmoothedArrays (1): 'someArray'", "Normalization: 0",
         "Backend:", "Method: 0 (Auto)", "LastRunInfo:", "backend=" })
  {
    NG_CHECK(printed.str().find(expected) != std::string::npos,
      "PrintSelf lacks '" << expected << "':\n" << printed.str());
  }
  filter->ClearSmoothedArrays();
  NG_CHECK(filter->GetNumberOfSmoothedArrays() == 0 && !filter->GetSmoothedArray(0),
    "ClearSmoothedArrays left arrays");
}

// ---------------------------------------------------------------------------------------------
/// Two filters in a pipeline: the second passes the first's NeighborCount, replaces (not
/// duplicates) NeighborGridInfo, and both pass the input's own field data; the input's field data
/// gains nothing.
void TestChainedFilters()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(1000, 6.0, 8), VTK_FLOAT);
  vtkNew<vtkStringArray> provenance;
  provenance->SetName("provenance");
  provenance->InsertNextValue("test");
  cloud->GetFieldData()->AddArray(provenance);
  const ngtest::Snapshot before = ngtest::Snapshot::Of(cloud);

  vtkNew<vtkPointNeighborhoodFilter> counter;
  counter->SetBackend(Backend);
  counter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  counter->SetRadius(0.75);
  counter->SetInputData(cloud);
  vtkNew<vtkPointNeighborhoodFilter> density;
  density->SetBackend(Backend);
  density->SetRadius(0.75);
  density->SetInputConnection(counter->GetOutputPort());
  density->Update();

  auto* output = vtkPointSet::SafeDownCast(density->GetOutput());
  NG_CHECK(output && output->GetPointData()->GetArray("NeighborCount") &&
      output->GetPointData()->GetArray("Density"),
    "chained filters: the output lacks NeighborCount or Density");
  int infoArrays = 0;
  for (int a = 0; output && a < output->GetFieldData()->GetNumberOfArrays(); ++a)
  {
    const char* name = output->GetFieldData()->GetAbstractArray(a)->GetName();
    infoArrays += name && std::string(name) == "NeighborGridInfo" ? 1 : 0;
  }
  NG_CHECK(infoArrays == 1, "chained filters: " << infoArrays << " NeighborGridInfo arrays");
  NG_CHECK(ngtest::InfoValue(ngtest::InfoEntries(output), "operation") == "Density",
    "chained filters: NeighborGridInfo does not describe the last filter");
  NG_CHECK(output && output->GetFieldData()->GetAbstractArray("provenance"),
    "chained filters: the input's field data is not passed");
  NG_CHECK(ngtest::Snapshot::Of(cloud) == before, "chained filters: the input was modified");
  NG_CHECK(!cloud->GetFieldData()->GetAbstractArray("NeighborGridInfo"),
    "chained filters: NeighborGridInfo was added to the input");
}

} // namespace

int main(int argc, char* argv[])
{
  Backend = ngtest::BackendFromArguments(argc, argv, TestName);
  TestEngineKernelValuesMatchDesign();
  TestNeighborCountRandom();
  TestNeighborCountLattice();
  TestLargeResultArrays();
  TestDensity();
  TestSmoothing();
  TestFarFromOrigin();
  TestFarOutlier();
  TestAgainstSPHInterpolator();
  TestReuse();
  TestChainedFilters();
  return ngtest::ExitCode(TestName);
}
