"""A new Point Neighborhood's Mass Array is None (the constant Mass), whatever ran before.

    pvpython TestMassArrayDefault.py <NeighborGrid.so> <popc-membrane.vtp>

The failure this guards against: the property's five-element default ("0 0 0 0 None") was read
as one string, so ParaView guessed a default from the arrays of whatever was the input while the
proxy was being set up. paraview.simple first connects a new filter to the *active* source and
only then to the Input=... given, so the second filter of a session took the first one's
'Density' as its mass and failed ("The mass array 'Density' is not a point array of the input").
Checked the ways proxies get made: paraview.simple with Input= (keyword) and positional input,
with and without other properties, the GUI's order of calls (pqObjectBuilder: PreInitializeProxy,
input set to the selected source, PostInitializeProxy), and an input whose active scalars are a
one-component point array (another filter's Density), which must not be taken as a mass either.
"""
import sys

import numpy as np

import neighborgrid_testing as T

simple = T.load_plugin(globals())
from paraview import servermanager  # noqa: E402

sample = sys.argv[2]


def mass_array(proxy):
    return list(proxy.MassArray)


def runs_with_constant_mass(proxy, label):
    """Updates the proxy; checks it ran and used the constant mass (no error, Density present)."""
    errors = T.ErrorCatcher(proxy)
    out = T.output_of(proxy)
    info = T.info_string(out).splitlines() if out.GetNumberOfPoints() else []
    T.check(not errors.text() and out.GetNumberOfPoints() > 0 and "mass=constant 1" in info,
            "%s runs with the constant mass (errors: %r)" % (label, errors.text()[:200]))


# --- The session: a second filter on the same reader ------------------------------------
reader = simple.XMLPolyDataReader(FileName=[sample])
first = PointNeighborhood(Input=reader, Operation="Density", Radius=5, Backend="CPU")  # noqa: F821
T.check(mass_array(first) == ["POINTS", "None"], "first filter: MassArray None (got %s)"
        % mass_array(first))
first.UpdatePipeline()
second = PointNeighborhood(Input=reader, Operation="Density", Radius=5, Backend="CPU")  # noqa: F821
T.check(mass_array(second) == ["POINTS", "None"],
        "second filter after the first ran: MassArray None (got %s)" % mass_array(second))
runs_with_constant_mass(second, "the second filter")

# Other spellings of the same: no properties, positional input, a filter on the first's output.
simple.SetActiveSource(first)
for label, make in [
        ("Input= only", lambda: PointNeighborhood(Input=reader)),  # noqa: F821
        ("positional input", lambda: PointNeighborhood(reader)),  # noqa: F821
        ("no input (the active source)", lambda: PointNeighborhood()),  # noqa: F821
        ("input = a Point Neighborhood output", lambda: PointNeighborhood(Input=first))]:  # noqa: F821
    simple.SetActiveSource(first)
    proxy = make()
    T.check(mass_array(proxy) == ["POINTS", "None"], "%s: MassArray None (got %s)"
            % (label, mass_array(proxy)))
    proxy.Backend = "CPU"
    runs_with_constant_mass(proxy, label)

# --- The GUI's order of calls (pqObjectBuilder::createFilter) ------------------------------------
def gui_create(input_proxy):
    controller = servermanager.ParaViewPipelineController()
    proxy = servermanager._getPyProxy(
        servermanager.ProxyManager().SMProxyManager.NewProxy("filters", "PointNeighborhood"))
    controller.PreInitializeProxy(proxy.SMProxy)
    proxy.GetProperty("Input").SMProperty.SetInputConnection(0, input_proxy.SMProxy, 0)
    controller.PostInitializeProxy(proxy.SMProxy)
    controller.RegisterPipelineProxy(proxy.SMProxy)
    return proxy


for label, input_proxy in [("GUI, on the reader", reader), ("GUI, on a Point Neighborhood", first)]:
    proxy = gui_create(input_proxy)
    T.check(mass_array(proxy) == ["POINTS", "None"], "%s: MassArray None (got %s)"
            % (label, mass_array(proxy)))
    proxy.Backend = "CPU"
    runs_with_constant_mass(proxy, label)

# --- An input whose active scalars are a one-component point array named Density ----------------
xyz = T.clustered_points(400, seed=3)
poly = T.make_polydata(xyz, {"mass": np.full(400, 2.0, dtype=np.float32),
                             "Density": np.linspace(0.5, 1.5, 400).astype(np.float32)})
poly.GetPointData().SetActiveScalars("Density")
scalars_source = T.producer(simple, poly)
for label, proxy in [("active scalars Density (simple)", PointNeighborhood(Input=scalars_source)),  # noqa: F821
                     ("active scalars Density (GUI)", gui_create(scalars_source))]:
    T.check(mass_array(proxy) == ["POINTS", "None"], "%s: MassArray None (got %s)"
            % (label, mass_array(proxy)))
    proxy.Backend = "CPU"
    runs_with_constant_mass(proxy, label)

# A chosen mass array still works after all this.
second.MassArray = ["POINTS", "mass"]
out = T.output_of(second)
T.check("mass=array 'mass'" in T.info_string(out).splitlines(), "MassArray = mass still selectable")

T.finish()
