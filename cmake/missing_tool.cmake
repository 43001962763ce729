# Stands in for a test whose tool is missing here:
#   cmake -DTOOL=<name> -DHINT=<how to install it> -P missing_tool.cmake
# Prints the skip marker (the test's SKIP_REGULAR_EXPRESSION) and exits 0; under
# CI=true, where nothing may skip, fails instead.
if("$ENV{CI}" STREQUAL "true")
  message(FATAL_ERROR "${TOOL} is required under CI=true but not installed (${HINT})")
endif()
message("KVTIER-SKIP: ${TOOL} is not installed (${HINT})")
