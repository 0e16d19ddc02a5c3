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
# Every run in the file really ran: a run predicted not to fit is a false "does not fit" unless
# the recorded figures name it with a one-line reason (predicted_not_to_fit: {id: reason}).
string(JSON n_oom LENGTH "${report}" summary predicted_not_to_fit)
if(n_oom GREATER 0)
  math(EXPR last "${n_oom} - 1")
  foreach(i RANGE ${last})
    string(JSON id GET "${report}" summary predicted_not_to_fit ${i})
    string(JSON why ERROR_VARIABLE missing GET "${recorded}" predicted_not_to_fit ${id})
    if(missing)
      message(FATAL_ERROR "validation: ${id} really ran but is predicted not to fit, and "
                          "${RECORDED} gives no reason for it (predicted_not_to_fit.${id})")
    endif()
    message(STATUS "predicted not to fit, with its recorded reason: ${id}: ${why}")
  endforeach()
endif()
