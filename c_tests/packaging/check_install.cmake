# The installed tree: the shared library as a versioned file with its soname
# and development links, the static library, both headers (as in the source
# tree), kvtier.pc and the CMake package, with no path of the build or of the
# prefix written into them (the tree is relocatable); and, when the build
# made it (CLI), the kvtier command in BINDIR, which runs.
#
# Usage: cmake -DPREFIX= -DLIBDIR= -DINCLUDEDIR= -DSOURCE_INCLUDE_DIR= -DBUILD_DIR=
#              -DVERSION= -DSONAME= -DSHARED_FILE= -DREADELF= [-DBINDIR= -DCLI=ON]
#              -P check_install.cmake

cmake_minimum_required(VERSION 3.16)

include("${CMAKE_CURRENT_LIST_DIR}/elf.cmake")

set(lib "${PREFIX}/${LIBDIR}")
set(real "${SHARED_FILE}")
set(problems "")
# The file is named after its soname, so that installing one ABI never
# overwrites the file an older ABI's soname link points at.
if(NOT real MATCHES "^${SONAME}\\.")
  list(APPEND problems "${real} is not named after its soname ${SONAME}")
endif()

foreach(file "${lib}/${real}" "${lib}/libkvtier.a" "${PREFIX}/${INCLUDEDIR}/kvtier.h"
             "${PREFIX}/${INCLUDEDIR}/kvtier.hpp" "${lib}/pkgconfig/kvtier.pc"
             "${lib}/cmake/kvtier/kvtierConfig.cmake" "${lib}/cmake/kvtier/kvtierConfigVersion.cmake")
  if(NOT EXISTS "${file}" OR IS_SYMLINK "${file}" OR IS_DIRECTORY "${file}")
    list(APPEND problems "${file} is missing or not a regular file")
  endif()
endforeach()

# name -> what the symbolic link must point to
foreach(pair "${SONAME}:${real}" "libkvtier.so:${SONAME}")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 link)
  list(GET pair 1 want)
  if(NOT IS_SYMLINK "${lib}/${link}")
    list(APPEND problems "${lib}/${link} is not a symbolic link")
  else()
    file(READ_SYMLINK "${lib}/${link}" got)
    if(NOT got STREQUAL want)
      list(APPEND problems "${lib}/${link} points to ${got}, not ${want}")
    endif()
  endif()
endforeach()

foreach(header kvtier.h kvtier.hpp)
  if(EXISTS "${PREFIX}/${INCLUDEDIR}/${header}")
    file(SHA256 "${PREFIX}/${INCLUDEDIR}/${header}" installed)
    file(SHA256 "${SOURCE_INCLUDE_DIR}/${header}" source)
    if(NOT installed STREQUAL source)
      list(APPEND problems "${PREFIX}/${INCLUDEDIR}/${header} differs from ${SOURCE_INCLUDE_DIR}/${header}")
    endif()
  endif()
endforeach()

if(EXISTS "${lib}/${real}")
  kvtier_elf_dynamic("${READELF}" "${lib}/${real}" soname needed)
  message(STATUS "${lib}/${real}: SONAME ${soname}; NEEDED ${needed}")
  if(NOT soname STREQUAL SONAME)
    list(APPEND problems "${lib}/${real} has SONAME \"${soname}\", expected ${SONAME}")
  endif()
endif()

foreach(file "${lib}/pkgconfig/kvtier.pc" "${lib}/cmake/kvtier/kvtierConfig.cmake")
  if(EXISTS "${file}")
    file(READ "${file}" text)
    foreach(path "${BUILD_DIR}" "${PREFIX}")
      string(FIND "${text}" "${path}" at)
      if(NOT at EQUAL -1)
        list(APPEND problems "${file} contains the path ${path}: it would not survive a move")
      endif()
    endforeach()
  endif()
endforeach()

if(CLI)
  set(cli "${PREFIX}/${BINDIR}/kvtier")
  execute_process(COMMAND "${cli}" --version RESULT_VARIABLE rc OUTPUT_VARIABLE said ERROR_VARIABLE said)
  if(NOT rc EQUAL 0 OR NOT said MATCHES "^kvtier ")
    list(APPEND problems "${cli} --version: ${rc}: ${said}")
  endif()
endif()

if(problems)
  string(REPLACE ";" "\n  " problems "${problems}")
  message(FATAL_ERROR "the installed tree in ${PREFIX} is wrong:\n  ${problems}")
endif()
message(STATUS "installed tree in ${PREFIX}: complete")
