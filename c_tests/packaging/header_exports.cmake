# kvtier_header_functions(<out var> <header>): the names of the functions
# kvtier.h declares, in header order. A declaration starts a line with its
# return type (`tier_status_t tier_new(...`, `const char *tier_version(void);`,
# `const char *const *tier_config_keys(...`);
# comments, macros and typedefs do not match.
function(kvtier_header_functions out header)
  file(STRINGS "${header}" lines REGEX "^[A-Za-z_][A-Za-z0-9_ *]*[ *]tier_[a-z0-9_]+\\(")
  set(names)
  foreach(line IN LISTS lines)
    if(line MATCHES "^typedef")
      continue()
    endif()
    string(REGEX REPLACE "^[^(]*[ *](tier_[a-z0-9_]+)\\(.*$" "\\1" name "${line}")
    list(APPEND names "${name}")
  endforeach()
  if(NOT names)
    message(FATAL_ERROR "no function declarations found in ${header}")
  endif()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()
