"""The plugin loads through PV_PLUGIN_PATH, with no LoadPlugin call.

ParaView 5.11 loads every plugin found in the PV_PLUGIN_PATH directories when pvpython,
pvbatch, pvserver or the GUI start; paraview.simple then has the filter as a function.

    PV_PLUGIN_PATH=<dir of NeighborGrid.so> pvpython TestPluginPath.py <NeighborGrid.so>
"""
import os

import numpy as np

import neighborgrid_testing as T
from paraview import servermanager, simple  # starts the session, which loads the plugins
from vtkmodules.util.numpy_support import vtk_to_numpy

expected = os.path.realpath(T.plugin_path())
T.check(bool(os.environ.get("PV_PLUGIN_PATH")), "PV_PLUGIN_PATH is set (%s)"
        % os.environ.get("PV_PLUGIN_PATH"))

tracker = servermanager.vtkPVPluginTracker.GetInstance()
entries = [(tracker.GetPluginName(i), tracker.GetPluginFileName(i), tracker.GetPluginLoaded(i))
           for i in range(tracker.GetNumberOfPlugins())]
ours = [e for e in entries if e[0] == "NeighborGrid"]
T.check(len(ours) == 1, "the plugin tracker lists NeighborGrid once (got %s)" % ours)
if ours:
    T.check(os.path.realpath(ours[0][1]) == expected, "it is %s (got %s)" % (expected, ours[0][1]))
    T.check(bool(ours[0][2]), "NeighborGrid is loaded")

pdm = servermanager.ProxyManager().GetProxyDefinitionManager()
T.check(pdm.HasDefinition("filters", "PointNeighborhood"), "proxy filters/PointNeighborhood exists")
T.check(callable(getattr(simple, "PointNeighborhood", None)),
        "paraview.simple.PointNeighborhood exists without LoadPlugin")

# LoadDistributedPlugin by name finds it too (already loaded: a no-op that must not fail).
try:
    simple.LoadDistributedPlugin("NeighborGrid", ns=globals())
    T.check("PointNeighborhood" in globals(), "LoadDistributedPlugin('NeighborGrid', ns=globals())")
except Exception as error:  # noqa: BLE001
    T.check(False, "LoadDistributedPlugin('NeighborGrid') raised %s" % error)

if callable(getattr(simple, "PointNeighborhood", None)):
    xyz = T.clustered_points(500, seed=2)
    f = simple.PointNeighborhood(Input=T.producer(simple, T.make_polydata(xyz)))
    f.Operation = "Neighbor Count"
    f.Backend = "CPU"
    f.Radius = 1.0
    out = T.output_of(f)
    arr = out.GetPointData().GetArray("NeighborCount")
    d = T.pair_distances(xyz.astype(np.float32))
    expected_counts = (d <= 1.0).sum(1) - 1
    T.check(arr is not None and np.array_equal(vtk_to_numpy(arr), expected_counts),
            "the auto-loaded filter runs (NeighborCount matches a brute force)")

T.finish()
