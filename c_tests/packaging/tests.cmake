# Install and consumer tests (included by c_tests/CMakeLists.txt).
#
#   kvtier_soname          the build tree's library has SONAME libkvtier.so.MAJOR
#                          and a test program needs it by that name
#   package_install        fixture: `cmake --install` into <build>/consumer-prefix
#   package_layout         the installed files, links, SONAME, relocatability
#   consumer_cmake         find_package(kvtier) + kvtier::kvtier: shared, via kvtier.hpp
#   consumer_cmake_static  the same with -DKVTIER_USE_STATIC=ON: kvtier::static
#   consumer_cmake_no_shared_libs  the same with -DBUILD_SHARED_LIBS=OFF: kvtier::static
#   consumer_cmake_wrong_major     find_package(kvtier <next major>) must fail
#   consumer_add_subdirectory  a parent project builds kvtier from this source
#                          tree with add_subdirectory() and links kvtier::kvtier;
#                          kvtier registers no tests there
#   consumer_pkgconfig     `pkg-config --cflags --libs kvtier`, C++ through kvtier.hpp
#   consumer_pkgconfig_c   the same for a C program
#   package_dlopen         a plugin host: dlopen(libkvtier.so.<ABI>) from the
#                          installed tree, every function of kvtier.h resolved
#                          with dlsym (the list is generated from the header),
#                          version against the header's macros, round trip,
#                          dlclose, and all of it again (dlopen_host.c)
#   package_exports        the installed library exports exactly the
#                          functions kvtier.h declares (check_exports.cmake)
#
# Each consumer configures or compiles a program outside this build, runs it
# (store -> load -> compare bytes) and checks its DT_NEEDED with readelf.

set(_kvtier_packaging "${CMAKE_CURRENT_LIST_DIR}")
set(_kvtier_prefix "${CMAKE_BINARY_DIR}/consumer-prefix")
set(_kvtier_consumers "${CMAKE_BINARY_DIR}/consumers")

if(CMAKE_READELF)
  set(KVTIER_READELF "${CMAKE_READELF}" CACHE FILEPATH "readelf, to check sonames and DT_NEEDED")
else()
  find_program(KVTIER_READELF readelf)
endif()
find_program(KVTIER_PKG_CONFIG NAMES pkg-config pkgconf)
if(NOT KVTIER_PKG_CONFIG)
  # Not a skip: the consumer_pkgconfig tests fail and say why.
  message(WARNING "pkg-config not found: the consumer_pkgconfig tests will fail (scripts/test.sh installs it)")
  set(KVTIER_PKG_CONFIG "")
endif()

function(kvtier_packaging_test name script)
  add_test(NAME ${name} COMMAND "${CMAKE_COMMAND}" ${ARGN} -P "${_kvtier_packaging}/${script}")
  set_tests_properties(${name} PROPERTIES TIMEOUT ${KVTIER_TEST_TIMEOUT} LABELS package)
endfunction()

# The build tree: the library's soname, and test_version's DT_NEEDED (it also
# checks at run time that the loader found the library by that name).
if(TARGET c_version)
  add_test(NAME kvtier_soname COMMAND "${CMAKE_COMMAND}"
    "-DREADELF=${KVTIER_READELF}" "-DLIBRARY=${KVTIER_STAGE_DIR}/${KVTIER_SHARED_FILE}"
    "-DPROGRAM=$<TARGET_FILE:c_version>" "-DSONAME=${KVTIER_SONAME}"
    -P "${_kvtier_packaging}/check_soname.cmake")
  set_tests_properties(kvtier_soname PROPERTIES TIMEOUT ${KVTIER_TEST_TIMEOUT} LABELS package)
endif()

kvtier_packaging_test(package_install install.cmake
  "-DBUILD_DIR=${CMAKE_BINARY_DIR}" "-DPREFIX=${_kvtier_prefix}")
set_tests_properties(package_install PROPERTIES FIXTURES_SETUP kvtier_installed)

kvtier_packaging_test(package_layout check_install.cmake
  "-DPREFIX=${_kvtier_prefix}" "-DLIBDIR=${CMAKE_INSTALL_LIBDIR}" "-DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}"
  "-DSOURCE_INCLUDE_DIR=${KVTIER_INCLUDE_DIR}" "-DBUILD_DIR=${CMAKE_BINARY_DIR}"
  "-DVERSION=${PROJECT_VERSION}" "-DSONAME=${KVTIER_SONAME}" "-DSHARED_FILE=${KVTIER_SHARED_FILE}"
  "-DREADELF=${KVTIER_READELF}" "-DBINDIR=${CMAKE_INSTALL_BINDIR}" "-DCLI=${KVTIER_BUILD_CLI}")
set_tests_properties(package_layout PROPERTIES FIXTURES_REQUIRED kvtier_installed)

set(_kvtier_consumer_common
  "-DPREFIX=${_kvtier_prefix}"
  "-DLIBDIR=${CMAKE_INSTALL_LIBDIR}" "-DVERSION=${PROJECT_VERSION}" "-DSONAME=${KVTIER_SONAME}"
  "-DSHARED_FILE=${KVTIER_SHARED_FILE}"
  "-DREADELF=${KVTIER_READELF}" "-DPKG_CONFIG=${KVTIER_PKG_CONFIG}"
  "-DGENERATOR=${CMAKE_GENERATOR}" "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
  "-DC_COMPILER=${CMAKE_C_COMPILER}" "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}")

# kvtier_consumer_test(<name> <mode> <expect> [SCRIPT <-Dvar=value>...]
#                      [CONSUMER <cache args for the consumer project>...])
function(kvtier_consumer_test name mode expect)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "SCRIPT;CONSUMER")
  string(JOIN "|" consumer_args ${arg_CONSUMER})
  kvtier_packaging_test(${name} consumer.cmake ${_kvtier_consumer_common}
    "-DSOURCE_DIR=${_kvtier_packaging}/consumer" -DBUILD_TYPE=Release "-DWORK_DIR=${_kvtier_consumers}/${name}" "-DMODE=${mode}" "-DEXPECT=${expect}"
    "-DCONSUMER_ARGS=${consumer_args}" ${arg_SCRIPT})
  set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED kvtier_installed)
endfunction()

math(EXPR _kvtier_next_major "${PROJECT_VERSION_MAJOR} + 1")
kvtier_consumer_test(consumer_cmake cmake shared
  CONSUMER "-DKVTIER_CONSUMER_REQUIRES=${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
kvtier_consumer_test(consumer_cmake_static cmake static CONSUMER -DKVTIER_USE_STATIC=ON)
kvtier_consumer_test(consumer_cmake_no_shared_libs cmake static CONSUMER -DBUILD_SHARED_LIBS=OFF)
kvtier_consumer_test(consumer_cmake_wrong_major cmake configure-failure
  SCRIPT "-DEXPECT_MESSAGE=kvtierConfig.cmake, version: ${PROJECT_VERSION}"
  CONSUMER "-DKVTIER_CONSUMER_REQUIRES=${_kvtier_next_major}.0")
kvtier_consumer_test(consumer_pkgconfig pkgconfig shared SCRIPT -DLANG=CXX)
kvtier_consumer_test(consumer_pkgconfig_c pkgconfig shared SCRIPT -DLANG=C)

# The parent builds kvtier in the same configuration, into the same cargo
# target directory: cargo finds the library up to date, so this costs a
# configure and two small compiles.
kvtier_packaging_test(consumer_add_subdirectory consumer.cmake ${_kvtier_consumer_common}
  "-DSOURCE_DIR=${_kvtier_packaging}/subdirectory" "-DKVTIER_SOURCE=${KVTIER_ROOT}"
  "-DWORK_DIR=${_kvtier_consumers}/consumer_add_subdirectory" -DMODE=subdirectory -DEXPECT=shared
  "-DBUILD_TYPE=$<CONFIG>" "-DCTEST=${CMAKE_CTEST_COMMAND}"
  "-DCONSUMER_ARGS=-DKVTIER_CARGO_TARGET_DIR=${KVTIER_CARGO_TARGET_DIR}")

# The plugin host: built without linking kvtier, run against the installed
# tree. Its table of functions comes from the header: CMake lists the
# declarations of include/kvtier.h into kvtier_exports.h (and configures
# again when the header changes), so a new export is resolved and called
# through its prototype's type without editing the test.
include("${_kvtier_packaging}/header_exports.cmake")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${KVTIER_INCLUDE_DIR}/kvtier.h")
kvtier_header_functions(_kvtier_functions "${KVTIER_INCLUDE_DIR}/kvtier.h")
set(_kvtier_exports "/* Generated by c_tests/packaging/tests.cmake from include/kvtier.h: X(name) for each function it declares. */\n#define KVTIER_EXPORTS(X)")
foreach(name IN LISTS _kvtier_functions)
  string(APPEND _kvtier_exports " \\\n    X(${name})")
endforeach()
set(_kvtier_dlopen_dir "${CMAKE_CURRENT_BINARY_DIR}/dlopen")
# Written through a copy that changes only when the list does (file(CONFIGURE)
# needs CMake 3.18), so a reconfigure does not rebuild the host.
file(WRITE "${_kvtier_dlopen_dir}/kvtier_exports.h.new" "${_kvtier_exports}\n")
configure_file("${_kvtier_dlopen_dir}/kvtier_exports.h.new" "${_kvtier_dlopen_dir}/kvtier_exports.h" COPYONLY)
add_executable(dlopen_host "${_kvtier_packaging}/dlopen_host.c")
target_include_directories(dlopen_host PRIVATE "${KVTIER_INCLUDE_DIR}" "${_kvtier_dlopen_dir}")
target_compile_options(dlopen_host PRIVATE ${_kvtier_warnings})
target_link_libraries(dlopen_host PRIVATE ${CMAKE_DL_LIBS})
set_target_properties(dlopen_host PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
set(_kvtier_installed_lib "${_kvtier_prefix}/${CMAKE_INSTALL_LIBDIR}")
add_test(NAME package_dlopen COMMAND dlopen_host "${_kvtier_installed_lib}")
set_tests_properties(package_dlopen PROPERTIES
  TIMEOUT ${KVTIER_TEST_TIMEOUT} LABELS package FIXTURES_REQUIRED kvtier_installed
  ENVIRONMENT "LD_LIBRARY_PATH=${_kvtier_installed_lib}")

kvtier_packaging_test(package_exports check_exports.cmake
  "-DREADELF=${KVTIER_READELF}" "-DLIBRARY=${_kvtier_installed_lib}/${KVTIER_SHARED_FILE}"
  "-DHEADER=${_kvtier_prefix}/${CMAKE_INSTALL_INCLUDEDIR}/kvtier.h")
set_tests_properties(package_exports PROPERTIES FIXTURES_REQUIRED kvtier_installed)
