# Fails unless BINARY was built with AddressSanitizer: it must reference the
# runtime's initializer and the report functions instrumented code calls.
# Usage: cmake -DNM=<nm> -DBINARY=<file> -P check_asan_symbols.cmake

if(NOT NM OR NOT BINARY)
  message(FATAL_ERROR "usage: cmake -DNM=<nm> -DBINARY=<file> -P check_asan_symbols.cmake")
endif()

execute_process(COMMAND "${NM}" "${BINARY}"
  OUTPUT_VARIABLE symbols
  ERROR_VARIABLE errors
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} ${BINARY} failed (${rc}): ${errors}")
endif()

foreach(pattern "__asan_init" "__asan_report_(load|store)")
  if(NOT symbols MATCHES "${pattern}")
    message(FATAL_ERROR "${BINARY} has no symbol matching ${pattern}: not built with AddressSanitizer")
  endif()
endforeach()
message(STATUS "${BINARY} references __asan_init and __asan_report_*: instrumented")
