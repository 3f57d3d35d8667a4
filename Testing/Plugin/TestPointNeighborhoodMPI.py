"""PointNeighborhood and PointNeighborhoodProbe under MPI: every rank's points get the serial results.

    mpiexec -np N pvbatch --dr TestPointNeighborhoodMPI.py <NeighborGrid.so> <reference.npz>

One global point set (12,000 points, about 20 neighbors each, a mass, a positive scalar and a
positive 3-vector) is spread over the N ranks by a ProgrammableSource, four ways:
  random        each point on a random rank (every rank's points cover the whole box)
  redistribute  the random partition, then RedistributeDataSet (a spatial partition)
  ghosts        the random partition plus, on each rank, copies of other ranks' points marked
                vtkGhostType DUPLICATEPOINT (they must get their owner's results)
  empty         the last rank gets no points
Then: Neighbor Count, Density (mass array, Wendland C2), Shepard smoothing of the 3-vector, SPH
smoothing of the scalar (and its Density), periodic Density, Smoothing Length (k = 40, open and
periodic: exact against a numpy brute force, identical over the ranks, ghost points carrying
their owner's value), and a probe of 3,000 points spread
over the ranks the same way (Density, SPH smoothing, the valid mask). Results are fetched to rank 0
and matched by point id. Per-particle radii (Symmetric counts, Scatter density, Gather gradient of
a scalar and a 3-vector, Gather density in the periodic box, a probe and a volume with radii) and the gradient with the fixed radius
too, ghost points included: a ghost takes the results of the particle it copies (same position,
radius and values).

With N = 1 the script checks the counts against a numpy brute force in double and writes the
results to <reference.npz>; with N > 1 it compares against that file: counts identical, floats
within 1e-6 relative. CMake runs N = 1 first (a test fixture).
"""
import os
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy

import neighborgrid_testing as T

simple = T.load_plugin(globals())
from paraview import servermanager  # noqa: E402
from paraview.modules.vtkRemotingCore import vtkProcessModule  # noqa: E402

reference_path = sys.argv[2]
ranks = vtkProcessModule.GetProcessModule().GetNumberOfLocalPartitions()
print("ranks: %d" % ranks)

N, QUERIES, BOX, RADIUS = 12000, 3000, 30.0, 2.2
SMOOTHING_K = 40

SOURCE_SCRIPT = r"""
import numpy as np
from vtkmodules.vtkCommonExecutionModel import vtkStreamingDemandDrivenPipeline as sddp
from vtkmodules.util.numpy_support import numpy_to_vtk
from vtkmodules.vtkCommonCore import vtkPoints
from vtkmodules.vtkCommonDataModel import vtkCellArray
info = self.GetOutputInformation(0)
piece = info.Get(sddp.UPDATE_PIECE_NUMBER()) if info.Has(sddp.UPDATE_PIECE_NUMBER()) else 0
pieces = info.Get(sddp.UPDATE_NUMBER_OF_PIECES()) if info.Has(sddp.UPDATE_NUMBER_OF_PIECES()) else 1
count, box, seed, mode, RADIUS = COUNT, BOX, SEED, "MODE", RADIUS_VALUE
rng = np.random.default_rng(seed)
xyz = rng.uniform(0.0, box, (count, 3))
# a denser clump, so that ranks carry uneven loads
xyz[: count // 6] = box * 0.3 + rng.normal(0.0, box * 0.04, (count // 6, 3))
mass = 0.5 + rng.uniform(0.0, 1.0, count)
scalar = 1.0 + 0.1 * xyz[:, 0] + rng.uniform(0.0, 0.5, count)
vector = 2.0 + np.sin(xyz / 5.0)
# per-particle radii from 0.6 to 1.4 times RADIUS, small in the clump, large outside it
radius = RADIUS * (0.6 + 0.8 * rng.uniform(0.0, 1.0, count))
radius[: count // 6] *= 0.5
owner = rng.integers(0, pieces, count)
if mode == "empty" and pieces > 1:
    owner = owner % (pieces - 1)
keep = owner == piece
ghost = np.zeros(count, dtype=np.uint8)
if mode == "ghosts":
    extra = (owner != piece) & (np.arange(count) % 5 == piece % 5)
    ghost[extra] = 1  # vtkDataSetAttributes::DUPLICATEPOINT
    keep = keep | extra
ids = np.flatnonzero(keep)
out = self.GetPolyDataOutput()
points = vtkPoints()
points.SetData(numpy_to_vtk(np.ascontiguousarray(xyz[ids], dtype=np.float32), deep=1))
out.SetPoints(points)
verts = vtkCellArray()
for k in range(len(ids)):
    verts.InsertNextCell(1)
    verts.InsertCellPoint(k)
out.SetVerts(verts)
def add(name, values):
    a = numpy_to_vtk(np.ascontiguousarray(values), deep=1)
    a.SetName(name)
    out.GetPointData().AddArray(a)
add("Id", ids.astype(np.int64))
add("mass", mass[ids].astype(np.float32))
add("s", scalar[ids].astype(np.float32))
add("f", vector[ids].astype(np.float32))
add("r", radius[ids].astype(np.float32))
if mode == "ghosts":
    add("vtkGhostType", ghost[ids])
"""


def make_points(count, seed, mode):
    script = (SOURCE_SCRIPT.replace("COUNT", str(count)).replace("BOX", repr(BOX))
              .replace("RADIUS_VALUE", repr(RADIUS))
              .replace("SEED", str(seed)).replace("MODE", mode))
    return simple.ProgrammableSource(OutputDataSetType="vtkPolyData", Script=script)


def fetched(proxy, names):
    """name -> numpy array over all ranks' points, and the ghost flags, ordered by Id."""
    # Fetch gathers polydata from every rank (an unstructured grid, as RedistributeDataSet makes,
    # only from rank 0): the surface of the point cloud is its points, with their arrays.
    data = servermanager.Fetch(simple.ExtractSurface(Input=proxy))
    if data.IsA("vtkCompositeDataSet"):
        it = data.NewIterator()
        it.InitTraversal()
        blocks = []
        while not it.IsDoneWithTraversal():
            blocks.append(it.GetCurrentDataObject())
            it.GoToNextItem()
        from vtkmodules.vtkFiltersCore import vtkAppendFilter  # noqa
        append = vtkAppendFilter()
        for b in blocks:
            append.AddInputData(b)
        append.Update()
        data = append.GetOutput()
    pd = data.GetPointData()
    result = {}
    for name in names + ["Id"]:
        array = pd.GetArray(name)
        result[name] = None if array is None else vtk_to_numpy(array).copy()
    if result["Id"] is None and data.GetNumberOfPoints():
        # Grid points (the volume): the id is the point's index in the whole grid, from its
        # coordinates; points on the boundary between two ranks' pieces come twice, and the
        # second copy is compared like a ghost point.
        xyz = vtk_to_numpy(data.GetPoints().GetData()).astype(np.float64)
        index = []
        for a in range(3):
            values = np.unique(np.round(xyz[:, a], 6))
            index.append(np.searchsorted(values, np.round(xyz[:, a], 6)))
        sizes = [int(i.max()) + 1 for i in index]
        ids = (index[2] * sizes[1] + index[1]) * sizes[0] + index[0]
        _, first = np.unique(ids, return_index=True)
        duplicate = np.ones(len(ids), dtype=np.uint8)
        duplicate[first] = 0
        result["Id"] = ids
        result["duplicate"] = duplicate
    info = data.GetFieldData().GetAbstractArray("NeighborGridInfo")
    result["info"] = "" if info is None else "\n".join(
        info.GetValue(k) for k in range(info.GetNumberOfValues()))
    ghost = pd.GetArray("vtkGhostType")
    result["ghost"] = (np.zeros(data.GetNumberOfPoints(), dtype=np.uint8) if ghost is None
                       else vtk_to_numpy(ghost).copy())
    if "duplicate" in result:
        result["ghost"] = result.pop("duplicate")
    return result


def case_results(mode):
    """label -> {name: values ordered by Id} for every case of one partition."""
    particles = make_points(N, 7, mode)
    if mode == "redistribute":
        particles = simple.RedistributeDataSet(Input=particles)
    probe_points = make_points(QUERIES, 8, "random" if mode == "redistribute" else mode)
    cases = {}

    def run(label, proxy, names):
        proxy.UpdatePipeline()
        got = fetched(proxy, names)
        info = got.pop("info")
        if ranks > 1:
            T.check("rank=0 of %d" % ranks in info and "halo_points_received=" in info,
                    "%s %s: NeighborGridInfo reports the ranks and the halo" % (mode, label))
        cases[label] = got

    def neighborhood(**props):
        f = PointNeighborhood(  # noqa: F821
            Input=particles, Radius=RADIUS, Backend="CPU", **props)
        return f

    run("count", neighborhood(Operation="Neighbor Count"), ["NeighborCount"])
    density = neighborhood(Operation="Density", Kernel="Wendland C2")
    density.MassArray = ["POINTS", "mass"]
    run("density", density, ["Density"])
    shepard = neighborhood(Operation="Kernel Smoothing", SmoothedArrays=["f"])
    run("shepard", shepard, ["f_smoothed"])
    sph = neighborhood(Operation="Kernel Smoothing", SmoothedArrays=["s"], Normalization="SPH")
    sph.MassArray = ["POINTS", "mass"]
    run("sph", sph, ["s_smoothed", "Density"])
    periodic = neighborhood(Operation="Density", Periodic=[1, 1, 1], BoxLengths=[BOX, BOX, BOX])
    run("periodic", periodic, ["Density"])
    # Smoothing Length: each rank bounds the halo by its own points' k-th distance; ghost points
    # take the result of the particle at their position.
    run("smoothing length", neighborhood(Operation="Smoothing Length", NeighborTarget=SMOOTHING_K),
        ["SupportRadius"])
    run("periodic smoothing length", neighborhood(Operation="Smoothing Length", NeighborTarget=SMOOTHING_K,
                                                  Periodic=[1, 1, 1], BoxLengths=[BOX, BOX, BOX]),
        ["SupportRadius"])
    probe = PointNeighborhoodProbe(  # noqa: F821
        Input=particles, Source=probe_points, Radius=RADIUS,
                                          Backend="CPU", Operation="Kernel Smoothing",
                                          SmoothedArrays=["s"], Normalization="SPH")
    probe.MassArray = ["POINTS", "mass"]
    run("probe", probe, ["s_smoothed", "Density", "vtkValidPointMask"])
    # Per-particle radii and the gradient; ghost points take their particle's results.
    radius_cases = []
    radii_count = neighborhood(Operation="Neighbor Count", RadiusArray=["POINTS", "r"], SmoothingLengthMode="Symmetric")
    radius_cases.append(("radii count", radii_count, ["NeighborCount"]))
    radii_density = neighborhood(Operation="Density", RadiusArray=["POINTS", "r"], SmoothingLengthMode="Scatter")
    radii_density.MassArray = ["POINTS", "mass"]
    radius_cases.append(("radii density", radii_density, ["Density"]))
    radii_periodic = neighborhood(Operation="Density", RadiusArray=["POINTS", "r"], Periodic=[1, 1, 1],
                                  BoxLengths=[BOX, BOX, BOX])
    radii_periodic.MassArray = ["POINTS", "mass"]
    radius_cases.append(("radii periodic density", radii_periodic, ["Density"]))
    radii_gradient = neighborhood(Operation="Gradient", SmoothedArrays=["s", "f"], RadiusArray=["POINTS", "r"])
    radii_gradient.MassArray = ["POINTS", "mass"]
    radius_cases.append(("radii gradient", radii_gradient, ["s_gradient", "f_gradient", "Density"]))
    gradient = neighborhood(Operation="Gradient", SmoothedArrays=["s"])
    radius_cases.append(("gradient", gradient, ["s_gradient", "Density"]))
    radii_probe = PointNeighborhoodProbe(  # noqa: F821
        Input=particles, Source=probe_points, Radius=RADIUS, Backend="CPU", Operation="Kernel Smoothing",
        SmoothedArrays=["s"], Normalization="SPH", RadiusArray=["POINTS", "r"])
    radii_probe.MassArray = ["POINTS", "mass"]
    radius_cases.append(("radii probe", radii_probe, ["s_smoothed", "Density", "vtkValidPointMask"]))
    radii_volume = PointNeighborhoodVolume(  # noqa: F821
        Input=particles, Radius=RADIUS, Backend="CPU", Operation="Density", RadiusArray=["POINTS", "r"],
        RefinementMode="Use cell-size", CellSize=1.25)
    radius_cases.append(("radii volume", simple.ConvertToPointCloud(Input=radii_volume), ["Density"]))
    for label, proxy, names in radius_cases:
        run(label, proxy, names)
    # The volume: each rank computes its piece of the whole extent.
    volume = PointNeighborhoodVolume(  # noqa: F821
        Input=particles, Radius=RADIUS, Backend="CPU", Operation="Density",
        RefinementMode="Use cell-size", CellSize=1.25)
    volume.MassArray = ["POINTS", "mass"]
    run("volume", simple.ConvertToPointCloud(Input=volume), ["Density", "vtkValidPointMask"])
    return cases


def ordered(got, name):
    """Values of `name` at the owned points, indexed by Id; and (ids, values) of the ghosts."""
    ids, values, ghost = got["Id"], got[name], got["ghost"] != 0
    owned = ~ghost
    order = np.argsort(ids[owned])
    return ids[owned][order], values[owned][order], ids[ghost], values[ghost]


def close(a, b, floor=0.0, tolerance=1e-6):
    """Within `tolerance` relative; values below `floor` (a fraction of the array's largest)
    compare against that instead."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False, float("inf")
    if not a.size:
        return True, 0.0
    scale = np.maximum(np.abs(b), np.maximum(floor * np.max(np.abs(b)), 1e-30))  # (pvbatch: max is not builtins.max)
    err = np.max(np.abs(a - b) / scale)
    return err <= tolerance, err


def floor_and_tolerance(label, name):
    """How close to the serial run. Per-particle radii and the gradient: 1e-5 relative, as close as
    the engine promises to a double-precision brute force. The ranks bin their particles into
    levels of radii from their own smallest radius, so pair distances are rounded to float from
    other cell origins than in the serial run. A gradient sums terms of both signs: a component
    near 0 keeps the rounding of its largest terms, a few 1e-7 of the array's largest value, so
    gradients compare relative to that (floor 1). With radii a density at the edge of a particle's
    support (1e-12 of the largest value) has few correct digits too (floor 1e-2). A wrong halo (a
    missing neighbor, a halo point's density that is not its owner's) changes results by about
    1e-2 of the largest value. Everything else: 1e-6 relative."""
    if name.endswith("_gradient"):
        return 1.0, 1e-5
    if label.startswith("radii"):
        return 1e-2, 1e-5
    return 0.0, 1e-6


modes = ["random", "redistribute", "ghosts", "empty"]
results = {mode: case_results(mode) for mode in modes}

if ranks == 1:
    # The reference: every point once; counts checked against a brute force in double.
    got = results["random"]["count"]
    ids, counts, _, _ = ordered(got, "NeighborCount")
    T.check(len(ids) == N and np.array_equal(ids, np.arange(N)), "serial run: every point once")
    # brute force (double) over the generated coordinates, as the source makes them (float32)
    data = servermanager.Fetch(make_points(N, 7, "random"))
    xyz = vtk_to_numpy(data.GetPoints().GetData()).astype(np.float64)
    order = np.argsort(vtk_to_numpy(data.GetPointData().GetArray("Id")))
    xyz = xyz[order]
    lo = np.zeros(N, dtype=np.int64)
    hi = np.zeros(N, dtype=np.int64)
    for start in range(0, N, 500):
        d2 = ((xyz[start:start + 500, None, :] - xyz[None, :, :]) ** 2).sum(axis=2)
        d2[np.arange(d2.shape[0]), np.arange(start, start + d2.shape[0])] = np.inf
        lo[start:start + 500] = np.count_nonzero(d2 < (RADIUS * (1 - 1e-6)) ** 2, axis=1)
        hi[start:start + 500] = np.count_nonzero(d2 <= (RADIUS * (1 + 1e-6)) ** 2, axis=1)
    T.check(np.all((counts >= lo) & (counts <= hi)),
            "serial counts match a brute force in double (mean %.1f neighbors)" % counts.mean())
    # Smoothing Length against the k-th smallest squared distance in double, its square root
    # rounded up to float (the smallest float whose square reaches it; a float's square is exact).
    for label, periodic in (("smoothing length", False), ("periodic smoothing length", True)):
        _, support, _, _ = ordered(results["random"][label], "SupportRadius")
        expected = np.empty(N, dtype=np.float32)
        for start in range(0, N, 500):
            d = xyz[start:start + 500, None, :] - xyz[None, :, :]
            if periodic:  # the k-th lies far below BOX / 2: the nearest image is the only one
                d = xyz[start:start + 500, None, :] - (xyz[None, :, :] + BOX * np.round(d / BOX))
            d2 = (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]
            d2[np.arange(d2.shape[0]), np.arange(start, start + d2.shape[0])] = np.inf
            kth = np.partition(d2, SMOOTHING_K - 1, axis=1)[:, SMOOTHING_K - 1]
            r = np.sqrt(kth).astype(np.float32)
            r = np.where(r.astype(np.float64) ** 2 < kth, np.nextafter(r, np.float32(np.inf)), r)
            expected[start:start + 500] = r
        T.check(float(expected.max()) < BOX / 2, "%s: the reference's k-th distances lie below half the box" % label)
        T.check(np.array_equal(support, expected),
                "serial %s matches a brute force in double, bit for bit (%d differ; mean %.3f)" % (
                    label, int(np.count_nonzero(support != expected)), float(expected.mean())))
    store = {}
    for label, got in results["random"].items():
        for name, values in got.items():
            if name not in ("Id", "ghost") and values is not None:
                _, v, _, _ = ordered(got, name)
                store["%s/%s" % (label, name)] = v
    np.savez(reference_path, **store)
    print("wrote the serial reference %s" % reference_path)

# Every run, serial included (the partitions differ even then: ghosts, RedistributeDataSet).
if not os.path.exists(reference_path):
    T.check(False, "the serial reference %s exists (run the test with 1 rank first)" % reference_path)
    T.finish()  # exits: failed
reference = np.load(reference_path)
for mode in modes:
    for label, got in results[mode].items():
        for name, values in got.items():
            if name in ("Id", "ghost"):
                continue
            key = "%s/%s" % (label, name)
            if values is None:
                T.check(False, "%s %s: array %s in the output" % (mode, label, name))
                continue
            ids, v, ghost_ids, ghost_values = ordered(got, name)
            expected = reference[key]
            if not T.check(np.array_equal(ids, np.arange(len(expected))),
                           "%s %s %s: every point once over the ranks (%d)" % (mode, label, name, len(ids))):
                continue
            if name in ("NeighborCount", "vtkValidPointMask", "SupportRadius"):
                T.check(np.array_equal(v, expected),
                        "%s %s %s: identical to the serial run" % (mode, label, name))
                if len(ghost_ids):
                    T.check(np.array_equal(ghost_values, expected[ghost_ids]),
                            "%s %s %s: %d ghost points carry their owner's value" % (
                                mode, label, name, len(ghost_ids)))
            else:
                floor, tolerance = floor_and_tolerance(label, name)
                ok, err = close(v, expected, floor, tolerance)
                T.check(ok, "%s %s %s: within %g of the serial run (max relative %.2g%s)" % (
                    mode, label, name, tolerance, err,
                    "; relative to %g of the largest value below it" % floor if floor else ""))
                if len(ghost_ids):
                    ok, err = close(ghost_values, expected[ghost_ids], floor, tolerance)
                    T.check(ok, "%s %s %s: %d ghost points within %g of their owner (max relative %.2g)" % (
                        mode, label, name, len(ghost_ids), tolerance, err))
if T.FAILURES:
    T.finish()  # exits with 1 (pvbatch then leaves MPI abruptly; mpiexec reports it: a failure either way)
print("all checks passed")
# On success the script ends normally, so that pvbatch finalizes MPI and exits with 0.
