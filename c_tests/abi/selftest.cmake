# The ABI check's own test: check_abi.cmake, with kvtier's suppressions, run
# on scratch libraries built from selftest/scratch.c (see there) must fail on
# a field inserted in the middle and on a removed function, and pass an
# appended field and an added function. So a passing abi_check means
# something.
#
# Usage: cmake -DCC= -DABIDW= -DABIDIFF= -DSUPPRESSIONS= -DCHECK= -DSOURCE=
#              -DWORK_DIR= -P selftest.cmake
if(NOT ABIDW OR NOT ABIDIFF OR NOT EXISTS "${ABIDW}" OR NOT EXISTS "${ABIDIFF}")
  if("$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "abidw/abidiff not found and CI=true: install abigail-tools")
  endif()
  message("SKIP: abidw/abidiff not found (Debian: apt-get install abigail-tools)")
  return()
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(layout 0 1 2 3)
  execute_process(
    COMMAND "${CC}" -g -shared -fPIC -DSCRATCH_LAYOUT=${layout} "${SOURCE}"
            -o "${WORK_DIR}/libscratch${layout}.so"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "could not build scratch layout ${layout}")
  endif()
endforeach()
foreach(layout 0 3)
  execute_process(COMMAND "${ABIDW}" --out-file "${WORK_DIR}/scratch${layout}.abi"
                          "${WORK_DIR}/libscratch${layout}.so" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "abidw failed on scratch layout ${layout}")
  endif()
endforeach()

# <baseline layout> <library layout> <expected: pass|fail> <what>
set(cases
  "0;0;pass;the same library"
  "0;1;fail;a field inserted in the middle of a struct"
  "0;2;pass;a field appended to a struct"
  "0;3;pass;a function added"
  "3;0;fail;a function removed")
list(LENGTH cases n)
math(EXPR last "${n} / 4 - 1")
foreach(i RANGE ${last})
  math(EXPR at "${i} * 4")
  list(SUBLIST cases ${at} 4 c)
  list(GET c 0 base)
  list(GET c 1 lib)
  list(GET c 2 want)
  list(GET c 3 what)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" "-DABIDIFF=${ABIDIFF}" "-DSUPPRESSIONS=${SUPPRESSIONS}"
            "-DBASELINE=${WORK_DIR}/scratch${base}.abi" "-DLIBRARY=${WORK_DIR}/libscratch${lib}.so"
            -P "${CHECK}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    set(got pass)
  else()
    set(got fail)
  endif()
  if(got STREQUAL want)
    message(STATUS "ok: ${what}: the check says ${got}")
  else()
    message("${out}")
    message(SEND_ERROR "${what}: the check says ${got}, expected ${want}")
  endif()
endforeach()
