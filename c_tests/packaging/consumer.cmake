# Builds and runs an out-of-tree program (consumer/) against the kvtier
# installed in PREFIX, the way an engine would, then checks how it linked.
#
#   MODE=cmake      configures consumer/CMakeLists.txt (find_package(kvtier),
#                   kvtier::kvtier) with CMAKE_PREFIX_PATH=PREFIX and the cache
#                   arguments in CONSUMER_ARGS ('|'-separated), builds, runs.
#   MODE=subdirectory  configures subdirectory/CMakeLists.txt, a parent
#                   project that builds kvtier from KVTIER_SOURCE with
#                   add_subdirectory() and links kvtier::kvtier; builds it,
#                   checks with CTEST (`ctest -N`) that it has no tests, runs it.
#   MODE=pkgconfig  compiles consumer/app.cpp (LANG=CXX) or app.c (LANG=C)
#                   with `pkg-config --cflags --libs kvtier`, PKG_CONFIG_PATH
#                   pointing into PREFIX, and runs it with the library
#                   directory pkg-config gives in LD_LIBRARY_PATH.
#
#   EXPECT=shared   the program needs SONAME and loads PREFIX's library (with
#                   MODE=subdirectory: the one in the parent's build tree)
#   EXPECT=static   the program needs no libkvtier
#   EXPECT=configure-failure  (MODE=cmake) configuring must fail, with
#                   EXPECT_MESSAGE in the output
#
# Other variables: SOURCE_DIR (consumer/ or subdirectory/), WORK_DIR (scratch), VERSION,
# SONAME, LIBDIR, READELF, PKG_CONFIG, GENERATOR, MAKE_PROGRAM, C_COMPILER,
# CXX_COMPILER, BUILD_TYPE, KVTIER_SOURCE and CTEST (MODE=subdirectory).

cmake_minimum_required(VERSION 3.16)

include("${CMAKE_CURRENT_LIST_DIR}/elf.cmake")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- ${what}: ${ARGN}\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "cmake")
  string(REPLACE "|" ";" consumer_args "${CONSUMER_ARGS}")
  set(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${PREFIX}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
      "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}" ${consumer_args})
  if(MAKE_PROGRAM)
    list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()

  if(EXPECT STREQUAL "configure-failure")
    execute_process(COMMAND ${configure} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    message("---- configure (expected to fail): ${configure}\n${out}")
    if(rc EQUAL 0)
      message(FATAL_ERROR "configuring the consumer succeeded; it must fail")
    endif()
    string(FIND "${out}" "${EXPECT_MESSAGE}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "configuring failed, but without \"${EXPECT_MESSAGE}\" in its output")
    endif()
    return()
  endif()

  run("configure" ${configure})
  # The package must come from PREFIX, not from anywhere else on the machine.
  file(STRINGS "${WORK_DIR}/CMakeCache.txt" found REGEX "^kvtier_DIR:")
  string(REGEX REPLACE "^[^=]*=" "" found "${found}")
  get_filename_component(found "${found}" REALPATH)
  get_filename_component(want "${PREFIX}/${LIBDIR}/cmake/kvtier" REALPATH)
  if(NOT found STREQUAL want)
    message(FATAL_ERROR "find_package(kvtier) used ${found}, not ${want}")
  endif()
  run("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}")
  set(app "${WORK_DIR}/kvtier_consumer")
  set(run_env "")
elseif(MODE STREQUAL "subdirectory")
  string(REPLACE "|" ";" consumer_args "${CONSUMER_ARGS}")
  set(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
      "-DKVTIER_SOURCE_DIR=${KVTIER_SOURCE}" "-DCMAKE_C_COMPILER=${C_COMPILER}"
      "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}" ${consumer_args})
  if(MAKE_PROGRAM)
    list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()
  run("configure" ${configure})
  run("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}" --target kvtier_consumer)
  # kvtier's tests stay out of the parent's CTest.
  execute_process(COMMAND "${CTEST}" -N WORKING_DIRECTORY "${WORK_DIR}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- ctest -N in the parent project\n${out}")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "Total Tests: 0")
    message(FATAL_ERROR "the parent project has tests; kvtier must register none there")
  endif()
  set(app "${WORK_DIR}/kvtier_consumer")
  set(run_env "")
  set(expected_library "${WORK_DIR}/kvtier-build/lib/${SHARED_FILE}")
elseif(MODE STREQUAL "pkgconfig")
  if(NOT PKG_CONFIG)
    message(FATAL_ERROR "pkg-config is not installed (scripts/test.sh installs it with apt-get)")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${LIBDIR}/pkgconfig")
  run("pkg-config version" "${PKG_CONFIG}" --modversion kvtier)
  string(STRIP "${output}" modversion)
  if(NOT modversion STREQUAL VERSION)
    message(FATAL_ERROR "pkg-config --modversion kvtier is ${modversion}, expected ${VERSION}")
  endif()
  run("pkg-config flags" "${PKG_CONFIG}" --cflags --libs kvtier)
  separate_arguments(flags UNIX_COMMAND "${output}")
  run("pkg-config libdir" "${PKG_CONFIG}" --variable=libdir kvtier)
  string(STRIP "${output}" libdir)
  # A static link needs Libs.private: every library kvtier::static names.
  run("pkg-config static libs" "${PKG_CONFIG}" --static --libs kvtier)
  foreach(private -lpthread -ldl -lm)
    string(FIND "${output}" "${private}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "pkg-config --static --libs kvtier lacks ${private}")
    endif()
  endforeach()

  set(app "${WORK_DIR}/kvtier_consumer")
  if(LANG STREQUAL "C")
    set(compile "${C_COMPILER}" -std=c11 "${SOURCE_DIR}/app.c")
  else()
    set(compile "${CXX_COMPILER}" -std=c++17 "${SOURCE_DIR}/app.cpp")
  endif()
  # -ldl: the program itself calls dladdr (glibc < 2.34 keeps it in libdl).
  run("compile" ${compile} -O2 -Wall -Wextra -Werror -pedantic
      "-DKVTIER_PACKAGE_VERSION=\"${VERSION}\"" ${flags} -ldl -o "${app}")
  set(run_env "LD_LIBRARY_PATH=${libdir}")
else()
  message(FATAL_ERROR "consumer.cmake: MODE must be cmake, subdirectory or pkgconfig, not \"${MODE}\"")
endif()

run("run" "${CMAKE_COMMAND}" -E env ${run_env} "${app}")
if(NOT output MATCHES "kvtier library file: ([^\n]*)\n")
  message(FATAL_ERROR "the program did not say which file it loaded kvtier from")
endif()
set(loaded "${CMAKE_MATCH_1}")

kvtier_elf_dynamic("${READELF}" "${app}" soname needed)
message(STATUS "${app}: NEEDED ${needed}")
if(EXPECT STREQUAL "shared")
  if(NOT SONAME IN_LIST needed)
    message(FATAL_ERROR "${app} does not need ${SONAME} (NEEDED: ${needed})")
  endif()
  get_filename_component(loaded_real "${loaded}" REALPATH)
  if(NOT expected_library)
    set(expected_library "${PREFIX}/${LIBDIR}/${SHARED_FILE}")
  endif()
  get_filename_component(installed_real "${expected_library}" REALPATH)
  if(NOT loaded_real STREQUAL installed_real)
    message(FATAL_ERROR "the program loaded kvtier from ${loaded} (${loaded_real}), not ${installed_real}")
  endif()
elseif(EXPECT STREQUAL "static")
  if(needed MATCHES "libkvtier")
    message(FATAL_ERROR "${app} should contain kvtier, but needs ${needed}")
  endif()
  if(loaded MATCHES "libkvtier")
    message(FATAL_ERROR "${app} should contain kvtier, but loaded it from ${loaded}")
  endif()
else()
  message(FATAL_ERROR "consumer.cmake: EXPECT must be shared, static or configure-failure, not \"${EXPECT}\"")
endif()
message(STATUS "consumer (${MODE} ${LANG} ${EXPECT}): built, ran, byte-exact, linked as expected")
