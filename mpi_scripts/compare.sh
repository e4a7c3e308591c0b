#!/usr/bin/env bash
# README's first command: the project's main job on its built-in default workload.
# Until the two trainers land (issues 4, 5 and 7) the side-by-side comparison is the
# collectives layer both of them run on: our AllReduce algorithms against MPI_Allreduce at 2
# ranks, written to results/.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec bash "$PWM_ROOT/mpi_scripts/collectives_bench.sh" "${NP:-2}" "$@"
