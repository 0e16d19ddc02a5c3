# Fails when COPY differs from REF; passes (with a note) when REF is not present.
if(NOT EXISTS "${REF}")
  message(STATUS "no shared reference at ${REF}; nothing to compare")
  return()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${COPY}" "${REF}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${COPY} differs from ${REF}; copy the shared file again and re-run bench/validation/run.sh")
endif()
