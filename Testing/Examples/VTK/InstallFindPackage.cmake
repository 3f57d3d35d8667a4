# cmake -P script of the test Examples.VTK.install_find_package (see CMakeLists.txt): install the
# build, then build and run the example against the installed package only.
foreach (var BUILD_DIR INSTALL_PREFIX EXAMPLE_SOURCE_DIR EXAMPLE_BINARY_DIR GENERATOR CXX_COMPILER)
  if (NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "InstallFindPackage.cmake needs -D${var}=...")
  endif ()
endforeach ()
if (NOT CONFIG)
  set(CONFIG Release)
endif ()

function (run_step description)
  message(STATUS "${description}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if (NOT result EQUAL 0)
    message(FATAL_ERROR "${description} failed (${result}):\n${output}")
  endif ()
  set(step_output "${output}" PARENT_SCOPE)
endfunction ()

# 1. A fresh install tree.
file(REMOVE_RECURSE "${INSTALL_PREFIX}" "${EXAMPLE_BINARY_DIR}")
run_step("Install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${INSTALL_PREFIX}" --config "${CONFIG}")
foreach (expected
    "lib/cmake/NeighborGrid/NeighborGridConfig.cmake"
    "include/NeighborGrid/NeighborGrid.h"
    "include/NeighborGrid/vtkPointNeighborhoodFilter.h"
    "include/NeighborGrid/NeighborGridFiltersModule.h")
  if (NOT EXISTS "${INSTALL_PREFIX}/${expected}")
    message(FATAL_ERROR "The install tree lacks ${expected}")
  endif ()
endforeach ()

# 2. The example as a separate project that only knows the install prefix (and the ParaView the
#    build used, in case it is not in a default location).
set(configure_args
  -S "${EXAMPLE_SOURCE_DIR}" -B "${EXAMPLE_BINARY_DIR}" -G "${GENERATOR}"
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  "-DCMAKE_PREFIX_PATH=${INSTALL_PREFIX}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if (C_COMPILER)
  list(APPEND configure_args "-DCMAKE_C_COMPILER=${C_COMPILER}")
endif ()
if (PARAVIEW_DIR)
  list(APPEND configure_args "-DParaView_DIR=${PARAVIEW_DIR}")
endif ()
run_step("Configure the example" "${CMAKE_COMMAND}" ${configure_args})

# It must have found the installed package, not the build tree.
file(STRINGS "${EXAMPLE_BINARY_DIR}/CMakeCache.txt" found_dir REGEX "^NeighborGrid_DIR:")
string(REGEX REPLACE "^NeighborGrid_DIR:[A-Z]+=" "" found_dir "${found_dir}")
file(REAL_PATH "${found_dir}" found_dir)
file(REAL_PATH "${INSTALL_PREFIX}" real_prefix)
string(FIND "${found_dir}" "${real_prefix}/" position)
if (NOT position EQUAL 0)
  message(FATAL_ERROR "The example found NeighborGrid in '${found_dir}', not under '${real_prefix}'")
endif ()

run_step("Build the example" "${CMAKE_COMMAND}" --build "${EXAMPLE_BINARY_DIR}" --config "${CONFIG}")

# 3. Run it (single- or multi-config generators put it in different places).
set(executable "${EXAMPLE_BINARY_DIR}/NeighborGridVTKExample")
if (NOT EXISTS "${executable}")
  set(executable "${EXAMPLE_BINARY_DIR}/${CONFIG}/NeighborGridVTKExample")
endif ()
run_step("Run the example" "${executable}" ${EXAMPLE_ARGS})
message(STATUS "${step_output}")
if (NOT step_output MATCHES "Density range \\[[0-9]")
  message(FATAL_ERROR "The example did not print a density range")
endif ()
# The example must load the installed libraries, not the build tree's (where ldd exists).
find_program(LDD_EXECUTABLE ldd)
if (LDD_EXECUTABLE)
  run_step("Check the libraries" "${LDD_EXECUTABLE}" "${executable}")
  string(FIND "${step_output}" "${BUILD_DIR}/lib/" position)
  if (NOT position EQUAL -1)
    message(FATAL_ERROR "The installed example loads libraries from the build tree:\n${step_output}")
  endif ()
  string(FIND "${step_output}" "${real_prefix}/lib" position)
  if (position EQUAL -1)
    message(FATAL_ERROR "The installed example does not load NeighborGrid from the install tree:\n${step_output}")
  endif ()
endif ()
