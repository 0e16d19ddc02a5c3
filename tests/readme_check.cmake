# Checks that the last command of .ci/run appears verbatim in README.md.
file(STRINGS "${ROOT}/.ci/run" lines)
list(GET lines -1 command)
file(READ "${ROOT}/README.md" readme)
string(FIND "${readme}" "${command}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR ".ci/run runs '${command}', which README.md does not show")
endif()
