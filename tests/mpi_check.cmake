# `mpirun -n 1/2/4 moesim search` (the ranks sharing one search) prints exactly what one process
# prints. -DCLI=<moesim> -DMPIRUN=<mpirun> -DSCENARIO=<scenario> -DWORKDIR=<dir>
file(MAKE_DIRECTORY "${WORKDIR}")
execute_process(COMMAND "${CLI}" search "${SCENARIO}" --format json --threads 1
                OUTPUT_FILE "${WORKDIR}/one.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "one process: exit ${rc}")
endif()
foreach(n 1 2 4)
  # Root in containers and CI: Open MPI refuses it without these.
  execute_process(COMMAND "${MPIRUN}" --allow-run-as-root --oversubscribe -n ${n} "${CLI}" search "${SCENARIO}"
                          --format json --threads 1
                  OUTPUT_FILE "${WORKDIR}/mpi${n}.json" ERROR_FILE "${WORKDIR}/mpi${n}.err" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    file(READ "${WORKDIR}/mpi${n}.err" err)
    message(FATAL_ERROR "mpirun -n ${n}: exit ${rc}: ${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORKDIR}/one.json" "${WORKDIR}/mpi${n}.json"
                  RESULT_VARIABLE same)
  if(NOT same EQUAL 0)
    message(FATAL_ERROR "mpirun -n ${n} ranked differently from one process (${WORKDIR}/mpi${n}.json)")
  endif()
endforeach()
message(STATUS "mpirun -n 1, 2, 4: the same ranking as one process")
