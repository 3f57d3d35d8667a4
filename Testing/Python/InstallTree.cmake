# cmake -DBUILD_DIR=<build> -DPREFIX=<dir> -P InstallTree.cmake: a fresh install of the build
# into PREFIX (removed first, so a file that the install rules no longer produce cannot linger).
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
  RESULT_VARIABLE result OUTPUT_QUIET)
if (NOT result EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed: ${result}")
endif ()
