#!/usr/bin/env bash
# The standard collectives sweep (nccl-tests style): every AllReduce algorithm against
# MPI_Allreduce from 4 B to 64 MiB, then the other collectives, and every AllToAll algorithm
# against MPI_Alltoall from 4 B to 16 MiB per peer, at NP ranks (default 2).
# Usage: mpi_scripts/collectives_bench.sh [NP] [extra collectives_bench flags...]
# Writes results/collectives_<op>_np<NP>.json.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
NP="${1:-2}"; shift || true
pwm_count collectives_bench.sh NP "$NP" 1 4096
pwm_install_deps
pwm_build >/dev/null
mkdir -p "$PWM_ROOT/results"
BENCH="$BUILD_DIR/bench/collectives/collectives_bench"
run() {
  echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $NP $BENCH $*"
  "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$NP" "$BENCH" "$@"
}
run -b 4 -e 64M -f 4 -n 20 -w 5 --op allreduce --algo ring,hd,rd,auto,mpi \
    --json "$PWM_ROOT/results/collectives_allreduce_np$NP.json" "$@"
for op in reduce_scatter allgather broadcast reduce; do
  run -b 1K -e 64M -f 16 -n 10 -w 3 --op "$op" --json "$PWM_ROOT/results/collectives_${op}_np$NP.json" "$@"
done
run -b 4 -e 16M -f 4 -n 20 -w 5 --op alltoall --algo pairwise,bruck,linear,auto,mpi \
    --json "$PWM_ROOT/results/collectives_alltoall_np$NP.json" "$@"
