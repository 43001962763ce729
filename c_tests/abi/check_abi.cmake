# The ABI check: abidiff of LIBRARY against the committed BASELINE (an abidw
# description), with SUPPRESSIONS (abi/kvtier.abignore: a field appended to a
# struct is compatible under the caller-size protocol) and added functions
# allowed (--no-added-syms). Any other change the library's exported
# functions can see fails: the fix is either to undo it or,
# for an intended break, to raise TIER_ABI_VERSION (the soname) and refresh the
# baseline in the same commit (`cmake --build <build> --target abi_baseline`).
#
# Usage: cmake -DABIDIFF= -DLIBRARY= -DBASELINE= -DSUPPRESSIONS= -P check_abi.cmake
# Without abidiff it fails under CI=true and is skipped (exit 77) otherwise.
foreach(var LIBRARY BASELINE SUPPRESSIONS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_abi.cmake: -D${var}= is required")
  endif()
endforeach()
if(NOT ABIDIFF OR NOT EXISTS "${ABIDIFF}")
  if("$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "abidiff not found and CI=true: install abigail-tools (scripts/test.sh does)")
  endif()
  message("SKIP: abidiff not found (Debian: apt-get install abigail-tools)")
  # cmake -P cannot choose its exit code; the test's SKIP_REGULAR_EXPRESSION
  # matches the line above.
  return()
endif()
execute_process(
  COMMAND "${ABIDIFF}" --no-added-syms --suppressions "${SUPPRESSIONS}" "${BASELINE}" "${LIBRARY}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE report ERROR_VARIABLE report)
message("${report}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abidiff ${BASELINE} ${LIBRARY}: exit ${rc} "
          "(4: ABI change, 8: incompatible change): an incompatible ABI change. Undo it, "
          "or raise TIER_ABI_VERSION and refresh the baseline in the same commit.")
endif()
message(STATUS "ABI of ${LIBRARY} is compatible with ${BASELINE}")
