// Helpers shared by the vtkPointNeighborhoodFilter tests: a failure counter, an error observer,
// reproducible point clouds, double-precision brute-force references written from DESIGN.md's
// formulas (independent of the engine), and a snapshot that proves the input was not modified.
#pragma once

#include "vtkPointNeighborhoodFilter.h"

#include <NeighborGrid/NeighborGrid.h>

#include <vtkAbstractArray.h>
#include <vtkCommand.h>
#include <vtkDataArray.h>
#include <vtkDoubleArray.h>
#include <vtkExecutive.h>
#include <vtkFieldData.h>
#include <vtkFloatArray.h>
#include <vtkIntArray.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPointSet.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkSmartPointer.h>
#include <vtkStringArray.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace ngtest
{

// ---------------------------------------------------------------------------------------------
// Failure accounting: every CHECK that fails prints where and why and counts; main() returns
// EXIT_FAILURE when any failed.
inline int& Failures()
{
  static int failures = 0;
  return failures;
}

#define NG_CHECK(condition, message)                                                              \
  do                                                                                              \
  {                                                                                               \
    if (!(condition))                                                                             \
    {                                                                                             \
      ++ngtest::Failures();                                                                       \
      std::cerr << __FILE__ << ":" << __LINE__ << ": FAILED: " #condition ": " << message        \
                << std::endl;                                                                     \
    }                                                                                             \
  } while (false)

inline int ExitCode(const char* testName)
{
  if (Failures() == 0)
  {
    std::cout << testName << ": all checks passed" << std::endl;
    return EXIT_SUCCESS;
  }
  std::cerr << testName << ": " << Failures() << " check(s) failed" << std::endl;
  return EXIT_FAILURE;
}

/// The backend named on the command line ("CPU" default, or "CUDA"). For CUDA, exits with 77
/// (CTest SKIP_RETURN_CODE) when no CUDA device is usable, so a GPU test never passes vacuously.
inline int BackendFromArguments(int argc, char* argv[], const char* testName)
{
  const std::string name = argc > 1 ? argv[1] : "CPU";
  if (name == "CUDA")
  {
    std::string why;
    if (!neighborgrid::Engine::cudaAvailable(&why))
    {
      std::cout << testName << ": SKIPPED, CUDA backend not usable: " << why << std::endl;
      std::exit(77);
    }
    return vtkPointNeighborhoodFilter::BACKEND_CUDA;
  }
  if (name != "CPU")
  {
    std::cerr << testName << ": unknown backend '" << name << "' (CPU or CUDA)" << std::endl;
    std::exit(EXIT_FAILURE);
  }
  return vtkPointNeighborhoodFilter::BACKEND_CPU;
}

// ---------------------------------------------------------------------------------------------
/// Collects the error and warning messages an object emits (vtkErrorMacro invokes ErrorEvent on
/// the object when it has an observer, instead of printing).
class MessageCollector : public vtkCommand
{
public:
  static MessageCollector* New() { return new MessageCollector; }
  vtkBaseTypeMacro(MessageCollector, vtkCommand);

  void Execute(vtkObject*, unsigned long eventId, void* callData) override
  {
    const char* text = static_cast<const char*>(callData);
    (eventId == vtkCommand::ErrorEvent ? this->Errors : this->Warnings)
      .emplace_back(text ? text : "");
  }

  /// Watch `filter` and its executive (which reports "returned failure for request").
  void Watch(vtkAlgorithm* filter)
  {
    filter->AddObserver(vtkCommand::ErrorEvent, this);
    filter->AddObserver(vtkCommand::WarningEvent, this);
    filter->GetExecutive()->AddObserver(vtkCommand::ErrorEvent, this);
    filter->GetExecutive()->AddObserver(vtkCommand::WarningEvent, this);
  }

  bool ErrorContains(const std::string& text) const
  {
    return std::any_of(this->Errors.begin(), this->Errors.end(),
      [&](const std::string& message) { return message.find(text) != std::string::npos; });
  }
  std::string AllErrors() const
  {
    std::string all;
    for (const auto& message : this->Errors)
    {
      all += "[" + message + "] ";
    }
    return all.empty() ? std::string("(no error)") : all;
  }
  void Clear()
  {
    this->Errors.clear();
    this->Warnings.clear();
  }

  std::vector<std::string> Errors;
  std::vector<std::string> Warnings;
};

// ---------------------------------------------------------------------------------------------
/// Uniform random coordinates in [offset, offset + box)^3 (z = offset when planar).
inline std::vector<double> RandomCoordinates(
  vtkIdType count, double box, unsigned seed, double offset = 0.0, bool planar = false)
{
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> uniform(0.0, box);
  std::vector<double> xyz(static_cast<size_t>(3 * count));
  for (vtkIdType i = 0; i < count; ++i)
  {
    xyz[3 * i + 0] = offset + uniform(random);
    xyz[3 * i + 1] = offset + uniform(random);
    xyz[3 * i + 2] = planar ? offset : offset + uniform(random);
  }
  return xyz;
}

/// A polydata with the given coordinates stored as `vtkType` (VTK_FLOAT, VTK_DOUBLE, VTK_INT...).
inline vtkSmartPointer<vtkPolyData> MakeCloud(const std::vector<double>& xyz, int vtkType)
{
  vtkNew<vtkPoints> points;
  points->SetDataType(vtkType);
  const vtkIdType count = static_cast<vtkIdType>(xyz.size() / 3);
  points->SetNumberOfPoints(count);
  for (vtkIdType i = 0; i < count; ++i)
  {
    points->SetPoint(i, &xyz[3 * i]);
  }
  auto cloud = vtkSmartPointer<vtkPolyData>::New();
  cloud->SetPoints(points);
  return cloud;
}

/// The coordinates as the filter sees them (after rounding to the points' storage type).
inline std::vector<double> CoordinatesOf(vtkPointSet* cloud)
{
  const vtkIdType count = cloud->GetNumberOfPoints();
  std::vector<double> xyz(static_cast<size_t>(3 * count));
  for (vtkIdType i = 0; i < count; ++i)
  {
    cloud->GetPoint(i, &xyz[3 * i]);
  }
  return xyz;
}

/// Adds a point array of `components` components, values from `value(point, component)`.
template <typename ArrayT, typename Function>
ArrayT* AddPointArray(vtkPointSet* cloud, const char* name, int components, Function value)
{
  vtkNew<ArrayT> array;
  array->SetName(name);
  array->SetNumberOfComponents(components);
  array->SetNumberOfTuples(cloud->GetNumberOfPoints());
  for (vtkIdType i = 0; i < cloud->GetNumberOfPoints(); ++i)
  {
    for (int c = 0; c < components; ++c)
    {
      array->SetTypedComponent(i, c, static_cast<typename ArrayT::ValueType>(value(i, c)));
    }
  }
  cloud->GetPointData()->AddArray(array);
  return array;
}

/// Values of any numeric array as double, tuple after tuple.
inline std::vector<double> ValuesOf(vtkDataArray* array)
{
  std::vector<double> values;
  if (!array)
  {
    return values;
  }
  const int components = array->GetNumberOfComponents();
  values.resize(static_cast<size_t>(array->GetNumberOfTuples() * components));
  for (vtkIdType i = 0; i < array->GetNumberOfTuples(); ++i)
  {
    for (int c = 0; c < components; ++c)
    {
      values[static_cast<size_t>(i * components + c)] = array->GetComponent(i, c);
    }
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// References in double, from DESIGN.md (not from the engine's code).
constexpr double Pi = 3.14159265358979323846;

inline double CutoffFactor(int kernel)
{
  switch (kernel)
  {
    case vtkPointNeighborhoodFilter::QUARTIC_SPLINE:
      return 2.5;
    case vtkPointNeighborhoodFilter::QUINTIC_SPLINE:
      return 3.0;
    default:
      return 2.0;
  }
}

/// W(r, h) = sigma_d h^-d w(q), q = r / h, h = R / cutoff factor (DESIGN.md's table).
inline double KernelW(int kernel, int dimension, double radius, double r)
{
  const double h = radius / CutoffFactor(kernel);
  const double q = r / h;
  auto plus = [](double a) { return a > 0.0 ? a : 0.0; };
  const bool planar = dimension == 2;
  double sigma = 0.0, w = 0.0;
  switch (kernel)
  {
    case vtkPointNeighborhoodFilter::CUBIC_SPLINE:
      sigma = planar ? 10.0 / (7.0 * Pi) : 1.0 / Pi;
      w = 0.25 * std::pow(plus(2 - q), 3) - std::pow(plus(1 - q), 3);
      break;
    case vtkPointNeighborhoodFilter::QUARTIC_SPLINE:
      sigma = planar ? 96.0 / (1199.0 * Pi) : 1.0 / (20.0 * Pi);
      w = std::pow(plus(2.5 - q), 4) - 5 * std::pow(plus(1.5 - q), 4) +
        10 * std::pow(plus(0.5 - q), 4);
      break;
    case vtkPointNeighborhoodFilter::QUINTIC_SPLINE:
      sigma = planar ? 7.0 / (478.0 * Pi) : 1.0 / (120.0 * Pi);
      w = std::pow(plus(3 - q), 5) - 6 * std::pow(plus(2 - q), 5) + 15 * std::pow(plus(1 - q), 5);
      break;
    case vtkPointNeighborhoodFilter::WENDLAND_C2:
      sigma = planar ? 7.0 / (4.0 * Pi) : 21.0 / (16.0 * Pi);
      w = q < 2 ? std::pow(1 - q / 2, 4) * (1 + 2 * q) : 0.0;
      break;
  }
  return sigma / std::pow(h, dimension) * w;
}

/// All pairs (i, j), j != i, with |x_i - x_j| <= R (1 + slack), by brute force in double. A pair
/// whose distance lies within the slack of R is "borderline": float rounding may put it on
/// either side of R, so neighbor counts are checked against [sure, sure + borderline].
struct NeighborLists
{
  std::vector<std::vector<vtkIdType>> neighbors; // self excluded
  std::vector<std::vector<double>> distances;
  std::vector<int> sure;       // neighbors with distance <= R (1 - slack)
  std::vector<int> borderline; // neighbors with R (1 - slack) < distance <= R (1 + slack)
  vtkIdType totalBorderline = 0;
};

inline NeighborLists BruteForceNeighbors(const std::vector<double>& xyz, double radius)
{
  constexpr double slack = 1e-6;
  const vtkIdType count = static_cast<vtkIdType>(xyz.size() / 3);
  NeighborLists lists;
  lists.neighbors.resize(static_cast<size_t>(count));
  lists.distances.resize(static_cast<size_t>(count));
  lists.sure.assign(static_cast<size_t>(count), 0);
  lists.borderline.assign(static_cast<size_t>(count), 0);
  const double outer = radius * (1 + slack), inner = radius * (1 - slack);
  for (vtkIdType i = 0; i < count; ++i)
  {
    for (vtkIdType j = 0; j < count; ++j)
    {
      if (i == j)
      {
        continue;
      }
      const double dx = xyz[3 * i] - xyz[3 * j], dy = xyz[3 * i + 1] - xyz[3 * j + 1],
                   dz = xyz[3 * i + 2] - xyz[3 * j + 2];
      const double d = std::sqrt(dx * dx + dy * dy + dz * dz);
      if (d <= outer)
      {
        lists.neighbors[i].push_back(j);
        lists.distances[i].push_back(d);
        if (d <= inner)
        {
          ++lists.sure[i];
        }
        else
        {
          ++lists.borderline[i];
          ++lists.totalBorderline;
        }
      }
    }
  }
  return lists;
}

/// rho_i = sum_j m_j W_ij, self included.
inline std::vector<double> ReferenceDensity(const NeighborLists& lists,
  const std::vector<double>& mass, int kernel, int dimension, double radius)
{
  const size_t count = lists.neighbors.size();
  std::vector<double> density(count);
  const double w0 = KernelW(kernel, dimension, radius, 0.0);
  for (size_t i = 0; i < count; ++i)
  {
    double sum = mass[i] * w0;
    for (size_t k = 0; k < lists.neighbors[i].size(); ++k)
    {
      sum += mass[static_cast<size_t>(lists.neighbors[i][k])] *
        KernelW(kernel, dimension, radius, lists.distances[i][k]);
    }
    density[i] = sum;
  }
  return density;
}

/// Shepard: f_i = sum_j W_ij f_j / sum_j W_ij. SPH: f_i = sum_j (m_j / rho_j) f_j W_ij.
inline std::vector<double> ReferenceSmoothing(const NeighborLists& lists,
  const std::vector<double>& values, int components, const std::vector<double>& mass,
  int kernel, int dimension, double radius, bool sph)
{
  const size_t count = lists.neighbors.size();
  const std::vector<double> density =
    sph ? ReferenceDensity(lists, mass, kernel, dimension, radius) : std::vector<double>();
  std::vector<double> result(count * static_cast<size_t>(components));
  const double w0 = KernelW(kernel, dimension, radius, 0.0);
  for (size_t i = 0; i < count; ++i)
  {
    for (int c = 0; c < components; ++c)
    {
      auto weight = [&](size_t j, double w) { return sph ? mass[j] / density[j] * w : w; };
      double sum = weight(i, w0) * values[i * components + c];
      double weights = weight(i, w0);
      for (size_t k = 0; k < lists.neighbors[i].size(); ++k)
      {
        const size_t j = static_cast<size_t>(lists.neighbors[i][k]);
        const double w = KernelW(kernel, dimension, radius, lists.distances[i][k]);
        sum += weight(j, w) * values[j * components + c];
        weights += weight(j, w);
      }
      result[i * components + c] = sph ? sum : sum / weights;
    }
  }
  return result;
}

/// Largest |got - expected| / |expected| (expected never 0 in these tests); HUGE_VAL when the
/// sizes differ or a value is NaN. NEIGHBORGRID_TEST_VERBOSE=1 prints every comparison's margin.
inline double MaxRelativeError(const std::vector<double>& got, const std::vector<double>& expected)
{
  if (got.size() != expected.size() || got.empty())
  {
    return HUGE_VAL;
  }
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
  {
    const double error = std::abs(got[i] - expected[i]) / std::max(std::abs(expected[i]), 1e-300);
    if (!(error <= worst)) // also catches NaN
    {
      worst = std::isnan(error) ? HUGE_VAL : error;
    }
  }
  if (std::getenv("NEIGHBORGRID_TEST_VERBOSE"))
  {
    std::cout << "  max relative error " << worst << " over " << got.size() << " values\n";
  }
  return worst;
}

// ---------------------------------------------------------------------------------------------
/// Everything about a point set that the filter must not change.
struct Snapshot
{
  vtkMTimeType dataMTime = 0, pointsMTime = 0, pointDataMTime = 0;
  vtkIdType pointCount = 0;
  std::vector<double> coordinates;
  std::vector<std::string> pointArrayNames, fieldArrayNames;
  std::vector<vtkMTimeType> pointArrayMTimes;
  std::vector<std::vector<double>> pointArrayValues;

  static Snapshot Of(vtkPointSet* data)
  {
    Snapshot s;
    s.dataMTime = data->GetMTime();
    s.pointsMTime = data->GetPoints() ? data->GetPoints()->GetMTime() : 0;
    s.pointDataMTime = data->GetPointData()->GetMTime();
    s.pointCount = data->GetNumberOfPoints();
    s.coordinates = CoordinatesOf(data);
    vtkPointData* pd = data->GetPointData();
    for (int a = 0; a < pd->GetNumberOfArrays(); ++a)
    {
      vtkAbstractArray* array = pd->GetAbstractArray(a);
      s.pointArrayNames.emplace_back(array->GetName() ? array->GetName() : "");
      s.pointArrayMTimes.push_back(array->GetMTime());
      s.pointArrayValues.push_back(ValuesOf(vtkDataArray::SafeDownCast(array)));
    }
    vtkFieldData* fd = data->GetFieldData();
    for (int a = 0; fd && a < fd->GetNumberOfArrays(); ++a)
    {
      vtkAbstractArray* array = fd->GetAbstractArray(a);
      s.fieldArrayNames.emplace_back(array && array->GetName() ? array->GetName() : "");
    }
    return s;
  }

  bool operator==(const Snapshot& o) const
  {
    // NaN coordinates (error tests) compare by bit pattern: a NaN that stayed is unchanged.
    bool sameCoordinates = this->coordinates.size() == o.coordinates.size() &&
      std::memcmp(this->coordinates.data(), o.coordinates.data(),
        this->coordinates.size() * sizeof(double)) == 0;
    bool sameValues = this->pointArrayValues.size() == o.pointArrayValues.size();
    for (size_t a = 0; sameValues && a < this->pointArrayValues.size(); ++a)
    {
      const auto &x = this->pointArrayValues[a], &y = o.pointArrayValues[a];
      sameValues = x.size() == y.size() &&
        std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
    }
    return this->dataMTime == o.dataMTime && this->pointsMTime == o.pointsMTime &&
      this->pointDataMTime == o.pointDataMTime && this->pointCount == o.pointCount &&
      sameCoordinates && this->pointArrayNames == o.pointArrayNames &&
      this->fieldArrayNames == o.fieldArrayNames &&
      this->pointArrayMTimes == o.pointArrayMTimes && sameValues;
  }
  bool operator!=(const Snapshot& o) const { return !(*this == o); }
};

/// The NeighborGridInfo entries of a data object's field data (empty when absent).
inline std::vector<std::string> InfoEntries(vtkDataObject* data)
{
  std::vector<std::string> entries;
  auto* info = data && data->GetFieldData()
    ? vtkStringArray::SafeDownCast(data->GetFieldData()->GetAbstractArray("NeighborGridInfo"))
    : nullptr;
  for (vtkIdType i = 0; info && i < info->GetNumberOfValues(); ++i)
  {
    entries.push_back(info->GetValue(i));
  }
  return entries;
}

inline bool HasEntryStartingWith(const std::vector<std::string>& entries, const std::string& prefix)
{
  return std::any_of(entries.begin(), entries.end(),
    [&](const std::string& e) { return e.compare(0, prefix.size(), prefix) == 0; });
}

/// Value of "key=value" in the entries, or "" when absent.
inline std::string InfoValue(const std::vector<std::string>& entries, const std::string& key)
{
  for (const auto& e : entries)
  {
    if (e.compare(0, key.size() + 1, key + "=") == 0)
    {
      return e.substr(key.size() + 1);
    }
  }
  return std::string();
}

} // namespace ngtest
