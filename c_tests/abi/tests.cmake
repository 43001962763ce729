# The ABI tests (label abi; included by c_tests/CMakeLists.txt). See
# docs/abi.md for the rules they hold the library to.
#
#   abi_check              abidiff of the built library against the committed
#                          baseline abi/libkvtier.abi (check_abi.cmake)
#   abi_check_selftest     that check on scratch libraries: a field inserted in
#                          the middle and a removed function fail it, an
#                          appended field and an added function pass
#   abi_symbol_versions    objdump -T: every export is tier_* in KVTIER_<abi>
#   abi_frozen_header      frozen/frozen_abi1.c, built against the frozen ABI 1
#                          header, under ASan against today's library, guard
#                          bytes after every struct and array
#   abi_old_binary_refused a program built against the 0.1.0 header of
#                          ff447d3 is refused by the loader, and installing
#                          today's library over a 0.1.0 install leaves the
#                          old soname's library in place (old_0_1_0/)
#
# `cmake --build <build> --target abi_baseline` rewrites abi/libkvtier.abi
# from the built library: commit it with a compatible addition, or with an
# incompatible change together with a raised TIER_ABI_VERSION.

set(_kvtier_abi "${CMAKE_CURRENT_LIST_DIR}")
set(_kvtier_abi_library "${KVTIER_STAGE_DIR}/${KVTIER_SHARED_FILE}")
set(_kvtier_abi_baseline "${KVTIER_ROOT}/abi/libkvtier.abi")
set(_kvtier_abi_suppressions "${KVTIER_ROOT}/abi/kvtier.abignore")
find_program(KVTIER_ABIDW abidw)
find_program(KVTIER_ABIDIFF abidiff)
if(CMAKE_OBJDUMP)
  set(KVTIER_OBJDUMP "${CMAKE_OBJDUMP}")
else()
  find_program(KVTIER_OBJDUMP objdump)
endif()
if(NOT KVTIER_ABIDW OR NOT KVTIER_ABIDIFF)
  message(WARNING "abidw/abidiff not found: abi_check skips (fails under CI=true); "
                  "scripts/test.sh installs abigail-tools")
  set(KVTIER_ABIDW "")
  set(KVTIER_ABIDIFF "")
endif()

function(kvtier_abi_test name)
  add_test(NAME ${name} COMMAND "${CMAKE_COMMAND}" ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${KVTIER_TEST_TIMEOUT} LABELS abi
                       SKIP_REGULAR_EXPRESSION "^SKIP: ")
endfunction()

kvtier_abi_test(abi_check
  "-DABIDIFF=${KVTIER_ABIDIFF}" "-DLIBRARY=${_kvtier_abi_library}"
  "-DBASELINE=${_kvtier_abi_baseline}" "-DSUPPRESSIONS=${_kvtier_abi_suppressions}"
  -P "${_kvtier_abi}/check_abi.cmake")
kvtier_abi_test(abi_check_selftest
  "-DCC=${CMAKE_C_COMPILER}" "-DABIDW=${KVTIER_ABIDW}" "-DABIDIFF=${KVTIER_ABIDIFF}"
  "-DSUPPRESSIONS=${_kvtier_abi_suppressions}" "-DCHECK=${_kvtier_abi}/check_abi.cmake"
  "-DSOURCE=${_kvtier_abi}/selftest/scratch.c" "-DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/abi-selftest"
  -P "${_kvtier_abi}/selftest.cmake")
kvtier_abi_test(abi_symbol_versions
  "-DOBJDUMP=${KVTIER_OBJDUMP}" "-DLIBRARY=${_kvtier_abi_library}" "-DNODE=KVTIER_${KVTIER_ABI_VERSION}"
  "-DMAP=${KVTIER_ROOT}/abi/kvtier.map"
  -P "${_kvtier_abi}/check_symbol_versions.cmake")
kvtier_abi_test(abi_old_binary_refused
  "-DCC=${CMAKE_C_COMPILER}" "-DREADELF=${KVTIER_READELF}" "-DSOURCE_DIR=${_kvtier_abi}/old_0_1_0"
  "-DLIBRARY_DIR=${KVTIER_STAGE_DIR}" "-DSONAME=${KVTIER_SONAME}" "-DSHARED_FILE=${KVTIER_SHARED_FILE}"
  "-DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/abi-old-binary"
  -P "${_kvtier_abi}/old_0_1_0/old_binary.cmake")

# Built against the frozen header alone (kvtier_abi1.h; the live include/ is
# not on its path), under ASan + UBSan.
add_executable(abi_frozen_abi1 "${_kvtier_abi}/frozen/frozen_abi1.c")
target_include_directories(abi_frozen_abi1 BEFORE PRIVATE "${_kvtier_abi}/frozen")
target_compile_options(abi_frozen_abi1 PRIVATE ${_kvtier_warnings} ${_kvtier_sanitize})
target_link_options(abi_frozen_abi1 PRIVATE ${_kvtier_sanitize})
target_link_libraries(abi_frozen_abi1 PRIVATE kvtier::shared ${CMAKE_DL_LIBS})
set_target_properties(abi_frozen_abi1 PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
add_test(NAME abi_frozen_header COMMAND abi_frozen_abi1)
set_tests_properties(abi_frozen_header PROPERTIES TIMEOUT ${KVTIER_TEST_TIMEOUT} LABELS "abi;asan"
                     ENVIRONMENT "${_kvtier_asan_environment}")

if(KVTIER_ABIDW)
  add_custom_target(abi_baseline
    COMMAND "${KVTIER_ABIDW}" --out-file "${_kvtier_abi_baseline}" "${_kvtier_abi_library}"
    DEPENDS kvtier_cargo
    COMMENT "abidw: rewriting abi/libkvtier.abi from the built library"
    VERBATIM)
endif()
