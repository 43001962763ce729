# The installed shared library exports exactly the functions kvtier.h
# declares: no export missing from the header (which the dlopen test, driven
# by the header, could not see), no declaration without its symbol.
#
# Usage: cmake -DREADELF= -DLIBRARY=<installed .so> -DHEADER=<kvtier.h> -P check_exports.cmake

cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/header_exports.cmake")

if(NOT READELF)
  message(FATAL_ERROR "readelf (binutils) is needed to list the exports of ${LIBRARY}")
endif()
kvtier_header_functions(declared "${HEADER}")

execute_process(COMMAND "${READELF}" --dyn-syms -W "${LIBRARY}"
  OUTPUT_VARIABLE text ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} --dyn-syms ${LIBRARY} failed (${rc}): ${errors}")
endif()
# "  12: 000000000004e2d0   123 FUNC    GLOBAL DEFAULT   14 tier_new"; an
# undefined symbol has UND for its section.
string(REGEX MATCHALL "FUNC +GLOBAL +DEFAULT +[0-9]+ +tier_[a-z0-9_]+" defined "${text}")
set(exported)
foreach(entry IN LISTS defined)
  string(REGEX REPLACE "^.* (tier_[a-z0-9_]+)$" "\\1" name "${entry}")
  list(APPEND exported "${name}")
endforeach()

set(problems "")
foreach(name IN LISTS exported)
  if(NOT name IN_LIST declared)
    list(APPEND problems "${name} is exported but not declared in kvtier.h")
  endif()
endforeach()
foreach(name IN LISTS declared)
  if(NOT name IN_LIST exported)
    list(APPEND problems "${name} is declared in kvtier.h but not exported")
  endif()
endforeach()
if(problems)
  string(REPLACE ";" "\n  " problems "${problems}")
  message(FATAL_ERROR "${LIBRARY} and ${HEADER} disagree:\n  ${problems}")
endif()
list(LENGTH declared count)
message(STATUS "${LIBRARY}: exports the ${count} functions of kvtier.h and no other tier_*")
