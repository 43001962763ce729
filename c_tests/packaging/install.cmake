# CTest fixture: a fresh `cmake --install` of the build tree BUILD_DIR into PREFIX.
# Usage: cmake -DBUILD_DIR=<build> -DPREFIX=<dir> -P install.cmake

cmake_minimum_required(VERSION 3.16)

foreach(var BUILD_DIR PREFIX)
  if(NOT ${var})
    message(FATAL_ERROR "install.cmake: ${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
endif()
