// vtkPointNeighborhoodFilter on bad input: every case must report an error through vtkErrorMacro
// (seen here by an ErrorEvent observer) that says what is wrong, leave the output empty, leave
// the input untouched, and leave the filter usable for the next, valid, update.
#include "NeighborGridFilterTesting.h"

#include <cstdlib>
#include <functional>
#include <limits>

namespace
{

const char* const TestName = "TestPointNeighborhoodFilterErrors";

/// 500 points with a float "mass", a string array "labels", a 3-component "vec", a double
/// "temperature" and a 1-component "badMass" holding a NaN at point 5.
vtkSmartPointer<vtkPolyData> MakeInput()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(500, 5.0, 42), VTK_FLOAT);
  ngtest::AddPointArray<vtkFloatArray>(cloud, "mass", 1, [](vtkIdType, int) { return 1.0; });
  ngtest::AddPointArray<vtkDoubleArray>(cloud, "vec", 3, [](vtkIdType i, int c) { return i + c; });
  ngtest::AddPointArray<vtkDoubleArray>(cloud, "temperature", 1, [](vtkIdType i, int) { return i; });
  ngtest::AddPointArray<vtkDoubleArray>(cloud, "badMass", 1, [](vtkIdType i, int) {
    return i == 5 ? std::numeric_limits<double>::quiet_NaN() : 1.0;
  });
  vtkNew<vtkStringArray> labels;
  labels->SetName("labels");
  labels->SetNumberOfValues(500);
  for (vtkIdType i = 0; i < 500; ++i)
  {
    labels->SetValue(i, "p" + std::to_string(i));
  }
  cloud->GetPointData()->AddArray(labels);
  return cloud;
}

/// A copy of `source` whose coordinates (new vtkPoints) have `value` at point `index`, axis 1.
vtkSmartPointer<vtkPolyData> WithCoordinate(vtkPolyData* source, vtkIdType index, double value)
{
  auto copy = vtkSmartPointer<vtkPolyData>::New();
  copy->ShallowCopy(source);
  vtkNew<vtkPoints> points;
  points->DeepCopy(source->GetPoints());
  double p[3];
  points->GetPoint(index, p);
  p[1] = value;
  points->SetPoint(index, p);
  copy->SetPoints(points);
  return copy;
}

struct ErrorCase
{
  std::string name;
  std::function<void(vtkPointNeighborhoodFilter*)> configure;
  vtkSmartPointer<vtkPolyData> input;
  std::vector<std::string> expectedTexts; // every one must appear in the error message
};

void RunErrorCase(const ErrorCase& test)
{
  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  filter->SetRadius(0.75);
  test.configure(filter);
  const ngtest::Snapshot before = ngtest::Snapshot::Of(test.input);
  filter->SetInputData(test.input);
  filter->Update();

  NG_CHECK(!messages->Errors.empty(), test.name << ": no error reported");
  for (const std::string& text : test.expectedTexts)
  {
    NG_CHECK(messages->ErrorContains(text),
      test.name << ": the error does not mention '" << text << "': " << messages->AllErrors());
  }
  auto* output = vtkPointSet::SafeDownCast(filter->GetOutput());
  NG_CHECK(output && output->GetNumberOfPoints() == 0 &&
      output->GetPointData()->GetNumberOfArrays() == 0 && ngtest::InfoEntries(output).empty(),
    test.name << ": the output is not empty");
  NG_CHECK(ngtest::Snapshot::Of(test.input) == before, test.name << ": the input was modified");
  NG_CHECK(std::string(filter->GetLastRunInfo()).rfind("error=", 0) == 0,
    test.name << ": GetLastRunInfo() does not report the error: " << filter->GetLastRunInfo());

  // The filter recovers: the same filter with valid settings on a valid input succeeds.
  messages->Clear();
  filter->SetRadius(0.75);
  filter->SetMass(1.0);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  auto valid = MakeInput();
  filter->SetInputData(valid);
  filter->Update();
  NG_CHECK(messages->Errors.empty() && filter->GetPolyDataOutput()->GetPointData()->GetArray("Density"),
    test.name << ": the filter does not recover: " << messages->AllErrors());
}

} // namespace

int main()
{
  const auto input = MakeInput();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  using F = vtkPointNeighborhoodFilter;
  auto massArray = [](const char* name, int association = vtkDataObject::FIELD_ASSOCIATION_POINTS) {
    return [=](F* f) {
      f->SetOperation(F::DENSITY);
      f->SetInputArrayToProcess(0, 0, 0, association, name);
    };
  };
  auto smoothing = [](std::vector<const char*> names) {
    return [=](F* f) {
      f->SetOperation(F::KERNEL_SMOOTHING);
      for (const char* name : names)
      {
        f->AddSmoothedArray(name);
      }
    };
  };

  std::vector<ErrorCase> cases = {
    { "empty input", [](F*) {}, vtkSmartPointer<vtkPolyData>::New(), { "no points" } },
    { "radius 0", [](F* f) { f->SetRadius(0.0); }, input, { "radius", "0" } },
    { "negative radius", [](F* f) { f->SetRadius(-1.0); }, input, { "radius", "-1" } },
    { "NaN radius", [=](F* f) { f->SetRadius(nan); }, input, { "radius", "nan" } },
    { "infinite radius", [=](F* f) { f->SetRadius(inf); }, input, { "radius", "inf" } },
    { "missing mass array", massArray("noSuchArray"), input, { "'noSuchArray'", "mass" } },
    { "string mass array", massArray("labels"), input, { "'labels'", "vtkStringArray" } },
    { "3-component mass array", massArray("vec"), input, { "'vec'", "3 components" } },
    { "cell mass array", massArray("mass", vtkDataObject::FIELD_ASSOCIATION_CELLS), input,
      { "point array" } },
    { "missing mass array, SPH smoothing",
      [](F* f) {
        f->SetOperation(F::KERNEL_SMOOTHING);
        f->SetNormalization(F::SPH);
        f->AddSmoothedArray("temperature");
        f->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "noSuchArray");
      },
      input, { "'noSuchArray'" } },
    { "non-finite mass value", massArray("badMass"), input, { "mass", "point 5" } },
    { "non-finite constant mass", [=](F* f) { f->SetMass(nan); }, input, { "mass" } },
    { "missing smoothed array", smoothing({ "temperature", "noSuchArray" }), input,
      { "'noSuchArray'" } },
    { "string smoothed array", smoothing({ "labels" }), input, { "'labels'", "vtkStringArray" } },
    { "no smoothed arrays", smoothing({}), input, { "at least one" } },
    { "NaN coordinate", [](F*) {}, WithCoordinate(input, 17, nan), { "point 17", "nan" } },
    { "infinite coordinate", [](F*) {}, WithCoordinate(input, 42, -inf), { "point 42", "inf" } },
    { "NaN coordinate, neighbor count", [](F* f) { f->SetOperation(F::NEIGHBOR_COUNT); },
      WithCoordinate(input, 499, nan), { "point 499" } },
  };
  std::string why;
  if (!neighborgrid::Engine::cudaAvailable(&why))
  {
    cases.push_back({ "CUDA unavailable", [](F* f) { f->SetBackend(F::BACKEND_CUDA); }, input,
      { "CUDA", why } });
  }
  else
  {
    std::cout << "CUDA is usable here: the 'CUDA unavailable' case does not apply" << std::endl;
  }
  for (const ErrorCase& test : cases)
  {
    RunErrorCase(test);
  }

  // A misspelled benchmarking knob is an error, not a silent default; unset, the filter runs.
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    vtkNew<ngtest::MessageCollector> messages;
    messages->Watch(filter);
    filter->SetRadius(0.75);
    filter->SetInputData(input);
    const ngtest::Snapshot before = ngtest::Snapshot::Of(input);
    setenv("NEIGHBORGRID_TRANSFER_MEMORY", "off", 1);
    filter->Update();
    unsetenv("NEIGHBORGRID_TRANSFER_MEMORY");
    NG_CHECK(messages->ErrorContains("NEIGHBORGRID_TRANSFER_MEMORY is 'off'"),
      "a misspelled NEIGHBORGRID_TRANSFER_MEMORY is not reported: " << messages->AllErrors());
    NG_CHECK(ngtest::Snapshot::Of(input) == before, "the knob's error modified the input");
    messages->Clear();
    filter->Modified();
    filter->Update();
    NG_CHECK(messages->Errors.empty() && filter->GetPolyDataOutput()->GetPointData()->GetArray("Density"),
      "the filter does not run once the knob is unset: " << messages->AllErrors());
  }

  // Not errors: a missing mass array does not matter where the mass is unused.
  for (int operation : { F::NEIGHBOR_COUNT, F::KERNEL_SMOOTHING })
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    vtkNew<ngtest::MessageCollector> messages;
    messages->Watch(filter);
    filter->SetBackend(F::BACKEND_CPU);
    filter->SetOperation(operation);
    filter->AddSmoothedArray("temperature");
    filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "noSuchArray");
    filter->SetInputData(input);
    filter->Update();
    NG_CHECK(messages->Errors.empty(),
      "operation " << operation << " without mass fails on a missing mass array: "
                   << messages->AllErrors());
  }
  return ngtest::ExitCode(TestName);
}
