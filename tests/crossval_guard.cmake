# Runs the leave-one-source-out cross-validation over every published run in bench/validation
# (the number the README reports) and fails when its mean or max absolute error rises above
# bench/validation/recorded_crossval.json, when fewer runs ran, or when the error bands the
# library embeds (models/presets/error_bands.json) are not the ones this validation gives
# (regenerate them with bench/validation/run.sh).
set(V ${ROOT}/bench/validation)
execute_process(COMMAND ${CLI} validate ${V}/calibration_cases.json ${V}/supplementary_cases.json
                        ${V}/cases_ascend.json ${V}/cases_gpu.json ${V}/cases_pangu.json
                        --cross-validate source --threads 2 --json ${OUT} --bands-out ${OUT}.bands.json
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moesim validate --cross-validate failed (${rc}): ${err}")
endif()
file(READ ${OUT} report)
file(READ ${V}/recorded_crossval.json recorded)
string(JSON n GET "${report}" cross_validation leave_one_source_out cases)
string(JSON n_rec GET "${recorded}" runs)
if(n LESS n_rec)
  message(FATAL_ERROR "cross-validation: only ${n} runs (recorded ${n_rec})")
endif()
foreach(stat mean_abs_error_pct max_abs_error_pct)
  string(JSON got GET "${report}" cross_validation leave_one_source_out ${stat})
  string(JSON limit GET "${recorded}" ${stat})
  message(STATUS "leave one source out ${stat}: ${got} (recorded limit ${limit}), ${n} runs")
  if(got GREATER limit)
    message(FATAL_ERROR "leave-one-source-out ${stat} rose to ${got}% (recorded ${limit}%)")
  endif()
endforeach()
file(READ ${OUT}.bands.json fresh)
file(READ ${ROOT}/models/presets/error_bands.json embedded)
string(JSON fresh_bands GET "${fresh}" bands)
string(JSON embedded_bands GET "${embedded}" bands)
string(JSON same EQUAL "${fresh_bands}" "${embedded_bands}")
if(NOT same)
  message(FATAL_ERROR "models/presets/error_bands.json is stale: the cross-validation gives ${fresh_bands}; "
                      "run bench/validation/run.sh")
endif()
