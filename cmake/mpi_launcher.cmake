# The MPI launcher for tests, from the MPI library that find_package(MPI) found.
#
# Tested: OpenMPI (mpirun/orterun) and MPICH's Hydra (mpiexec.hydra; also the launcher of Intel
# MPI, MVAPICH and, with the same flags, Cray's). They differ in three ways that matter here:
#   - running more ranks than cores: OpenMPI refuses without --oversubscribe; Hydra just runs;
#   - binding: OpenMPI binds ranks to cores by default (--bind-to none undoes it); Hydra does not;
#   - passing environment variables: OpenMPI `-x VAR=VALUE`, Hydra `-genv VAR VALUE`.
# The launcher is MPIEXEC_EXECUTABLE (set it, and MPI_CXX_COMPILER, to pick a library:
# mpi_scripts/env.sh does for PWM_MPI=openmpi|mpich). Sets:
#   PWM_MPIEXEC, PWM_MPI_FLAVOR (openmpi | mpich), PWM_MPIEXEC_FLAGS (a list)
# and defines pwm_mpiexec_command(OUT RANKS n [ENV VAR=VALUE ...] COMMAND exe args...).

set(PWM_MPIEXEC ${MPIEXEC_EXECUTABLE})
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _pwm_v ERROR_VARIABLE _pwm_v
                RESULT_VARIABLE _pwm_rc TIMEOUT 20)
if(_pwm_v MATCHES "Open MPI|OpenRTE")
  set(PWM_MPI_FLAVOR openmpi)
  set(PWM_MPIEXEC_FLAGS --oversubscribe --bind-to none)
elseif(_pwm_v MATCHES "HYDRA|MPICH|Intel")
  set(PWM_MPI_FLAVOR mpich)
  set(PWM_MPIEXEC_FLAGS "")
else()
  message(FATAL_ERROR "pathways-mpi: cannot tell which MPI launcher ${MPIEXEC_EXECUTABLE} is (neither OpenMPI "
          "nor MPICH's Hydra answered to --version); set -DMPIEXEC_EXECUTABLE to the launcher of the MPI "
          "library you build with")
endif()

# The library linked and the launcher must belong together: an OpenMPI binary started by Hydra
# (or the reverse) runs every rank as a singleton of its own world.
set(_pwm_lib_flavor "")
if(MPI_CXX_LIBRARIES MATCHES "mpich")
  set(_pwm_lib_flavor mpich)
elseif(MPI_CXX_LIBRARIES MATCHES "openmpi")
  set(_pwm_lib_flavor openmpi)
endif()
if(_pwm_lib_flavor AND NOT _pwm_lib_flavor STREQUAL PWM_MPI_FLAVOR)
  message(FATAL_ERROR "pathways-mpi: the MPI library linked is ${_pwm_lib_flavor} (${MPI_CXX_LIBRARIES}) but the "
          "launcher ${MPIEXEC_EXECUTABLE} is ${PWM_MPI_FLAVOR}'s; pass the matching -DMPIEXEC_EXECUTABLE "
          "(or use mpi_scripts/test.sh with PWM_MPI=openmpi|mpich)")
endif()
message(STATUS "pathways-mpi: MPI launcher ${PWM_MPIEXEC} (${PWM_MPI_FLAVOR})")

# pwm_mpiexec_command(OUT RANKS n [ENV VAR=VALUE ...] COMMAND exe args...): the full launch line
# in the found launcher's dialect.
function(pwm_mpiexec_command out)
  cmake_parse_arguments(L "" "RANKS" "ENV;COMMAND" ${ARGN})
  set(cmd ${PWM_MPIEXEC} ${PWM_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${L_RANKS})
  foreach(kv ${L_ENV})
    if(PWM_MPI_FLAVOR STREQUAL "openmpi")
      list(APPEND cmd -x ${kv})
    else()
      string(FIND "${kv}" "=" eq)
      string(SUBSTRING "${kv}" 0 ${eq} k)
      math(EXPR eq "${eq} + 1")
      string(SUBSTRING "${kv}" ${eq} -1 v)
      list(APPEND cmd -genv ${k} ${v})
    endif()
  endforeach()
  set(${out} ${cmd} ${L_COMMAND} PARENT_SCOPE)
endfunction()

# What every MPI test's environment gets: OpenMPI refuses root without the first two and warns
# about missing high-speed NICs without the third; the PWM_MPIEXEC* variables tell the Python
# case files (tests/harness/launch.py) which launcher to use. Hydra ignores the OMPI_ ones.
string(REPLACE ";" " " _pwm_flags "${PWM_MPIEXEC_FLAGS}")
set(PWM_MPI_TEST_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_btl_base_warn_component_unused=0"
    "PWM_MPIEXEC=${PWM_MPIEXEC};PWM_MPIEXEC_FLAGS=${_pwm_flags};PWM_MPI_FLAVOR=${PWM_MPI_FLAVOR}"
    "PWM_MPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}")
