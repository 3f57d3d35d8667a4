// The one-process path costs nothing beyond the engine: with one process and no ghost points,
// vtkPointNeighborhoodFilter hands the caller's own arrays to the engine (no converted copy, no
// per-point pass of the MPI layer), in one engine run per Update. Engine::setRunObserver sees each
// request as the engine receives it. A ghost point in the input takes the distributed path, whose
// prologue is reported: the case that shows the check can fail. And no pass at all: the
// coordinates and masses live in pages that stay unreadable until the engine receives them
// (mprotect), so any per-point pass before the engine faults and fails the test.
#include "NeighborGridFilterTesting.h"

#include "vtkPointNeighborhoodProbe.h"

#include <vtkDataSetAttributes.h>
#include <vtkUnsignedCharArray.h>

#include <csignal>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace
{

const char* const TestName = "TestPointNeighborhoodFilterFastPath";

/// The requests the engine received during one Update.
struct Observed
{
  std::vector<neighborgrid::Request> requests;
  void Watch()
  {
    requests.clear();
    neighborgrid::Engine::setRunObserver([this](const neighborgrid::Request& r) { requests.push_back(r); });
  }
};

const void* PointsOf(vtkPointSet* cloud)
{
  return cloud->GetPoints()->GetData()->GetVoidPointer(0);
}

bool HasPrologue(vtkDataObject* output)
{
  return ngtest::HasEntryStartingWith(ngtest::InfoEntries(output), "stage.distributed prologue_ms=");
}

void AddGhostArray(vtkPolyData* cloud, vtkIdType ghostPoint)
{
  vtkNew<vtkUnsignedCharArray> ghosts;
  ghosts->SetName(vtkDataSetAttributes::GhostArrayName());
  ghosts->SetNumberOfTuples(cloud->GetNumberOfPoints());
  ghosts->FillValue(0);
  if (ghostPoint >= 0)
  {
    ghosts->SetValue(ghostPoint, vtkDataSetAttributes::DUPLICATEPOINT);
  }
  cloud->GetPointData()->AddArray(ghosts);
}

void CheckParticles(int coordinateType, int operation, Observed& observed)
{
  const std::string what = std::string(coordinateType == VTK_FLOAT ? "float" : "double") + " points, operation " +
    std::to_string(operation);
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(5000, 10.0, 21), coordinateType);
  vtkNew<vtkFloatArray> mass;
  mass->SetName("mass");
  mass->SetNumberOfTuples(cloud->GetNumberOfPoints());
  mass->FillValue(2.0f);
  cloud->GetPointData()->AddArray(mass);
  vtkNew<vtkFloatArray> field;
  field->SetName("field");
  field->SetNumberOfComponents(2);
  field->SetNumberOfTuples(cloud->GetNumberOfPoints());
  field->FillValue(1.0f);
  cloud->GetPointData()->AddArray(field);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  filter->SetInputData(cloud);
  filter->SetRadius(0.8);
  filter->SetOperation(operation);
  filter->SetInputArrayToProcess(vtkPointNeighborhoodFilter::MASS_ARRAY, 0, 0,
    vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  filter->AddSmoothedArray("field");

  observed.Watch();
  filter->Update();
  NG_CHECK(observed.requests.size() == 1, what << ": " << observed.requests.size() << " engine runs, expected 1");
  if (!observed.requests.empty())
  {
    const neighborgrid::Request& r = observed.requests[0];
    NG_CHECK(r.points.xyz == PointsOf(cloud), what << ": the engine did not receive the caller's coordinate array");
    NG_CHECK(r.points.count == cloud->GetNumberOfPoints(), what << ": " << r.points.count << " points");
    if (operation == vtkPointNeighborhoodFilter::DENSITY)
    {
      NG_CHECK(r.mass == mass->GetPointer(0), what << ": the engine did not receive the caller's mass array");
    }
    if (operation == vtkPointNeighborhoodFilter::KERNEL_SMOOTHING)
    {
      NG_CHECK(!r.smoothed.empty() && r.smoothed[0].values == field->GetPointer(0),
        what << ": the engine did not receive the caller's array to smooth");
    }
  }
  NG_CHECK(!HasPrologue(filter->GetOutput()), what << ": a distributed prologue ran with one process");

  // A ghost array without ghost points: still the caller's arrays.
  AddGhostArray(cloud, -1);
  filter->Modified();
  observed.Watch();
  filter->Update();
  NG_CHECK(observed.requests.size() == 1 && observed.requests[0].points.xyz == PointsOf(cloud),
    what << ", ghost array without ghost points: the engine did not receive the caller's coordinates");
  NG_CHECK(!HasPrologue(filter->GetOutput()), what << ", ghost array without ghost points: a prologue ran");

  // A ghost point (a copy of point 0, as a neighboring piece would carry it): the distributed
  // path leaves it out of the particles, so the engine gets other arrays, and the prologue is
  // reported.
  cloud->GetPoints()->SetPoint(1, cloud->GetPoints()->GetPoint(0));
  cloud->GetPointData()->RemoveArray(vtkDataSetAttributes::GhostArrayName());
  AddGhostArray(cloud, 1);
  filter->Modified();
  observed.Watch();
  filter->Update();
  NG_CHECK(!observed.requests.empty() && observed.requests[0].points.xyz != PointsOf(cloud),
    what << ", one ghost point: the engine received the caller's array, ghost point included");
  NG_CHECK(HasPrologue(filter->GetOutput()), what << ", one ghost point: no prologue time in NeighborGridInfo");
}

void CheckProbe(Observed& observed)
{
  auto particles = ngtest::MakeCloud(ngtest::RandomCoordinates(4000, 10.0, 22), VTK_FLOAT);
  auto probe = ngtest::MakeCloud(ngtest::RandomCoordinates(300, 10.0, 23), VTK_DOUBLE);
  vtkNew<vtkPointNeighborhoodProbe> filter;
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  filter->SetInputData(particles); // the particles are the input, the probe the source
  filter->SetSourceData(probe);
  filter->SetRadius(0.8);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  observed.Watch();
  filter->Update();
  NG_CHECK(observed.requests.size() == 1, "probe: " << observed.requests.size() << " engine runs, expected 1");
  if (!observed.requests.empty())
  {
    const neighborgrid::Request& r = observed.requests[0];
    NG_CHECK(r.source.xyz == PointsOf(particles), "probe: the engine did not receive the particles' own array");
    NG_CHECK(r.points.xyz == PointsOf(probe), "probe: the engine did not receive the probe's own array");
  }
  NG_CHECK(!HasPrologue(filter->GetOutput()), "probe: a distributed prologue ran with one process");
}


#if defined(__linux__)
/// `count` values of T in pages of their own that can be made unreadable.
template <class T>
class GuardedValues
{
public:
  explicit GuardedValues(std::size_t count)
    : bytes_(((count * sizeof(T)) / pageSize() + 1) * pageSize())
  {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<T*>(p);
  }
  ~GuardedValues()
  {
    if (data_)
    {
      munmap(data_, bytes_);
    }
  }
  T* data() const { return data_; }
  void setReadable(bool readable) const
  {
    mprotect(data_, bytes_, readable ? PROT_READ | PROT_WRITE : PROT_NONE);
  }

private:
  static std::size_t pageSize() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  std::size_t bytes_;
  T* data_ = nullptr;
};

extern "C" void OnFault(int)
{
  const char message[] = "TestPointNeighborhoodFilterFastPath: FAILED: the filter read the coordinates or masses "
                         "before the engine received them (a per-point pass or copy on the one-process path)\n";
  (void)!write(2, message, sizeof(message) - 1);
  _exit(1);
}

/// One process, no ghosts: the filter must not touch a coordinate or a mass before the engine.
template <class T>
void CheckNoPassBeforeTheEngine(int vtkType, int operation)
{
  const vtkIdType n = 20000;
  const std::vector<double> xyz = ngtest::RandomCoordinates(n, 12.0, 24);
  GuardedValues<T> coordinates(3 * static_cast<std::size_t>(n));
  GuardedValues<float> masses(static_cast<std::size_t>(n));
  std::copy(xyz.begin(), xyz.end(), coordinates.data());
  std::fill_n(masses.data(), n, 1.5f);
  vtkSmartPointer<vtkDataArray> coordinateArray;
  coordinateArray.TakeReference(vtkDataArray::CreateDataArray(vtkType));
  coordinateArray->SetNumberOfComponents(3);
  coordinateArray->SetVoidArray(coordinates.data(), 3 * n, 1); // 1: the test owns the memory
  vtkNew<vtkPoints> points;
  points->SetData(coordinateArray);
  vtkNew<vtkPolyData> cloud;
  cloud->SetPoints(points);
  vtkNew<vtkFloatArray> mass;
  mass->SetName("mass");
  mass->SetArray(masses.data(), n, 1);
  cloud->GetPointData()->AddArray(mass);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  filter->SetInputData(cloud);
  filter->SetRadius(0.9);
  filter->SetOperation(operation);
  filter->SetInputArrayToProcess(vtkPointNeighborhoodFilter::MASS_ARRAY, 0, 0,
    vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  int runs = 0;
  neighborgrid::Engine::setRunObserver([&](const neighborgrid::Request&) {
    ++runs;
    coordinates.setReadable(true);
    masses.setReadable(true);
  });
  coordinates.setReadable(false);
  masses.setReadable(false);
  filter->Update(); // faults (OnFault) on a read before the engine
  coordinates.setReadable(true);
  masses.setReadable(true);
  neighborgrid::Engine::setRunObserver(nullptr);
  NG_CHECK(runs == 1, "guarded run: " << runs << " engine runs, expected 1");
  auto* output = vtkPolyData::SafeDownCast(filter->GetOutput());
  const char* result = operation == vtkPointNeighborhoodFilter::DENSITY ? "Density" : "NeighborCount";
  NG_CHECK(output && output->GetPointData()->GetArray(result) &&
      output->GetPointData()->GetArray(result)->GetNumberOfTuples() == n,
    "guarded run: no " << result << " array of " << n << " values");
}
#endif

} // namespace

int main()
{
#if defined(__linux__)
  std::signal(SIGSEGV, OnFault);
  std::signal(SIGBUS, OnFault);
  CheckNoPassBeforeTheEngine<float>(VTK_FLOAT, vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  CheckNoPassBeforeTheEngine<double>(VTK_DOUBLE, vtkPointNeighborhoodFilter::DENSITY);
  std::signal(SIGSEGV, SIG_DFL);
  std::signal(SIGBUS, SIG_DFL);
#endif
  Observed observed;
  for (int type : { VTK_FLOAT, VTK_DOUBLE })
  {
    for (auto operation : { vtkPointNeighborhoodFilter::NEIGHBOR_COUNT, vtkPointNeighborhoodFilter::DENSITY,
           vtkPointNeighborhoodFilter::KERNEL_SMOOTHING })
    {
      CheckParticles(type, operation, observed);
    }
  }
  CheckProbe(observed);
  neighborgrid::Engine::setRunObserver(nullptr);
  return ngtest::ExitCode(TestName);
}
