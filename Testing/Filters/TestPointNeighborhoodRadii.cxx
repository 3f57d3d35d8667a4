// Per-particle radii (input array 1) and GRADIENT through the VTK API: neighbor counts in every
// SmoothingLengthMode against a brute force in double, radius arrays of other types converted to
// float, a constant radius array equal to the fixed Radius, the gradient's layout and names,
// composite blocks (an empty block gets empty gradient arrays), probes (SCATTER by default; GATHER
// and GRADIENT are errors) and bad radii. Plugin/TestPointNeighborhoodRadii.py checks the values
// of every operation and kernel against a brute force.
#include "NeighborGridFilterTesting.h"
#include "vtkPointNeighborhoodProbe.h"

#include <vtkMultiBlockDataSet.h>

#include <limits>

namespace
{

const char* const TestName = "TestPointNeighborhoodRadii";
int Backend = vtkPointNeighborhoodFilter::BACKEND_CPU;
constexpr vtkIdType Count = 600;

/// 600 points in a box of 5 (float coordinates) with a float "r" in [0.4, 1.0], an int "one"
/// (all 1), a constant float "r08" (0.8), a linear "f" = 2x - 3y + 0.5z and a 2-component "g".
vtkSmartPointer<vtkPolyData> MakeInput()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(Count, 5.0, 7), VTK_FLOAT);
  ngtest::AddPointArray<vtkFloatArray>(
    cloud, "r", 1, [](vtkIdType i, int) { return 0.4 + 0.6 * ((i * 7919) % 1000) / 1000.0; });
  ngtest::AddPointArray<vtkIntArray>(cloud, "one", 1, [](vtkIdType, int) { return 1; });
  ngtest::AddPointArray<vtkFloatArray>(cloud, "r08", 1, [](vtkIdType, int) { return 0.8; });
  const std::vector<double> xyz = ngtest::CoordinatesOf(cloud);
  ngtest::AddPointArray<vtkFloatArray>(cloud, "f", 1, [&](vtkIdType i, int) {
    return 2.0 * xyz[3 * i] - 3.0 * xyz[3 * i + 1] + 0.5 * xyz[3 * i + 2];
  });
  ngtest::AddPointArray<vtkDoubleArray>(
    cloud, "g", 2, [&](vtkIdType i, int c) { return c == 0 ? xyz[3 * i] * xyz[3 * i + 1] : xyz[3 * i + 2]; });
  return cloud;
}

vtkSmartPointer<vtkPointNeighborhoodFilter> MakeFilter(vtkDataObject* input, int operation, const char* radii, int mode)
{
  auto filter = vtkSmartPointer<vtkPointNeighborhoodFilter>::New();
  filter->SetBackend(Backend);
  filter->SetOperation(operation);
  filter->SetInputArrayToProcess(
    vtkPointNeighborhoodFilter::RADIUS_ARRAY, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, radii);
  filter->SetSmoothingLengthMode(mode);
  filter->SetInputData(input);
  return filter;
}

void TestCounts(vtkPolyData* input)
{
  const std::vector<double> xyz = ngtest::CoordinatesOf(input);
  const std::vector<double> radii = ngtest::ValuesOf(input->GetPointData()->GetArray("r"));
  for (int mode : { vtkPointNeighborhoodFilter::GATHER, vtkPointNeighborhoodFilter::SCATTER,
         vtkPointNeighborhoodFilter::SYMMETRIC })
  {
    std::vector<int> expected(Count, 0);
    for (vtkIdType i = 0; i < Count; ++i)
    {
      for (vtkIdType j = 0; j < Count; ++j)
      {
        const double R = mode == vtkPointNeighborhoodFilter::GATHER ? radii[i]
          : mode == vtkPointNeighborhoodFilter::SCATTER             ? radii[j]
                                                                    : std::max(radii[i], radii[j]);
        expected[i] += (i != j && neighborgrid::withinRadius(&xyz[3 * i], &xyz[3 * j], R)) ? 1 : 0;
      }
    }
    auto filter = MakeFilter(input, vtkPointNeighborhoodFilter::NEIGHBOR_COUNT, "r", mode);
    vtkNew<ngtest::MessageCollector> messages;
    messages->Watch(filter);
    filter->Update();
    NG_CHECK(messages->Errors.empty(), "mode " << mode << ": " << messages->AllErrors());
    const std::vector<double> got =
      ngtest::ValuesOf(filter->GetPolyDataOutput()->GetPointData()->GetArray("NeighborCount"));
    NG_CHECK(got == std::vector<double>(expected.begin(), expected.end()),
      "mode " << mode << ": the counts differ from the brute force");
    const auto info = ngtest::InfoEntries(filter->GetOutput());
    NG_CHECK(std::find(info.begin(), info.end(), "radius=array 'r'") != info.end(),
      "mode " << mode << ": NeighborGridInfo lacks radius=array 'r'");
  }
}

/// A radius array of one value (int, float) gives the results of that fixed Radius.
void TestConstantRadii(vtkPolyData* input)
{
  for (int operation : { vtkPointNeighborhoodFilter::NEIGHBOR_COUNT, vtkPointNeighborhoodFilter::DENSITY,
         vtkPointNeighborhoodFilter::GRADIENT })
  {
    for (auto radius : { std::make_pair("one", 1.0), std::make_pair("r08", static_cast<double>(0.8f)) })
    {
      auto fixed = MakeFilter(input, operation, "None", vtkPointNeighborhoodFilter::GATHER);
      fixed->SetRadius(radius.second);
      fixed->AddSmoothedArray("g");
      fixed->Update();
      for (int mode : { vtkPointNeighborhoodFilter::GATHER, vtkPointNeighborhoodFilter::SCATTER,
             vtkPointNeighborhoodFilter::SYMMETRIC })
      {
        auto perPoint = MakeFilter(input, operation, radius.first, mode);
        perPoint->SetRadius(0.0); // not used with a radius array
        perPoint->AddSmoothedArray("g");
        vtkNew<ngtest::MessageCollector> messages;
        messages->Watch(perPoint);
        perPoint->Update();
        NG_CHECK(messages->Errors.empty(), radius.first << ", mode " << mode << ": " << messages->AllErrors());
        for (const char* name : { "NeighborCount", "Density", "g_gradient" })
        {
          const auto expected = ngtest::ValuesOf(fixed->GetPolyDataOutput()->GetPointData()->GetArray(name));
          const auto got = ngtest::ValuesOf(perPoint->GetPolyDataOutput()->GetPointData()->GetArray(name));
          NG_CHECK(got.size() == expected.size(), "operation " << operation << ", " << radius.first << ": " << name);
          double worst = 0.0, scale = 0.0;
          for (size_t k = 0; k < got.size() && k < expected.size(); ++k)
          {
            worst = std::max(worst, std::fabs(got[k] - expected[k]));
            scale = std::max(scale, std::fabs(expected[k]));
          }
          NG_CHECK(worst <= 1e-5 * scale, "operation " << operation << ", radius array '" << radius.first
                                                       << "', mode " << mode << ": " << name << " differs by "
                                                       << worst << " from the fixed Radius's");
        }
      }
    }
  }
}

void TestGradientLayout(vtkPolyData* input)
{
  auto filter = MakeFilter(input, vtkPointNeighborhoodFilter::GRADIENT, "r", vtkPointNeighborhoodFilter::SYMMETRIC);
  filter->AddSmoothedArray("f");
  filter->AddSmoothedArray("g");
  filter->Update();
  vtkPointData* pd = filter->GetPolyDataOutput()->GetPointData();
  auto* f = vtkFloatArray::SafeDownCast(pd->GetArray("f_gradient"));
  auto* g = vtkFloatArray::SafeDownCast(pd->GetArray("g_gradient"));
  NG_CHECK(f && f->GetNumberOfComponents() == 3 && f->GetNumberOfTuples() == Count, "f_gradient: float, 3 components");
  NG_CHECK(g && g->GetNumberOfComponents() == 6, "g_gradient: float, 6 components");
  NG_CHECK(pd->GetArray("Density"), "Gradient writes Density");
  if (f && g)
  {
    NG_CHECK(std::string(f->GetComponentName(0)) == "d/dx" && std::string(f->GetComponentName(2)) == "d/dz",
      "f_gradient component names");
    NG_CHECK(std::string(g->GetComponentName(4)) == "d1/dy", "g_gradient component 4 is d1/dy");
  }
}

void TestComposite(vtkPolyData* input)
{
  vtkNew<vtkMultiBlockDataSet> blocks;
  blocks->SetBlock(0, input);
  auto empty = vtkSmartPointer<vtkPolyData>::New();
  ngtest::AddPointArray<vtkFloatArray>(empty, "r", 1, [](vtkIdType, int) { return 1.0; });
  ngtest::AddPointArray<vtkDoubleArray>(empty, "g", 2, [](vtkIdType, int) { return 0.0; });
  blocks->SetBlock(1, empty);
  auto filter = MakeFilter(blocks, vtkPointNeighborhoodFilter::GRADIENT, "r", vtkPointNeighborhoodFilter::GATHER);
  filter->AddSmoothedArray("g");
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "composite: " << messages->AllErrors());
  auto* output = vtkMultiBlockDataSet::SafeDownCast(filter->GetOutputDataObject(0));
  auto* full = output ? vtkPointSet::SafeDownCast(output->GetBlock(0)) : nullptr;
  auto* none = output ? vtkPointSet::SafeDownCast(output->GetBlock(1)) : nullptr;
  NG_CHECK(full && full->GetPointData()->GetArray("g_gradient") &&
      full->GetPointData()->GetArray("g_gradient")->GetNumberOfTuples() == Count,
    "composite: block 0 has g_gradient");
  vtkDataArray* emptyGradient = none ? none->GetPointData()->GetArray("g_gradient") : nullptr;
  NG_CHECK(emptyGradient && emptyGradient->GetNumberOfComponents() == 6 && emptyGradient->GetNumberOfTuples() == 0 &&
      none->GetPointData()->GetArray("Density"),
    "composite: the empty block has an empty 6-component g_gradient and Density");
}

void TestProbe(vtkPolyData* input)
{
  auto probePoints = ngtest::MakeCloud(ngtest::RandomCoordinates(50, 5.0, 8), VTK_DOUBLE);
  vtkNew<vtkPointNeighborhoodProbe> probe;
  NG_CHECK(probe->GetSmoothingLengthMode() == vtkPointNeighborhoodFilter::SCATTER, "the probe's default is SCATTER");
  probe->SetBackend(Backend);
  probe->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  probe->SetInputArrayToProcess(
    vtkPointNeighborhoodFilter::RADIUS_ARRAY, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "r");
  probe->SetInputData(input);
  probe->SetSourceData(probePoints);
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(probe);
  probe->Update();
  NG_CHECK(messages->Errors.empty(), "probe, SCATTER: " << messages->AllErrors());
  const std::vector<double> xyz = ngtest::CoordinatesOf(input);
  const std::vector<double> queries = ngtest::CoordinatesOf(probePoints);
  const std::vector<double> radii = ngtest::ValuesOf(input->GetPointData()->GetArray("r"));
  const auto got = ngtest::ValuesOf(vtkDataSet::SafeDownCast(probe->GetOutput())->GetPointData()->GetArray("NeighborCount"));
  bool same = got.size() == 50;
  for (vtkIdType q = 0; same && q < 50; ++q)
  {
    int expected = 0;
    for (vtkIdType j = 0; j < Count; ++j)
    {
      expected += neighborgrid::withinRadius(&queries[3 * q], &xyz[3 * j], radii[j]) ? 1 : 0;
    }
    same = got[q] == expected;
  }
  NG_CHECK(same, "probe, SCATTER: counts differ from the brute force");

  for (int mode : { vtkPointNeighborhoodFilter::GATHER, vtkPointNeighborhoodFilter::SYMMETRIC })
  {
    messages->Clear();
    probe->SetSmoothingLengthMode(mode);
    probe->Update();
    NG_CHECK(messages->ErrorContains("only SmoothingLengthMode Scatter applies"),
      "probe, mode " << mode << ": " << messages->AllErrors());
  }
  messages->Clear();
  probe->SetSmoothingLengthMode(vtkPointNeighborhoodFilter::SCATTER);
  probe->SetOperation(vtkPointNeighborhoodFilter::GRADIENT);
  probe->AddSmoothedArray("f");
  probe->Update();
  NG_CHECK(messages->ErrorContains("particles only"), "probe, GRADIENT: " << messages->AllErrors());
}

void TestBadRadius(vtkPolyData* input)
{
  auto bad = vtkSmartPointer<vtkPolyData>::New();
  bad->ShallowCopy(input);
  ngtest::AddPointArray<vtkDoubleArray>(bad, "rbad", 1, [](vtkIdType i, int) {
    return i == 42 ? std::numeric_limits<double>::infinity() : 1.0;
  });
  const ngtest::Snapshot before = ngtest::Snapshot::Of(bad);
  auto filter = MakeFilter(bad, vtkPointNeighborhoodFilter::DENSITY, "rbad", vtkPointNeighborhoodFilter::GATHER);
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->Update();
  NG_CHECK(messages->ErrorContains("'rbad'") && messages->ErrorContains("point 42"),
    "an infinite radius: " << messages->AllErrors());
  NG_CHECK(filter->GetPolyDataOutput()->GetNumberOfPoints() == 0, "an infinite radius: the output is not empty");
  NG_CHECK(ngtest::Snapshot::Of(bad) == before, "an infinite radius: the input was modified");
}

} // namespace

int main(int argc, char* argv[])
{
  Backend = ngtest::BackendFromArguments(argc, argv, TestName);
  auto input = MakeInput();
  TestCounts(input);
  TestConstantRadii(input);
  TestGradientLayout(input);
  TestComposite(input);
  TestProbe(input);
  TestBadRadius(input);
  return ngtest::ExitCode(TestName);
}
