# Runs the moesim CLI and checks its exit status and output.
#   cmake -DCLI=... -DEXPECTED_RC=2 -DEXPECTED=regex -DARGS="simulate;file.json" -P cli_check.cmake
execute_process(COMMAND ${CLI} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
string(REPLACE "\n" " " flat "${all}")
if(NOT rc EQUAL EXPECTED_RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECTED_RC}\n${all}")
endif()
if(NOT flat MATCHES "${EXPECTED}")
  message(FATAL_ERROR "output does not match '${EXPECTED}':\n${all}")
endif()
message(STATUS "ok: exit ${rc}")
