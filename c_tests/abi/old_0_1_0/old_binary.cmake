# A program built against the 0.1.0 header of ff447d3 never runs with today's
# library writing past its structs: built as it was then (DT_NEEDED
# libkvtier.so.0, through stub.c), it is started with only today's library
# on the search path, and the loader must refuse it (today's soname is
# libkvtier.so.<TIER_ABI_VERSION>); if it ever does start, its guard bytes
# must be intact.
#
# Then an upgrade in place: today's library installed (its file and soname
# link) into a directory holding a 0.1.0 install (libkvtier.so.0.1.0 and the
# libkvtier.so.0 link) must leave the old link on a library of the old
# soname, so that the old program never loads today's library.
#
# Usage: cmake -DCC= -DREADELF= -DSOURCE_DIR= -DLIBRARY_DIR= -DSONAME= -DSHARED_FILE=
#              -DWORK_DIR= -P old_binary.cmake
cmake_minimum_required(VERSION 3.16)
include("${SOURCE_DIR}/../../packaging/elf.cmake")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/stub")
execute_process(
  COMMAND "${CC}" -shared -fPIC -I "${SOURCE_DIR}" -Wl,-soname,libkvtier.so.0
          "${SOURCE_DIR}/stub.c" -o "${WORK_DIR}/stub/libkvtier.so"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not build the 0.1.0 stand-in")
endif()
execute_process(
  COMMAND "${CC}" -std=c11 -I "${SOURCE_DIR}" "${SOURCE_DIR}/old_app.c" -L "${WORK_DIR}/stub" -lkvtier
          -o "${WORK_DIR}/old_app"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not build old_app against the 0.1.0 header")
endif()
kvtier_elf_dynamic("${READELF}" "${WORK_DIR}/old_app" unused needed)
if(NOT "libkvtier.so.0" IN_LIST needed)
  message(FATAL_ERROR "old_app does not need libkvtier.so.0 (NEEDED: ${needed})")
endif()
if(SONAME STREQUAL "libkvtier.so.0")
  message(FATAL_ERROR "today's library still has the 0.1.0 soname ${SONAME}")
endif()
message(STATUS "old_app needs libkvtier.so.0; ${LIBRARY_DIR} holds ${SONAME}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${LIBRARY_DIR}" "${WORK_DIR}/old_app"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "LD_LIBRARY_PATH=${LIBRARY_DIR} old_app: exit ${rc}\n${out}${err}")
if(rc EQUAL 0)
  if(NOT out MATCHES "guard bytes intact")
    message(FATAL_ERROR "old_app ran but did not report intact guards")
  endif()
  message(STATUS "old_app ran with its guard bytes intact")
elseif(err MATCHES "libkvtier\\.so\\.0: cannot open shared object file")
  message(STATUS "old_app was refused by the loader, as it must be")
else()
  message(FATAL_ERROR "old_app neither ran intact nor was refused by the loader (exit ${rc})")
endif()

# The upgrade in place, as `cmake --install` or a package would lay it out.
set(prefix "${WORK_DIR}/upgraded")
file(MAKE_DIRECTORY "${prefix}")
file(COPY "${WORK_DIR}/stub/libkvtier.so" DESTINATION "${WORK_DIR}/old-real")
file(RENAME "${WORK_DIR}/old-real/libkvtier.so" "${prefix}/libkvtier.so.0.1.0")
file(CREATE_LINK "libkvtier.so.0.1.0" "${prefix}/libkvtier.so.0" SYMBOLIC)
execute_process(COMMAND "${CMAKE_COMMAND}" -E copy "${LIBRARY_DIR}/${SHARED_FILE}" "${prefix}/${SHARED_FILE}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not copy ${SHARED_FILE} into ${prefix}")
endif()
file(CREATE_LINK "${SHARED_FILE}" "${prefix}/${SONAME}" SYMBOLIC)
get_filename_component(old_target "${prefix}/libkvtier.so.0" REALPATH)
kvtier_elf_dynamic("${READELF}" "${old_target}" old_target_soname unused)
if(NOT old_target_soname STREQUAL "libkvtier.so.0")
  message(FATAL_ERROR "after installing ${SHARED_FILE} over a 0.1.0 install, libkvtier.so.0 "
                      "resolves to ${old_target} (soname ${old_target_soname}): old programs would load today's library")
endif()
message(STATUS "installed ${SHARED_FILE} beside libkvtier.so.0.1.0: libkvtier.so.0 still resolves to the 0.1.0 library")
