// vtkPointNeighborhoodFilter on composite datasets: the composite pipeline runs it block by block
// (each block on its own), keeps the structure and the block types, passes empty blocks through
// with empty result arrays, reports an error in one block without failing the others, and never
// modifies the input.
//
// Usage: TestPointNeighborhoodFilterComposite [CPU|CUDA] (CUDA: exits 77 without a usable device).
#include "NeighborGridFilterTesting.h"

#include <vtkCellType.h>
#include <vtkCompositeDataIterator.h>
#include <vtkCompositeDataSet.h>
#include <vtkInformation.h>
#include <vtkMultiBlockDataSet.h>
#include <vtkPartitionedDataSet.h>
#include <vtkPartitionedDataSetCollection.h>
#include <vtkUnstructuredGrid.h>

#include <map>

namespace
{

const char* const TestName = "TestPointNeighborhoodFilterComposite";
constexpr double Tolerance = 1e-5;
constexpr double Radius = 0.75;
int Backend = vtkPointNeighborhoodFilter::BACKEND_CPU;

/// A cloud of `count` points in a box of 8, with "temperature" and "mass" point arrays.
template <typename DataT>
vtkSmartPointer<DataT> MakeBlock(vtkIdType count, unsigned seed, int type, double offset = 0.0)
{
  auto polydata = ngtest::MakeCloud(ngtest::RandomCoordinates(count, 8.0, seed, offset), type);
  auto block = vtkSmartPointer<DataT>::New();
  block->SetPoints(polydata->GetPoints());
  if (auto* grid = vtkUnstructuredGrid::SafeDownCast(block))
  {
    grid->Allocate(count);
    for (vtkIdType i = 0; i < count; ++i)
    {
      grid->InsertNextCell(VTK_VERTEX, 1, &i);
    }
  }
  const auto xyz = ngtest::CoordinatesOf(block);
  ngtest::AddPointArray<vtkDoubleArray>(block, "temperature", 1,
    [&](vtkIdType i, int) { return 2.0 + std::sin(xyz[3 * i] - offset); });
  ngtest::AddPointArray<vtkFloatArray>(block, "mass", 1, [](vtkIdType i, int) { return 1.0 + (i % 3); });
  return block;
}

/// Brute-force expectations for one block (processed on its own, as the filter must).
void CheckBlock(vtkPointSet* in, vtkPointSet* out, int operation, const std::string& what)
{
  NG_CHECK(out, what << ": no output block");
  if (!out)
  {
    return;
  }
  NG_CHECK(std::string(out->GetClassName()) == in->GetClassName(),
    what << ": output block is a " << out->GetClassName() << ", input a " << in->GetClassName());
  NG_CHECK(out->GetNumberOfPoints() == in->GetNumberOfPoints(), what << ": point count changed");
  NG_CHECK(!ngtest::InfoEntries(out).empty(), what << ": no NeighborGridInfo");
  const auto lists = ngtest::BruteForceNeighbors(ngtest::CoordinatesOf(in), Radius);
  if (operation == vtkPointNeighborhoodFilter::NEIGHBOR_COUNT)
  {
    const auto counts = ngtest::ValuesOf(out->GetPointData()->GetArray("NeighborCount"));
    int wrong = counts.size() == lists.sure.size() ? 0 : 1;
    for (size_t i = 0; !wrong && i < counts.size(); ++i)
    {
      wrong += (counts[i] < lists.sure[i] || counts[i] > lists.sure[i] + lists.borderline[i]) ? 1 : 0;
    }
    NG_CHECK(wrong == 0, what << ": " << wrong << " wrong neighbor counts");
    return;
  }
  const auto mass = ngtest::ValuesOf(in->GetPointData()->GetArray("mass"));
  const double densityError = ngtest::MaxRelativeError(
    ngtest::ValuesOf(out->GetPointData()->GetArray("Density")),
    ngtest::ReferenceDensity(lists, mass, vtkPointNeighborhoodFilter::CUBIC_SPLINE, 3, Radius));
  NG_CHECK(densityError <= Tolerance, what << ": density relative error " << densityError);
  const double smoothingError = ngtest::MaxRelativeError(
    ngtest::ValuesOf(out->GetPointData()->GetArray("temperature_smoothed")),
    ngtest::ReferenceSmoothing(lists, ngtest::ValuesOf(in->GetPointData()->GetArray("temperature")),
      1, mass, vtkPointNeighborhoodFilter::CUBIC_SPLINE, 3, Radius, true));
  NG_CHECK(smoothingError <= Tolerance, what << ": smoothing relative error " << smoothingError);
}

/// Input and output leaves side by side (same traversal order: the output copies the structure).
std::vector<std::pair<vtkDataObject*, vtkDataObject*>> Leaves(vtkCompositeDataSet* in, vtkCompositeDataSet* out)
{
  std::vector<std::pair<vtkDataObject*, vtkDataObject*>> leaves;
  vtkSmartPointer<vtkCompositeDataIterator> iterator;
  iterator.TakeReference(in->NewIterator());
  for (iterator->InitTraversal(); !iterator->IsDoneWithTraversal(); iterator->GoToNextItem())
  {
    leaves.emplace_back(iterator->GetCurrentDataObject(), out ? out->GetDataSet(iterator) : nullptr);
  }
  return leaves;
}

std::map<vtkDataObject*, ngtest::Snapshot> SnapshotLeaves(vtkCompositeDataSet* composite)
{
  std::map<vtkDataObject*, ngtest::Snapshot> snapshots;
  for (const auto& leaf : Leaves(composite, nullptr))
  {
    snapshots[leaf.first] = ngtest::Snapshot::Of(vtkPointSet::SafeDownCast(leaf.first));
  }
  return snapshots;
}

// ---------------------------------------------------------------------------------------------
void TestMultiBlock()
{
  vtkNew<vtkMultiBlockDataSet> input;
  input->SetBlock(0, MakeBlock<vtkPolyData>(1500, 11, VTK_FLOAT));
  input->GetMetaData(0u)->Set(vtkCompositeDataSet::NAME(), "particlesA");
  input->SetBlock(1, MakeBlock<vtkPolyData>(1000, 12, VTK_DOUBLE, 1e6));
  input->SetBlock(2, MakeBlock<vtkUnstructuredGrid>(800, 13, VTK_FLOAT));
  auto empty = vtkSmartPointer<vtkPolyData>::New();
  ngtest::AddPointArray<vtkDoubleArray>(empty, "temperature", 1, [](vtkIdType, int) { return 0.0; });
  input->SetBlock(3, empty);
  vtkNew<vtkMultiBlockDataSet> nested;
  nested->SetBlock(0, MakeBlock<vtkPolyData>(500, 14, VTK_DOUBLE));
  input->SetBlock(4, nested);
  input->SetBlock(5, nullptr);
  const auto before = SnapshotLeaves(input);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetBackend(Backend);
  filter->SetRadius(Radius);
  filter->SetOperation(vtkPointNeighborhoodFilter::KERNEL_SMOOTHING);
  filter->SetNormalization(vtkPointNeighborhoodFilter::SPH);
  filter->AddSmoothedArray("temperature");
  filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  filter->SetInputData(input);
  filter->Update();

  NG_CHECK(messages->Errors.empty(), "multiblock: unexpected error " << messages->AllErrors());
  auto* output = vtkMultiBlockDataSet::SafeDownCast(filter->GetOutputDataObject(0));
  NG_CHECK(output, "multiblock: the output is not a vtkMultiBlockDataSet");
  if (!output)
  {
    return;
  }
  NG_CHECK(output->GetNumberOfBlocks() == 6 && !output->GetBlock(5),
    "multiblock: the block structure changed");
  NG_CHECK(vtkMultiBlockDataSet::SafeDownCast(output->GetBlock(4)), "multiblock: nesting lost");
  NG_CHECK(SnapshotLeaves(input) == before, "multiblock: the input was modified");

  int processed = 0;
  for (const auto& leaf : Leaves(input, output))
  {
    auto* in = vtkPointSet::SafeDownCast(leaf.first);
    auto* out = vtkPointSet::SafeDownCast(leaf.second);
    if (in->GetNumberOfPoints() == 0)
    {
      // The empty block passes through with empty result arrays, not as an error.
      NG_CHECK(out && out->GetNumberOfPoints() == 0, "multiblock: empty block output missing");
      auto* density = out ? out->GetPointData()->GetArray("Density") : nullptr;
      auto* smoothed = out ? out->GetPointData()->GetArray("temperature_smoothed") : nullptr;
      NG_CHECK(density && density->GetNumberOfTuples() == 0, "multiblock: empty block lacks Density");
      NG_CHECK(smoothed && smoothed->GetNumberOfTuples() == 0,
        "multiblock: empty block lacks temperature_smoothed");
      NG_CHECK(ngtest::HasEntryStartingWith(ngtest::InfoEntries(out), "skipped="),
        "multiblock: empty block's NeighborGridInfo does not say it was skipped");
      continue;
    }
    CheckBlock(in, out, vtkPointNeighborhoodFilter::KERNEL_SMOOTHING,
      "multiblock block with " + std::to_string(in->GetNumberOfPoints()) + " points");
    ++processed;
  }
  NG_CHECK(processed == 4, "multiblock: " << processed << " blocks processed, expected 4");

  const std::string runInfo = filter->GetLastRunInfo();
  NG_CHECK(runInfo.find("'particlesA'") != std::string::npos &&
      runInfo.find("skipped=") != std::string::npos && runInfo.find("backend=") != std::string::npos,
    "multiblock: GetLastRunInfo() does not describe the blocks:\n" << runInfo);

  // The same filter, now on a plain point set: an empty one is an error again (the composite
  // state does not stick), and a non-empty one runs as a plain input.
  messages->Clear();
  auto emptyPlain = vtkSmartPointer<vtkPolyData>::New();
  filter->SetInputData(emptyPlain);
  filter->Update();
  NG_CHECK(messages->ErrorContains("no points"), "plain empty input after a composite: no error");
  messages->Clear();
  filter->SetInputData(input->GetBlock(0));
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "plain input after a composite: " << messages->AllErrors());
  NG_CHECK(std::string(filter->GetLastRunInfo()).find("[block") == std::string::npos,
    "plain input after a composite: LastRunInfo still describes blocks");
  CheckBlock(vtkPointSet::SafeDownCast(input->GetBlock(0)), vtkPointSet::SafeDownCast(filter->GetOutput()),
    vtkPointNeighborhoodFilter::KERNEL_SMOOTHING, "plain input after a composite");
}

// ---------------------------------------------------------------------------------------------
void TestPartitionedDataSetCollection()
{
  vtkNew<vtkPartitionedDataSetCollection> input;
  vtkNew<vtkPartitionedDataSet> first;
  first->SetPartition(0, MakeBlock<vtkPolyData>(700, 21, VTK_FLOAT));
  first->SetPartition(1, MakeBlock<vtkUnstructuredGrid>(600, 22, VTK_DOUBLE));
  vtkNew<vtkPartitionedDataSet> second;
  second->SetPartition(0, MakeBlock<vtkPolyData>(900, 23, VTK_DOUBLE, -5e5));
  second->SetPartition(1, vtkSmartPointer<vtkPolyData>::New());
  input->SetPartitionedDataSet(0, first);
  input->SetPartitionedDataSet(1, second);
  const auto before = SnapshotLeaves(input);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetBackend(Backend);
  filter->SetRadius(Radius);
  filter->SetOperation(vtkPointNeighborhoodFilter::NEIGHBOR_COUNT);
  filter->SetInputData(input);
  filter->Update();

  NG_CHECK(messages->Errors.empty(), "PDC: unexpected error " << messages->AllErrors());
  auto* output = vtkPartitionedDataSetCollection::SafeDownCast(filter->GetOutputDataObject(0));
  NG_CHECK(output, "PDC: the output is not a vtkPartitionedDataSetCollection");
  if (!output)
  {
    return;
  }
  NG_CHECK(output->GetNumberOfPartitionedDataSets() == 2 && output->GetNumberOfPartitions(0) == 2 &&
      output->GetNumberOfPartitions(1) == 2,
    "PDC: the partition structure changed");
  NG_CHECK(SnapshotLeaves(input) == before, "PDC: the input was modified");
  int processed = 0;
  for (const auto& leaf : Leaves(input, output))
  {
    auto* in = vtkPointSet::SafeDownCast(leaf.first);
    auto* out = vtkPointSet::SafeDownCast(leaf.second);
    if (in->GetNumberOfPoints() == 0)
    {
      auto* counts = out ? out->GetPointData()->GetArray("NeighborCount") : nullptr;
      NG_CHECK(counts && counts->GetNumberOfTuples() == 0, "PDC: empty partition lacks NeighborCount");
      continue;
    }
    CheckBlock(in, out, vtkPointNeighborhoodFilter::NEIGHBOR_COUNT,
      "PDC partition with " + std::to_string(in->GetNumberOfPoints()) + " points");
    ++processed;
  }
  NG_CHECK(processed == 3, "PDC: " << processed << " partitions processed, expected 3");
}

// ---------------------------------------------------------------------------------------------
/// An error in one block (its mass array is missing) is reported naming the block; that block's
/// output is empty and the other blocks are still computed.
void TestErrorInOneBlock()
{
  vtkNew<vtkMultiBlockDataSet> input;
  input->SetBlock(0, MakeBlock<vtkPolyData>(600, 31, VTK_FLOAT));
  auto withoutMass = MakeBlock<vtkPolyData>(600, 32, VTK_FLOAT);
  withoutMass->GetPointData()->RemoveArray("mass");
  input->SetBlock(1, withoutMass);
  input->GetMetaData(1u)->Set(vtkCompositeDataSet::NAME(), "massless");
  const auto before = SnapshotLeaves(input);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  filter->SetBackend(Backend);
  filter->SetRadius(Radius);
  filter->SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, "mass");
  filter->SetInputData(input);
  filter->Update();

  NG_CHECK(messages->ErrorContains("'mass'") && messages->ErrorContains("'massless'"),
    "error in one block: the message does not name the array and the block: " << messages->AllErrors());
  auto* output = vtkMultiBlockDataSet::SafeDownCast(filter->GetOutputDataObject(0));
  NG_CHECK(output, "error in one block: no composite output");
  if (!output)
  {
    return;
  }
  auto* good = vtkPointSet::SafeDownCast(output->GetBlock(0));
  auto* bad = vtkPointSet::SafeDownCast(output->GetBlock(1));
  NG_CHECK(good && good->GetPointData()->GetArray("Density") && good->GetNumberOfPoints() == 600,
    "error in one block: the good block was not computed");
  NG_CHECK(!bad || (bad->GetNumberOfPoints() == 0 && !bad->GetPointData()->GetArray("Density")),
    "error in one block: the failed block's output is not empty");
  NG_CHECK(SnapshotLeaves(input) == before, "error in one block: the input was modified");
}

} // namespace

int main(int argc, char* argv[])
{
  Backend = ngtest::BackendFromArguments(argc, argv, TestName);
  TestMultiBlock();
  TestPartitionedDataSetCollection();
  TestErrorInOneBlock();
  return ngtest::ExitCode(TestName);
}
