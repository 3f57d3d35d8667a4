// NeighborGrid in a VTK C++ application: the SPH density of a point cloud with
// vtkPointNeighborhoodFilter.
//
//   NeighborGridVTKExample                   a random cloud of 20,000 points in a box of 10^3, R = 1
//   NeighborGridVTKExample cloud.vtp [R]     a polydata file; its point array "mass", when present,
//                                            gives the masses (R defaults to 5, e.g. angstrom for
//                                            Data/popc-membrane.vtp)
//
// The backend is Auto: a CUDA GPU when one is usable, the CPU otherwise. The program prints what
// ran, the range and mean of the density and its first values; it fails when the filter fails.
#include <vtkDataArray.h>
#include <vtkFieldData.h>
#include <vtkFloatArray.h>
#include <vtkMinimalStandardRandomSequence.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPointNeighborhoodFilter.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkSmartPointer.h>
#include <vtkXMLPolyDataReader.h>

#include <cstdlib>
#include <iostream>

namespace
{

vtkSmartPointer<vtkPolyData> RandomCloud(vtkIdType count, double box)
{
  vtkNew<vtkMinimalStandardRandomSequence> random;
  random->SetSeed(2024);
  vtkNew<vtkPoints> points;
  points->SetDataTypeToFloat();
  points->SetNumberOfPoints(count);
  for (vtkIdType i = 0; i < count; ++i)
  {
    double p[3];
    for (double& coordinate : p)
    {
      coordinate = random->GetNextRangeValue(0.0, box);
    }
    points->SetPoint(i, p);
  }
  auto cloud = vtkSmartPointer<vtkPolyData>::New();
  cloud->SetPoints(points);
  return cloud;
}

} // namespace

int main(int argc, char* argv[])
{
  vtkSmartPointer<vtkPolyData> cloud;
  double radius = 1.0;
  if (argc > 1)
  {
    vtkNew<vtkXMLPolyDataReader> reader;
    reader->SetFileName(argv[1]);
    reader->Update();
    cloud = reader->GetOutput();
    radius = argc > 2 ? std::atof(argv[2]) : 5.0;
    std::cout << "Read " << cloud->GetNumberOfPoints() << " points from " << argv[1] << "\n";
  }
  else
  {
    cloud = RandomCloud(20000, 10.0);
    std::cout << "Built a random cloud of " << cloud->GetNumberOfPoints() << " points\n";
  }

  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetInputData(cloud);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  filter->SetKernel(vtkPointNeighborhoodFilter::CUBIC_SPLINE);
  filter->SetRadius(radius);
  if (cloud->GetPointData()->GetArray("mass"))
  {
    filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  }
  filter->Update();

  auto* output = vtkPolyData::SafeDownCast(filter->GetOutput());
  auto* density =
    output ? vtkFloatArray::SafeDownCast(output->GetPointData()->GetArray("Density")) : nullptr;
  if (!density || density->GetNumberOfTuples() != cloud->GetNumberOfPoints())
  {
    std::cerr << "vtkPointNeighborhoodFilter failed:\n" << filter->GetLastRunInfo();
    return EXIT_FAILURE;
  }

  std::cout << "Density with radius " << radius << ", cubic spline kernel:\n"
            << filter->GetLastRunInfo();
  double range[2];
  density->GetRange(range);
  double sum = 0.0;
  for (vtkIdType i = 0; i < density->GetNumberOfTuples(); ++i)
  {
    sum += density->GetValue(i);
  }
  std::cout << "Density range [" << range[0] << ", " << range[1]
            << "], mean " << sum / density->GetNumberOfTuples() << "\nFirst values:";
  for (vtkIdType i = 0; i < 5 && i < density->GetNumberOfTuples(); ++i)
  {
    std::cout << " " << density->GetValue(i);
  }
  std::cout << std::endl;
  return range[0] > 0.0 ? EXIT_SUCCESS : EXIT_FAILURE; // every point is its own neighbor
}
