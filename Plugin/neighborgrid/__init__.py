"""`import neighborgrid` once the NeighborGrid plugin is loaded, with no PYTHONPATH.

This file is embedded in NeighborGrid.so (paraview_add_plugin PYTHON_MODULES, Plugin/CMakeLists.txt)
and registered by ParaView when the plugin loads. ParaView's finder for such modules comes after
Python's own (servermanager.ParaViewMetaPathFinder is appended to sys.meta_path), so it runs only
when no `neighborgrid` package is on sys.path. It then turns itself into the real package, the
one Python/CMakeLists.txt built or installed: the file NeighborGrid.python-path beside the plugin
holds the path from the plugin's folder to that package's parent folder (the build tree mirrors
the install tree), and the package's own __init__.py is run here.
"""
import os as _os


def _real_package_dir():
    from paraview.modules.vtkRemotingCore import vtkPVPluginTracker

    tracker = vtkPVPluginTracker.GetInstance()
    for i in range(tracker.GetNumberOfPlugins()):
        if tracker.GetPluginName(i) == "NeighborGrid" and tracker.GetPluginLoaded(i):
            plugin_dir = _os.path.dirname(_os.path.realpath(tracker.GetPluginFileName(i)))
            note = _os.path.join(plugin_dir, "NeighborGrid.python-path")
            try:
                with open(note) as f:
                    relative = f.read().strip()
            except OSError as error:
                raise ImportError("neighborgrid: %s (%s); set PYTHONPATH to the folder that holds "
                                  "the neighborgrid package instead" % (note, error)) from None
            return _os.path.normpath(_os.path.join(plugin_dir, relative, "neighborgrid"))
    raise ImportError("neighborgrid: the NeighborGrid plugin is not loaded")


__path__ = [_real_package_dir()]
__file__ = _os.path.join(__path__[0], "__init__.py")
with open(__file__) as _f:
    exec(compile(_f.read(), __file__, "exec"))
del _f, _os, _real_package_dir
