// SMOOTHING_LENGTH through the VTK API: "SupportRadius" equal, bit for bit, to a brute force in
// double (the k-th smallest exact squared distance, its square root rounded up to float) on a
// clustered cloud with coincident points, in an open and in a periodic box; Radius and a radius
// array are not read; the result fed back as the radius array gives every point k neighbors;
// composite blocks (an empty one gets an empty array); and the errors: too few points, a probe.
// Plugin/TestPointNeighborhoodMPI.py checks it under MPI and with ghost points.
#include "NeighborGridFilterTesting.h"
#include "vtkPointNeighborhoodProbe.h"

#include <vtkMultiBlockDataSet.h>

#include <algorithm>
#include <random>

namespace
{

const char* const TestName = "TestPointNeighborhoodSmoothingLength";
int Backend = vtkPointNeighborhoodFilter::BACKEND_CPU;
constexpr vtkIdType Count = 1500;
constexpr double Box = 6.0;

/// 1500 float points in [0, 6)^3: a third in two tight clusters, every tenth point a copy of the
/// one before (coincident points), the rest uniform.
vtkSmartPointer<vtkPolyData> MakeInput()
{
  std::vector<double> xyz = ngtest::RandomCoordinates(Count, Box, 29);
  std::mt19937_64 random(31);
  std::normal_distribution<double> spread(0.0, 0.05);
  for (vtkIdType i = 0; i < Count; ++i)
  {
    for (int a = 0; a < 3 && i % 3 == 0; ++a)
    {
      const double center = (i % 2 == 0) ? 1.5 : 4.5;
      xyz[3 * i + a] = std::min(Box - 1e-3, std::max(0.0, center + spread(random)));
    }
    for (int a = 0; a < 3 && i % 10 == 9; ++a)
    {
      xyz[3 * i + a] = xyz[3 * (i - 1) + a];
    }
  }
  return ngtest::MakeCloud(xyz, VTK_FLOAT);
}

/// The smallest float R with R * R >= s (the square of a float is exact in double).
float RoundedUpRoot(double s)
{
  float r = static_cast<float>(std::sqrt(s));
  r = double(r) * double(r) < s ? std::nextafter(r, HUGE_VALF) : r;
  const float below = std::nextafter(r, 0.0f);
  return double(below) * double(below) >= s ? below : r;
}

double SquaredDistance(const double* a, const double* b)
{
  const double dx = a[0] - b[0], dy = a[1] - b[1], dz = a[2] - b[2];
  return (dx * dx + dy * dy) + dz * dz; // withinRadius's formula (DESIGN.md)
}

/// The k-th nearest other point of every point, rounded as the filter writes it. `periodicBox`:
/// over the images x_j + m L, m in {-1, 0, 1} per axis, enough for a k-th below L (checked).
std::vector<double> BruteForce(const std::vector<double>& xyz, int k, bool periodicBox)
{
  const vtkIdType n = static_cast<vtkIdType>(xyz.size() / 3);
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<double> squared;
  const int shell = periodicBox ? 1 : 0;
  for (vtkIdType i = 0; i < n; ++i)
  {
    squared.clear();
    for (vtkIdType j = 0; j < n; ++j)
    {
      for (int mx = -shell; mx <= shell; ++mx)
        for (int my = -shell; my <= shell; ++my)
          for (int mz = -shell; mz <= shell; ++mz)
          {
            const int m[3] = { mx, my, mz };
            if (j == i && mx == 0 && my == 0 && mz == 0)
            {
              continue;
            }
            double y[3];
            for (int a = 0; a < 3; ++a)
            {
              y[a] = m[a] == 0 ? xyz[3 * j + a] : xyz[3 * j + a] + m[a] * Box;
            }
            squared.push_back(SquaredDistance(&xyz[3 * i], y));
          }
    }
    std::nth_element(squared.begin(), squared.begin() + (k - 1), squared.end());
    out[static_cast<size_t>(i)] = RoundedUpRoot(squared[static_cast<size_t>(k - 1)]);
    NG_CHECK(!periodicBox || out[static_cast<size_t>(i)] < Box, "the periodic reference needs k-th distances below L");
  }
  return out;
}

vtkSmartPointer<vtkPointNeighborhoodFilter> MakeFilter(vtkDataObject* input, int k)
{
  auto filter = vtkSmartPointer<vtkPointNeighborhoodFilter>::New();
  filter->SetBackend(Backend);
  filter->SetOperation(vtkPointNeighborhoodFilter::SMOOTHING_LENGTH);
  filter->SetNeighborTarget(k);
  filter->SetInputData(input);
  return filter;
}

/// Runs and returns "SupportRadius" (empty, with a check failed, on an error).
std::vector<double> SupportRadiusOf(vtkPointNeighborhoodFilter* filter, const std::string& what)
{
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->Update();
  NG_CHECK(messages->Errors.empty(), what << ": " << messages->AllErrors());
  auto* output = vtkPointSet::SafeDownCast(filter->GetOutputDataObject(0));
  return ngtest::ValuesOf(output ? output->GetPointData()->GetArray("SupportRadius") : nullptr);
}

void TestAgainstBruteForce(vtkPolyData* input)
{
  const std::vector<double> xyz = ngtest::CoordinatesOf(input);
  for (int k : { 1, 9, 64 })
  {
    for (bool periodic : { false, true })
    {
      auto filter = MakeFilter(input, k);
      filter->SetRadius(-1.0); // not read by Smoothing Length
      if (periodic)
      {
        filter->SetPeriodic(1, 1, 1);
        filter->SetBoxLengths(Box, Box, Box);
      }
      const std::string what = "k = " + std::to_string(k) + (periodic ? ", periodic" : ", open");
      const std::vector<double> got = SupportRadiusOf(filter, what);
      const std::vector<double> expected = BruteForce(xyz, k, periodic);
      vtkIdType wrong = 0;
      for (size_t i = 0; i < got.size(); ++i)
      {
        wrong += got[i] == expected[i] ? 0 : 1;
      }
      NG_CHECK(got.size() == expected.size() && wrong == 0,
        what << ": " << wrong << " of " << got.size() << " support radii differ from the brute force");
      const auto info = ngtest::InfoEntries(filter->GetOutput());
      NG_CHECK(ngtest::InfoValue(info, "operation") == "Smoothing Length" &&
          ngtest::InfoValue(info, "neighbor_target") == std::to_string(k) &&
          ngtest::HasEntryStartingWith(info, "radius_levels="),
        what << ": NeighborGridInfo says what ran");
    }
  }
}

/// A radius array selected by mistake is not read; the result selected as the radius array of a
/// Gather neighbor count gives every point at least k neighbors (R is rounded up), more only
/// where distances tie with the k-th (coincident points).
void TestFeedsRadiusArray(vtkPolyData* input)
{
  constexpr int k = 24;
  auto lengths = MakeFilter(input, k);
  lengths->SetInputArrayToProcess(
    vtkPointNeighborhoodFilter::RADIUS_ARRAY, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "no such array");
  const std::vector<double> radii = SupportRadiusOf(lengths, "with a stale radius array");
  NG_CHECK(radii.size() == static_cast<size_t>(Count), "with a stale radius array: one radius per point");

  auto counts = vtkSmartPointer<vtkPointNeighborhoodFilter>::New();
  counts->SetBackend(Backend);
  counts->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  counts->SetInputConnection(lengths->GetOutputPort());
  counts->SetInputArrayToProcess(
    vtkPointNeighborhoodFilter::RADIUS_ARRAY, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "SupportRadius");
  counts->Update();
  const std::vector<double> got =
    ngtest::ValuesOf(counts->GetPolyDataOutput()->GetPointData()->GetArray("NeighborCount"));
  NG_CHECK(got.size() == static_cast<size_t>(Count), "the neighbor count ran on the support radii");
  double sum = 0.0, fewest = 1e9;
  for (double c : got)
  {
    sum += c;
    fewest = std::min(fewest, c);
  }
  NG_CHECK(fewest >= k, "every point has at least k neighbors within its support radius (fewest " << fewest << ")");
  NG_CHECK(got.empty() || sum / got.size() < k + 1, "on average about k neighbors (" << sum / got.size() << ")");
}

void TestComposite(vtkPolyData* input)
{
  vtkNew<vtkMultiBlockDataSet> blocks;
  blocks->SetBlock(0, input);
  blocks->SetBlock(1, vtkNew<vtkPolyData>());
  auto filter = MakeFilter(blocks, 16);
  filter->Update();
  auto* output = vtkMultiBlockDataSet::SafeDownCast(filter->GetOutputDataObject(0));
  auto* first = output ? vtkPolyData::SafeDownCast(output->GetBlock(0)) : nullptr;
  auto* empty = output ? vtkPolyData::SafeDownCast(output->GetBlock(1)) : nullptr;
  const std::vector<double> expected = BruteForce(ngtest::CoordinatesOf(input), 16, false);
  NG_CHECK(first && ngtest::ValuesOf(first->GetPointData()->GetArray("SupportRadius")) == expected,
    "composite: the first block's support radii match the brute force");
  NG_CHECK(empty && empty->GetPointData()->GetArray("SupportRadius") &&
      empty->GetPointData()->GetArray("SupportRadius")->GetNumberOfTuples() == 0,
    "composite: the empty block gets an empty SupportRadius array");
}

void TestErrors(vtkPolyData* input)
{
  vtkNew<vtkPolyData> few;
  few->SetPoints(vtkNew<vtkPoints>());
  for (int i = 0; i < 10; ++i)
  {
    few->GetPoints()->InsertNextPoint(i, 0.5 * i, 0.0);
  }
  auto filter = MakeFilter(few, 10);
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->Update();
  NG_CHECK(messages->AllErrors().find("k = 10 other points") != std::string::npos &&
      filter->GetPolyDataOutput()->GetNumberOfPoints() == 0,
    "too few points: an error that says so and an empty output (" << messages->AllErrors() << ")");
  NG_CHECK(!few->GetPointData()->GetArray("SupportRadius"), "too few points: the input is untouched");

  auto probe = vtkSmartPointer<vtkPointNeighborhoodProbe>::New();
  probe->SetBackend(Backend);
  probe->SetOperation(vtkPointNeighborhoodFilter::SMOOTHING_LENGTH);
  probe->SetInputData(input);
  probe->SetSourceData(few);
  vtkNew<ngtest::MessageCollector> probeMessages;
  probeMessages->Watch(probe);
  probe->Update();
  NG_CHECK(probeMessages->AllErrors().find("at the particles only") != std::string::npos,
    "a probe: an error that says Smoothing Length is computed at the particles (" << probeMessages->AllErrors()
                                                                                 << ")");
}

} // namespace

int main(int argc, char* argv[])
{
  Backend = ngtest::BackendFromArguments(argc, argv, TestName);
  auto input = MakeInput();
  TestAgainstBruteForce(input);
  TestFeedsRadiusArray(input);
  TestComposite(input);
  TestErrors(input);
  return ngtest::ExitCode(TestName);
}
