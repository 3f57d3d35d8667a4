"""The MPI layer's own cost at scale: what Point Neighborhood does before and around the engine.

    mpiexec -np 2 pvbatch --symmetric Testing/Benchmarks/mpi_prologue.py <NeighborGrid.so> [points per rank]

Each rank holds N uniform random points of its own slab of the box (x in [rank L, (rank + 1) L))
plus copies, marked vtkGhostType DUPLICATEPOINT, of the next rank's points within R of their
common border, as a spatial partition with ghost points brings them (D3, RedistributeDataSet).
Neighbor Count on the CPU with a small R (about one neighbor), so the search stays short; every
rank prints its NeighborGridInfo stages: `distributed prologue` (ownership, region, halo choice,
extended set, on all cores) and `halo exchange`, and the whole Update(). Not a test: a measurement.
"""
import sys
import time

import numpy as np

sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "Plugin"))
import neighborgrid_testing as T  # noqa: E402

import builtins  # noqa: E402

simple = T.load_plugin(globals())  # brings paraview.simple's names too: `sum` below is builtins'

from paraview.modules.vtkRemotingCore import vtkProcessModule  # noqa: E402

pm = vtkProcessModule.GetProcessModule()
rank, ranks = pm.GetPartitionId(), pm.GetNumberOfLocalPartitions()
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16 * 1024 * 1024
RADIUS = 0.5
SIDE = float(N) ** (1.0 / 3.0)  # one point per unit volume: about 0.5 neighbors at R = 0.5

SCRIPT = r"""
import numpy as np
from vtkmodules.vtkCommonExecutionModel import vtkStreamingDemandDrivenPipeline as sddp
from vtkmodules.util.numpy_support import numpy_to_vtk
from vtkmodules.vtkCommonCore import vtkPoints
info = self.GetOutputInformation(0)
piece = info.Get(sddp.UPDATE_PIECE_NUMBER()) if info.Has(sddp.UPDATE_PIECE_NUMBER()) else 0
pieces = info.Get(sddp.UPDATE_NUMBER_OF_PIECES()) if info.Has(sddp.UPDATE_NUMBER_OF_PIECES()) else 1
n, side, radius = COUNT, SIDE_VALUE, RADIUS_VALUE
def slab(r):
    rng = np.random.default_rng(1000 + r)
    xyz = rng.uniform(0.0, side, (n, 3)).astype(np.float32)
    xyz[:, 0] += np.float32(r * side)
    return xyz
own = slab(piece)
ghost = np.zeros((0, 3), np.float32)
if piece + 1 < pieces:
    nxt = slab(piece + 1)
    ghost = nxt[nxt[:, 0] < (piece + 1) * side + radius]
xyz = np.concatenate([own, ghost])
flags = np.zeros(len(xyz), np.uint8)
flags[len(own):] = 1  # vtkDataSetAttributes::DUPLICATEPOINT
out = self.GetPolyDataOutput()
points = vtkPoints()
points.SetData(numpy_to_vtk(xyz, deep=1))
out.SetPoints(points)
g = numpy_to_vtk(flags, deep=1)
g.SetName("vtkGhostType")
out.GetPointData().AddArray(g)
"""
script = (SCRIPT.replace("COUNT", str(N)).replace("SIDE_VALUE", repr(SIDE))
          .replace("RADIUS_VALUE", repr(RADIUS)))
cloud = simple.ProgrammableSource(OutputDataSetType="vtkPolyData", Script=script)
cloud.UpdatePipeline()
counts = PointNeighborhood(Input=cloud, Radius=RADIUS, Backend="CPU", Operation="Neighbor Count")  # noqa: F821
began = time.perf_counter()
counts.UpdatePipeline()
elapsed = 1000.0 * (time.perf_counter() - began)
output = counts.GetClientSideObject().GetOutputDataObject(0)
info = dict(e.split("=", 1) for e in T.info_string(output).splitlines() if "=" in e)
keys = ["points", "ghost_points", "halo_points_sent", "halo_points_received",
        "stage.distributed prologue_ms", "stage.halo exchange_ms"]
print("rank %d of %d: %s; engine stages %.1f ms; Update() %.1f ms" % (
    rank, ranks, ", ".join("%s=%s" % (k, info.get(k, "?")) for k in keys),
    builtins.sum(float(v) for k, v in info.items() if k.startswith("stage.") and "prologue" not in k
        and "exchange" not in k), elapsed), flush=True)
