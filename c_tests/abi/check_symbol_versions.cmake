# Every symbol the shared library defines in its dynamic table is a tier_*
# function in the version node KVTIER_<TIER_ABI_VERSION> or a later node of
# that ABI, KVTIER_<TIER_ABI_VERSION>.<n> (abi/kvtier.map), as `objdump -T`
# shows it; the nodes themselves are the only other entries.
#
# Usage: cmake -DOBJDUMP= -DLIBRARY= -DNODE= -P check_symbol_versions.cmake
execute_process(COMMAND "${OBJDUMP}" -T "${LIBRARY}"
  OUTPUT_VARIABLE table ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${OBJDUMP} -T ${LIBRARY} failed (${rc}): ${errors}")
endif()
string(REPLACE "\n" ";" lines "${table}")
set(exports)
set(problems)
foreach(line IN LISTS lines)
  # Defined entries: "<addr> g DF .text <size> <version> <name>".
  if(NOT line MATCHES "^[0-9a-f]+ .* ([^ ]+)[ \t]+([^ ]+)$" OR line MATCHES "\\*UND\\*")
    continue()
  endif()
  string(REGEX MATCH "([^ \t]+)[ \t]+([^ \t]+)$" _ "${line}")
  set(version "${CMAKE_MATCH_1}")
  set(name "${CMAKE_MATCH_2}")
  string(REGEX MATCH "^${NODE}(\\.[0-9]+)?$" in_node "${version}")
  if(in_node AND name STREQUAL version AND line MATCHES "\\*ABS\\*")
    continue()
  endif()
  if(NOT name MATCHES "^tier_")
    list(APPEND problems "${name} is exported (only tier_* may be)")
  elseif(NOT in_node)
    list(APPEND problems "${name} is in version ${version}, not ${NODE} or ${NODE}.<n>")
  else()
    list(APPEND exports "${name}")
  endif()
endforeach()
list(LENGTH exports n)
if(n LESS 20)
  list(APPEND problems "only ${n} tier_* exports found in ${NODE}")
endif()
if(problems)
  string(REPLACE ";" "\n  " problems "${problems}")
  message(FATAL_ERROR "${LIBRARY}:\n  ${problems}\n${table}")
endif()
message(STATUS "${LIBRARY}: ${n} exports, every one tier_* in ${NODE} or ${NODE}.<n>")
