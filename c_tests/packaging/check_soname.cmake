# The build tree's shared library has the soname SONAME, and PROGRAM, a test
# linked against it, needs it by that name.
# Usage: cmake -DREADELF= -DLIBRARY= -DPROGRAM= -DSONAME= -P check_soname.cmake

cmake_minimum_required(VERSION 3.16)

include("${CMAKE_CURRENT_LIST_DIR}/elf.cmake")

kvtier_elf_dynamic("${READELF}" "${LIBRARY}" soname needed)
message(STATUS "${LIBRARY}: SONAME ${soname}")
if(NOT soname STREQUAL SONAME)
  message(FATAL_ERROR "${LIBRARY} has SONAME \"${soname}\", expected ${SONAME}")
endif()

kvtier_elf_dynamic("${READELF}" "${PROGRAM}" soname needed)
message(STATUS "${PROGRAM}: NEEDED ${needed}")
if(NOT SONAME IN_LIST needed)
  message(FATAL_ERROR "${PROGRAM} does not need ${SONAME} (NEEDED: ${needed})")
endif()
