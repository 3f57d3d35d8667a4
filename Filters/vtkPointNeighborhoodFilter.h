/**
 * @class   vtkPointNeighborhoodFilter
 * @brief   fixed-radius neighbor operations on point sets, on the GPU (CUDA) or the CPU
 *
 * For every point of a vtkPointSet (polydata, unstructured grid, ...) or of every block of a
 * composite dataset of them, vtkPointNeighborhoodFilter visits all points within the support
 * radius R (|x_i - x_j| <= R, decided exactly in double from the input coordinates: the counts
 * equal a double-precision brute force) and evaluates one operation:
 *
 * - NeighborCount: number of other points within R (int32 array "NeighborCount").
 * - Density: SPH density rho_i = sum_j m_j W(|x_i - x_j|, h), self included, h = R / cutoff
 *   factor of the kernel (float32 array "Density"). Mass from a point array (input array 0,
 *   SetInputArrayToProcess) or the constant Mass.
 * - KernelSmoothing: every array named with AddSmoothedArray, any numeric type and number of
 *   components, smoothed with the kernel (float32 arrays "<name>_smoothed"), Shepard
 *   normalization sum_j W_ij f_j / sum_j W_ij, or SPH normalization sum_j (m_j/rho_j) f_j W_ij
 *   (this also outputs "Density").
 * - Gradient: the SPH gradient of every array named with AddSmoothedArray (the same list as
 *   KernelSmoothing), grad f_i = sum_j (m_j / rho_j) (f_j - f_i) grad_i W(x_i - x_j, h), with
 *   grad_i W = dW/dr (x_i - x_j) / r. Written as float32 "<name>_gradient" with 3 x components
 *   components: d/dx, d/dy, d/dz of component 0, then of component 1, ... (named "d/dx" ... for
 *   one component, "d<component>/dx" ... for several). The density rho is computed in the same
 *   run and written as "Density". Particles only: a probe or volume filter reports an error.
 * - SmoothingLength: for every particle the distance to its k-th nearest other particle
 *   (k = NeighborTarget, default 64), the square root of the exact double squared distance
 *   rounded to float (float32 array "SupportRadius"): a support radius per particle, ready to be
 *   selected as the radius array of a next Point Neighborhood (Density with SmoothingLengthMode
 *   GATHER gives each particle about k neighbors). Other particles at the same position count;
 *   in a periodic box every image counts (a particle's own images included). Radius, the kernel,
 *   the mass and a radius array are not read. Particles only: a probe or volume filter reports an
 *   error. Under MPI and with ghost points the result is the serial one.
 *
 * Per-particle support radii: a point array selected as input array 1 (RADIUS_ARRAY,
 * SetInputArrayToProcess(1, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, name)) gives every
 * particle its own R_i (one component, any numeric type, converted to float; every value finite
 * and > 0) and replaces Radius. SmoothingLengthMode says which radius decides a pair and which
 * smoothing length h = R / cutoff factor the kernel takes:
 * - GATHER (default): j is a neighbor of i when |x_i - x_j| <= R_i; W_ij = W(r, h_i);
 * - SCATTER: when |x_i - x_j| <= R_j; W_ij = W(r, h_j);
 * - SYMMETRIC: when |x_i - x_j| <= max(R_i, R_j); W_ij = (W(r, h_i) + W(r, h_j)) / 2.
 * All operations use these pairs and W_ij (Gradient: grad_i W likewise). With a probe or volume
 * the radii are the particles' (the source's), and only SCATTER applies. The search stays
 * linear however much the radii differ: particles are binned into levels of radii within a
 * factor of 2, each searched on a grid of cells of its own largest radius (README.md).
 *
 * Kernels are VTK's (vtkSPHCubicKernel, vtkSPHQuarticKernel, vtkSPHQuinticKernel,
 * and the Wendland C2 kernel of vtkWendlandQuinticKernel), so results agree with vtkSPHInterpolator.
 * The output shallow-copies the input and adds the arrays above, plus a field-data string array
 * "NeighborGridInfo" (backend, method, device, time per stage; with a radius array also
 * radius_range, smoothing_length_mode, radius_levels and radius_searches). The input is never
 * modified. Each block of a composite dataset is processed on its own. Under MPI (several processes of
 * the controller) results are those of one serial run over all processes' points (SetController).
 *
 * The work runs in the NeighborGrid engine (NeighborGrid/NeighborGrid.h): backend Auto uses a
 * CUDA GPU when one is usable and the CPU otherwise. The filter keeps its engine, so device
 * buffers are reused across updates.
 *
 * Errors (a radius that is not finite and > 0, a point set without points, a missing or
 * non-numeric mass, radius or smoothed array, a mass or radius array of more than one component,
 * a radius value that is not finite and > 0, no smoothed array for KERNEL_SMOOTHING or GRADIENT,
 * a non-finite coordinate or mass, an unusable CUDA backend) are reported
 * with vtkErrorMacro, naming the array, the point or the block concerned; the output is then
 * left empty and the execution fails. An empty block of a composite dataset is not an error: it
 * is passed through with empty result arrays. An abort (AbortExecute) stops the engine at its
 * next progress report and leaves the output empty, without an error.
 */
#ifndef vtkPointNeighborhoodFilter_h
#define vtkPointNeighborhoodFilter_h

#include "NeighborGridFiltersModule.h" // for export macro
#include "vtkPassInputTypeAlgorithm.h"

#include "vtkSmartPointer.h" // for vtkSmartPointer

#include <functional> // for std::function
#include <memory>     // for std::unique_ptr
#include <string>     // for std::string
#include <vector>     // for std::vector

class vtkAbstractArray;
class vtkDataArray;
class vtkDataObject;
class vtkDataSet;
class vtkMultiProcessController;
class vtkPointSet;

class NEIGHBORGRIDFILTERS_EXPORT vtkPointNeighborhoodFilter : public vtkPassInputTypeAlgorithm
{
public:
  static vtkPointNeighborhoodFilter* New();
  vtkTypeMacro(vtkPointNeighborhoodFilter, vtkPassInputTypeAlgorithm);
  void PrintSelf(ostream& os, vtkIndent indent) override;

  // Values match the ParaView plugin's enumerations (Plugin/NeighborGrid.xml).
  enum OperationType
  {
    NEIGHBOR_COUNT = 0,
    DENSITY = 1,
    KERNEL_SMOOTHING = 2,
    GRADIENT = 3,
    SMOOTHING_LENGTH = 4
  };
  /// With a radius array: which radius decides a pair and which h the kernel takes.
  enum SmoothingLengthModeType
  {
    GATHER = 0,   // |x_i - x_j| <= R_i, W(r, h_i)
    SCATTER = 1,  // |x_i - x_j| <= R_j, W(r, h_j)
    SYMMETRIC = 2 // |x_i - x_j| <= max(R_i, R_j), (W(r, h_i) + W(r, h_j)) / 2
  };
  /// The input arrays (SetInputArrayToProcess) the filter reads.
  enum InputArrayIndex
  {
    MASS_ARRAY = 0,
    RADIUS_ARRAY = 1
  };
  enum KernelType
  {
    CUBIC_SPLINE = 0,
    QUARTIC_SPLINE = 1,
    QUINTIC_SPLINE = 2,
    WENDLAND_C2 = 3
  };
  enum NormalizationType
  {
    SHEPARD = 0,
    SPH = 1
  };
  enum BackendType
  {
    BACKEND_AUTO = 0,
    BACKEND_CUDA = 1,
    BACKEND_CPU = 2
  };
  enum MethodType
  {
    METHOD_AUTO = 0,
    METHOD_COUNTING_SORT = 1,
    METHOD_BRUTE_FORCE = 2,
    METHOD_FENNS = 3,      // CUDA only
    METHOD_RADIX_SORT = 4, // CUDA only
    METHOD_CLAWS = 5,      // CUDA only
    METHOD_BAYRAKTAR = 6,  // CUDA only
    METHOD_STAGED_TILES = 7, // CUDA only
    METHOD_RADIUS_TREE = 8   // CUDA only, radii and Gradient at the particles (Auto takes it there)
  };

  ///@{
  /// Support radius R: j is a neighbor of i when |x_i - x_j| <= R. Between 1e-150 and 1e150.
  /// Not used (nor checked) when a radius array is selected (input array 1, see below).
  vtkSetMacro(Radius, double);
  vtkGetMacro(Radius, double);
  ///@}

  ///@{
  /// Operation, default DENSITY.
  vtkSetClampMacro(Operation, int, NEIGHBOR_COUNT, SMOOTHING_LENGTH);
  vtkGetMacro(Operation, int);
  ///@}

  ///@{
  /// SMOOTHING_LENGTH: k, the neighbor whose distance becomes the point's "SupportRadius",
  /// default 64, between 1 and 1024 (the input needs more than k points, or a periodic box).
  vtkSetClampMacro(NeighborTarget, int, 1, 1024);
  vtkGetMacro(NeighborTarget, int);
  ///@}

  ///@{
  /// SPH kernel, default CUBIC_SPLINE.
  vtkSetClampMacro(Kernel, int, CUBIC_SPLINE, WENDLAND_C2);
  vtkGetMacro(Kernel, int);
  ///@}

  ///@{
  /// Kernel dimension (its normalization): 2 or 3, default 3.
  vtkSetClampMacro(Dimension, int, 2, 3);
  vtkGetMacro(Dimension, int);
  ///@}

  ///@{
  /// Constant mass used when no mass array is selected, default 1. The mass array is input
  /// array 0: SetInputArrayToProcess(0, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, name), a
  /// numeric point array of one component. No name, an empty name or "None" (ParaView's none
  /// entry, unless a point array has that name) select no array; any other name that is not a
  /// point array of the input is an error.
  vtkSetMacro(Mass, double);
  vtkGetMacro(Mass, double);
  ///@}

  ///@{
  /// Per-particle support radii: input array 1 (RADIUS_ARRAY),
  /// SetInputArrayToProcess(1, 0, 0, vtkDataObject::FIELD_ASSOCIATION_POINTS, name), a numeric
  /// point array of one component whose values are finite and > 0 (converted to float); it then
  /// replaces Radius. None selected (no name, an empty name or "None", as for the mass array):
  /// Radius for every point. SmoothingLengthMode (default GATHER) says how a pair's two radii
  /// combine (see the class description); it matters only with a radius array.
  vtkSetClampMacro(SmoothingLengthMode, int, GATHER, SYMMETRIC);
  vtkGetMacro(SmoothingLengthMode, int);
  ///@}

  ///@{
  /// Point arrays to smooth (KERNEL_SMOOTHING) or to differentiate (GRADIENT).
  void AddSmoothedArray(const char* name);
  void ClearSmoothedArrays();
  int GetNumberOfSmoothedArrays() const;
  const char* GetSmoothedArray(int index) const;
  ///@}

  ///@{
  /// Normalization of kernel smoothing, default SHEPARD.
  vtkSetClampMacro(Normalization, int, SHEPARD, SPH);
  vtkGetMacro(Normalization, int);
  ///@}

  ///@{
  /// Backend, default BACKEND_AUTO (CUDA if usable, else CPU). BACKEND_CUDA fails with an error
  /// where no CUDA device is usable.
  vtkSetClampMacro(Backend, int, BACKEND_AUTO, BACKEND_CPU);
  vtkGetMacro(Backend, int);
  ///@}

  ///@{
  /// Search method, default METHOD_AUTO.
  vtkSetClampMacro(Method, int, METHOD_AUTO, METHOD_RADIUS_TREE);
  vtkGetMacro(Method, int);
  ///@}

  ///@{
  /// The most memory one run of the engine may take, in MiB (neighborgrid::Engine::setMemoryLimit):
  /// GPU memory on CUDA, the search's buffers on the CPU. 0 (default): no limit beyond the GPU's
  /// free memory. Larger data run in slabs with halos of width Radius; results are unchanged.
  vtkSetClampMacro(MemoryLimit, double, 0.0, 1e12);
  vtkGetMacro(MemoryLimit, double);
  ///@}

  ///@{
  /// Probe and volume filters (vtkPointNeighborhoodProbe, vtkPointNeighborhoodVolume): the value
  /// of smoothed arrays at points with no particle within R (or whose Shepard weights sum to 0),
  /// default 0, and the name of the array that marks the points that have one (1) or not (0),
  /// default "vtkValidPointMask" as vtkSPHInterpolator names it. Count and density are 0 there.
  vtkSetMacro(NullValue, double);
  vtkGetMacro(NullValue, double);
  void SetValidPointMaskArrayName(const char* name) { this->ValidPointMaskArrayName = name ? name : ""; this->Modified(); }
  const char* GetValidPointMaskArrayName() const { return this->ValidPointMaskArrayName.c_str(); }
  ///@}

  ///@{
  /// Periodic box. Periodic (default 0 0 0): per axis, 1 makes the axis periodic: a pair counts
  /// once for every periodic image of the neighbor within R (with R above half a box length,
  /// several images of one point count, as LAMMPS counts them). The box along a periodic axis is
  /// [BoxOrigin, BoxOrigin + BoxLengths). BoxLengths 0 (the default) on a periodic axis takes the
  /// box from the particles' field data: arrays "BoxLengths" and, optionally, "BoxOrigin" (3
  /// values each; origin 0 without it); without either, the filter reports an error. Points
  /// outside the box (unwrapped trajectories) are wrapped for the search only; outputs keep the
  /// input's order and the input is untouched. Probe and volume points see the particles'
  /// images too.
  vtkSetVector3Macro(Periodic, int);
  vtkGetVector3Macro(Periodic, int);
  vtkSetVector3Macro(BoxOrigin, double);
  vtkGetVector3Macro(BoxOrigin, double);
  vtkSetVector3Macro(BoxLengths, double);
  vtkGetVector3Macro(BoxLengths, double);
  ///@}

  ///@{
  /// The processes the particles are spread over (pvbatch, pvserver, or an MPI application),
  /// default vtkMultiProcessController::GetGlobalController(). With several processes the run is
  /// collective (every process executes the filter) and every process's points get exactly the
  /// results of one serial run over the points of all processes: particles within R of another
  /// process's points (or probe points) are sent to it first. Points marked as ghosts
  /// (vtkGhostType DUPLICATEPOINT) are copies: they are not counted as particles and get their
  /// owner's result. Each process takes the CUDA device of its rank among the processes on its
  /// host (modulo the host's devices). See NeighborhoodDistributed.h for what is exchanged.
  /// With a radius array the particles within the largest radius of any process's points are
  /// sent, with their radii; GRADIENT takes the density of those particles from their owners, as
  /// SPH smoothing does. Not supported yet (an error on every process): a radius array or
  /// GRADIENT with ghost points in the input.
  void SetController(vtkMultiProcessController* controller);
  vtkMultiProcessController* GetController();
  ///@}

  /// What the last execution ran on and how long each stage took (also in NeighborGridInfo).
  const char* GetLastRunInfo() const;

protected:
  vtkPointNeighborhoodFilter();
  ~vtkPointNeighborhoodFilter() override;

  int FillInputPortInformation(int port, vtkInformation* info) override;
  int RequestData(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;

  /// Where results are wanted: at the particles themselves, at other points, or on a grid
  /// (point (i, j, k) at Origin + (i, j, k) * Spacing, i fastest).
  struct QuerySpec
  {
    enum Kind
    {
      PARTICLES,
      POINTS,
      GRID
    };
    int Kind = PARTICLES;
    vtkDataArray* Coordinates = nullptr; // POINTS: 3 components
    double Origin[3] = { 0, 0, 0 };
    double Spacing[3] = { 1, 1, 1 };
    vtkIdType Dimensions[3] = { 0, 0, 0 };
    vtkIdType Count = 0; // POINTS and GRID
  };
  struct ComputeResult
  {
    std::vector<vtkSmartPointer<vtkAbstractArray>> Arrays; // one entry per query
    std::vector<std::string> Info;                         // NeighborGridInfo entries
    std::string Error;
    std::string AbortMessage;
  };
  /// Runs the operation with the points and arrays of `particles` as the neighbors. Returns 1
  /// with the result arrays, 0 with Error set (nothing reported yet), 2 when aborted.
  int ComputeNeighborhood(vtkPointSet* particles, const QuerySpec& queries, ComputeResult& result);

  /// ComputeNeighborhood, then its outcome in `output`: after a successful run, `shapeOutput` gives
  /// it its structure (a copy of the input or of the probe, the volume's grid), then come the
  /// result arrays and NeighborGridInfo, added to the field data of `fieldSource`. Returns what
  /// RequestData returns: 1, also when aborted (the output is then left empty: an abort is not an
  /// error), or ReportError's 0.
  int ComputeInto(vtkPointSet* particles, const QuerySpec& queries, vtkDataObject* fieldSource, vtkDataSet* output,
    const std::function<void()>& shapeOutput);

  /// Reports `message` with vtkErrorMacro (naming the block inside a composite execution), leaves
  /// `output` empty and records the error in LastRunInfo. Returns 0, for RequestData to return.
  int ReportError(vtkDataObject* output, const std::string& message);

  /// Checks the properties and the input and builds the engine's request from them, concern by
  /// concern (internal: NeighborhoodRequestBuilder.h).
  class RequestBuilder;

  /// The particles of an input taken as one set: a vtkPointSet as it is; the non-empty vtkPointSet
  /// blocks of a composite dataset appended (their points, and the point arrays that all of them
  /// have). Null with `error` set when there is no point set.
  static vtkSmartPointer<vtkPointSet> GatherParticles(vtkDataObject* input, std::string& error);

  /// Whether a radius array is selected (input array 1 by a name other than "" and "None", or by
  /// attribute type). Decided from the properties alone, so every process decides alike.
  bool RadiusArraySelected();

  /// The largest support radius of `particles`: Radius without a radius array; with one, its
  /// largest finite value (0 when it has none or is not usable).
  double LargestRadius(vtkPointSet* particles);

  /// Whether a composite input runs block by block (this filter) or whole (probe and volume).
  virtual bool ProcessesBlocksSeparately() const { return true; }

  /// Adds the NeighborGridInfo field-data array (and keeps the output's own field data).
  static void AttachInfo(vtkDataObject* source, vtkDataObject* output, const std::vector<std::string>& info);
  /// Records `info` as LastRunInfo (inside a composite execution: as the current block's part).
  void SetLastRunInfo(const std::vector<std::string>& info);

  double Radius = 1.0;
  int Operation = DENSITY;
  int NeighborTarget = 64;
  int SmoothingLengthMode = GATHER;
  int Kernel = CUBIC_SPLINE;
  int Dimension = 3;
  double Mass = 1.0;
  int Normalization = SHEPARD;
  int Backend = BACKEND_AUTO;
  int Method = METHOD_AUTO;
  double NullValue = 0.0;
  double MemoryLimit = 0.0;
  int Periodic[3] = { 0, 0, 0 };
  double BoxOrigin[3] = { 0, 0, 0 };
  double BoxLengths[3] = { 0, 0, 0 };
  std::string ValidPointMaskArrayName = "vtkValidPointMask";

private:
  vtkPointNeighborhoodFilter(const vtkPointNeighborhoodFilter&) = delete;
  void operator=(const vtkPointNeighborhoodFilter&) = delete;

  struct Internals;
  std::unique_ptr<Internals> Internal;
  std::vector<std::string> SmoothedArrays;
  std::string LastRunInfo;
};

#endif
