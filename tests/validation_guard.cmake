# Runs `moesim validate` on the calibration cases and fails when the mean or max absolute error
# (all cases, and the held-out half) exceeds the figures recorded in
# bench/validation/recorded.json, or when fewer cases ran. The recorded figures are the measured
# ones rounded up to the next 0.1 percentage point; lower them when the models improve.
# CASES and RECORDED default to the calibration cases and their recorded figures.
if(NOT DEFINED CASES)
  set(CASES ${ROOT}/bench/validation/calibration_cases.json)
endif()
if(NOT DEFINED RECORDED)
  set(RECORDED ${ROOT}/bench/validation/recorded.json)
endif()
execute_process(COMMAND ${CLI} validate ${CASES} --json ${OUT}
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moesim validate failed (${rc}): ${err}")
endif()
file(READ ${OUT} report)
file(READ ${RECORDED} recorded)
foreach(split all held_out)
  string(JSON n GET "${report}" summary ${split} cases)
  string(JSON n_rec GET "${recorded}" ${split} cases)
  if(n LESS n_rec)
    message(FATAL_ERROR "validation ${split}: only ${n} cases ran (recorded ${n_rec})")
  endif()
  foreach(stat mean_abs_error_pct max_abs_error_pct)
    string(JSON got GET "${report}" summary ${split} ${stat})
    string(JSON limit GET "${recorded}" ${split} ${stat})
    message(STATUS "${split} ${stat}: ${got} (recorded limit ${limit}), ${n} cases")
    if(got GREATER limit)  # CMake compares numbers as doubles
      message(FATAL_ERROR "validation ${split} ${stat} rose to ${got}% (recorded ${limit}%)")
    endif()
  endforeach()
endforeach()
