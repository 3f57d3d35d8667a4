"""The PointNeighborhood proxy: registration, label, menu, help text, property names, defaults,
enumerations and array domains, each checked against what reaches the VTK filter.

    pvpython TestPointNeighborhoodProxy.py <NeighborGrid.so>
"""
import numpy as np

import neighborgrid_testing as T

simple = T.load_plugin(globals())
from paraview import servermanager  # noqa: E402

# --- Registration ------------------------------------------------------------------------------
pdm = servermanager.ProxyManager().GetProxyDefinitionManager()
T.check(pdm.HasDefinition("filters", "PointNeighborhood"), "proxy filters/PointNeighborhood exists")
definition = pdm.GetProxyDefinition("filters", "PointNeighborhood")
T.check(definition is not None and definition.GetAttribute("label") == "Point Neighborhood",
        "label is 'Point Neighborhood'")
T.check(definition is not None and definition.GetAttribute("class") == "vtkPointNeighborhoodFilter",
        "class is vtkPointNeighborhoodFilter")


def find_element(element, name):
    if element is None:
        return []
    found = [element] if element.GetName() == name else []
    for i in range(element.GetNumberOfNestedElements()):
        found += find_element(element.GetNestedElement(i), name)
    return found


menus = [e.GetAttribute("category") for e in find_element(definition, "ShowInMenu")]
T.check(menus == ["NeighborGrid"], "ShowInMenu category NeighborGrid (got %s)" % menus)
T.check(callable(globals().get("PointNeighborhood")),
        "LoadPlugin(path, ns=globals()) defined PointNeighborhood")

# --- Properties, defaults, help text ------------------------------------------------------------
poly = T.make_polydata(
    T.clustered_points(500),
    {"mass": np.linspace(1, 2, 500).astype(np.float32),
     "velocity": np.ones((500, 3), dtype=np.float32),
     "label": np.arange(500, dtype=np.int32)})
source = T.producer(simple, poly)
f = PointNeighborhood(Input=source)  # noqa: F821 (LoadPlugin)

expected_defaults = {
    "Radius": 5.0,
    "Operation": "Density",
    "Kernel": "Cubic Spline",
    "Dimension": "3",
    "MassArray": ["POINTS", "None"],
    "Mass": 1.0,
    "RadiusArray": ["POINTS", "None"],
    "SmoothingLengthMode": "Gather",
    "NeighborTarget": 64,
    "SmoothedArrays": [],
    "Normalization": "Shepard",
    "Backend": "Auto",
    "Method": "Auto",
    "MemoryLimit": 0.0,
    "Periodic": [0, 0, 0],
    "BoxOrigin": [0.0, 0.0, 0.0],
    "BoxLengths": [0.0, 0.0, 0.0],
}
names = set(f.ListProperties())
for name, default in expected_defaults.items():
    if not T.check(name in names, "property %s exists" % name):
        continue
    value = f.GetPropertyValue(name)
    if isinstance(default, list):
        value = list(value)
    T.check(value == default, "default %s = %r (got %r)" % (name, default, value))
    doc = f.GetProperty(name).SMProperty.GetDocumentation()
    text = doc.GetDescription() if doc else ""
    T.check(text is not None and len(text.strip()) > 40, "property %s has help text" % name)
T.check(names == set(expected_defaults) | {"Input"},
        "no unexpected properties (got %s)" % sorted(names - set(expected_defaults) - {"Input"}))

proxy_doc = f.SMProxy.GetDocumentation()
T.check(proxy_doc is not None and "NeighborCount" in (proxy_doc.GetDescription() or "")
        and proxy_doc.GetShortHelp(), "the filter has help text naming its output arrays")

for name in ("Backend", "Method"):
    T.check(f.GetProperty(name).SMProperty.GetPanelVisibility() == "advanced",
            "%s is an advanced property" % name)
for name in ("Radius", "Operation"):
    T.check(f.GetProperty(name).SMProperty.GetPanelVisibility() == "default",
            "%s is a default (non-advanced) property" % name)

# --- Enumerations: every text maps to the value of vtkPointNeighborhoodFilter's enums ----------
enumerations = {
    "Operation": {"Neighbor Count": 0, "Density": 1, "Kernel Smoothing": 2, "Gradient": 3, "Smoothing Length": 4},
    "SmoothingLengthMode": {"Gather": 0, "Scatter": 1, "Symmetric": 2},
    "Kernel": {"Cubic Spline": 0, "Quartic Spline": 1, "Quintic Spline": 2, "Wendland C2": 3},
    "Dimension": {"2": 2, "3": 3},
    "Normalization": {"Shepard": 0, "SPH": 1},
    "Backend": {"Auto": 0, "CUDA": 1, "CPU": 2},
    "Method": {"Auto": 0, "Counting Sort": 1, "Brute Force": 2, "FENNS": 3, "Radix Sort": 4, "CLAWS": 5,
               "Bayraktar": 6, "Staged Tiles": 7, "Radius Tree": 8},
}
for name, entries in enumerations.items():
    domain = f.GetProperty(name).SMProperty.FindDomain("vtkSMEnumerationDomain")
    actual = {domain.GetEntryText(i): domain.GetEntryValue(i)
              for i in range(domain.GetNumberOfEntries())}
    T.check(actual == entries, "%s enumeration %s (got %s)" % (name, entries, actual))
    for text, value in entries.items():
        setattr(f, name, text)
        T.check(f.GetProperty(name).SMProperty.GetElement(0) == value,
                "%s = '%s' sets %d" % (name, text, value))
    # integer values work too (scripts may write Dimension = 2)
    for value in entries.values():
        setattr(f, name, value)
        T.check(f.GetProperty(name).SMProperty.GetElement(0) == value, "%s = %d" % (name, value))

# --- Array domains -------------------------------------------------------------------------------
def domain_strings(prop):
    d = f.GetProperty(prop).SMProperty.FindDomain("vtkSMArrayListDomain")
    return [d.GetString(i) for i in range(d.GetNumberOfStrings())]


mass_domain = domain_strings("MassArray")
T.check(mass_domain[:1] == ["None"] and set(mass_domain[1:]) == {"mass", "label"},
        "MassArray offers None and the 1-component point arrays (got %s)" % mass_domain)
radius_domain = domain_strings("RadiusArray")
T.check(radius_domain[:1] == ["None"] and set(radius_domain[1:]) == {"mass", "label"},
        "RadiusArray offers None and the 1-component point arrays (got %s)" % radius_domain)
smooth_domain = domain_strings("SmoothedArrays")
T.check(set(smooth_domain) == {"mass", "velocity", "label"},
        "SmoothedArrays offers every point array (got %s)" % smooth_domain)

# --- What reaches the filter: run it and read NeighborGridInfo -----------------------------------
f.Radius = 1.25
f.Operation = "Density"
f.Kernel = "Quintic Spline"
f.Dimension = 2
f.MassArray = ["POINTS", "mass"]
f.Backend = "CPU"
f.Method = "Brute Force"
out = T.output_of(f)
info = T.info_string(out)
for entry in ("operation=Density", "radius=1.25", "kernel=Quintic Spline", "dimension=2",
              "backend=CPU", "method=Brute Force", "points=500", "mass=array 'mass'"):
    T.check(entry in info.splitlines(), "NeighborGridInfo has %s" % entry)
T.check(out.GetPointData().GetArray("Density") is not None, "Density written")

f.MassArray = ["POINTS", "None"]
f.Mass = 2.5
out = T.output_of(f)
T.check("mass=constant 2.5" in T.info_string(out).splitlines(),
        "MassArray None and Mass = 2.5 reach the filter")
f.MassArray = ["POINTS", ""]
out = T.output_of(f)
T.check("mass=constant 2.5" in T.info_string(out).splitlines(),
        "an empty MassArray selection also uses the constant Mass")
f.MassArray = ["POINTS", "no_such_mass"]
errors = T.ErrorCatcher(f)
out = T.output_of(f)
T.check("no_such_mass" in errors.text() and out.GetNumberOfPoints() == 0,
        "a MassArray that is not a point array is an error, not a silent constant")
f.MassArray = ["POINTS", "None"]

f.Operation = "Kernel Smoothing"
f.SmoothedArrays = ["velocity", "label"]
f.Normalization = "SPH"
out = T.output_of(f)
pd = out.GetPointData()
T.check(pd.GetArray("velocity_smoothed") is not None and pd.GetArray("label_smoothed") is not None,
        "SmoothedArrays = ['velocity', 'label'] smooths both")
T.check(pd.GetArray("Density") is not None, "SPH normalization also writes Density")
T.check("normalization=SPH" in T.info_string(out).splitlines(), "Normalization SPH reaches the filter")
f.SmoothedArrays = ["label"]
out = T.output_of(f)
T.check(out.GetPointData().GetArray("velocity_smoothed") is None
        and out.GetPointData().GetArray("label_smoothed") is not None,
        "changing SmoothedArrays clears the previous selection (ClearSmoothedArrays)")

f.Operation = "Gradient"
f.SmoothedArrays = ["velocity"]
out = T.output_of(f)
pd = out.GetPointData()
T.check(pd.GetArray("velocity_gradient") is not None and pd.GetArray("velocity_gradient").GetNumberOfComponents() == 9
        and pd.GetArray("Density") is not None and "operation=Gradient" in T.info_string(out).splitlines(),
        "Operation Gradient writes velocity_gradient (9 components) and Density")

f.RadiusArray = ["POINTS", "mass"]
f.SmoothingLengthMode = "Symmetric"
f.Operation = "Density"
out = T.output_of(f)
info = T.info_string(out).splitlines()
T.check("radius=array 'mass'" in info and "smoothing_length_mode=Symmetric" in info,
        "RadiusArray and SmoothingLengthMode reach the filter (%s)" % [e for e in info if "radius" in e])
f.RadiusArray = ["POINTS", "None"]
out = T.output_of(f)
T.check("radius=1.25" in T.info_string(out).splitlines(), "RadiusArray None: the constant Radius again")

f.Operation = "Smoothing Length"
f.NeighborTarget = 8
f.Method = "Auto"
out = T.output_of(f)
info = T.info_string(out).splitlines()
support = out.GetPointData().GetArray("SupportRadius")
T.check(support is not None and support.GetNumberOfTuples() == out.GetNumberOfPoints()
        and "operation=Smoothing Length" in info and "neighbor_target=8" in info,
        "Operation Smoothing Length with NeighborTarget 8 writes SupportRadius (%s)"
        % [e for e in info if "operation" in e or "neighbor" in e])

f.Operation = "Neighbor Count"
f.Method = "Counting Sort"
out = T.output_of(f)
T.check(out.GetPointData().GetArray("NeighborCount") is not None
        and "method=Counting Sort" in T.info_string(out).splitlines(),
        "Neighbor Count with Counting Sort")

T.finish()
