#!/usr/bin/env bash
# The Pathways dispatch benchmark (paper Fig. 5-8) at 2 and 4 workers (3 and 5 ranks: rank 0 is
# the controller), then Fig. 8 again with the controller on a core of its own (1 worker, each rank
# bound to a core), the paper's layout, where the controller's CPU is not taken from a device.
# Then Fig. 5's host axis on emulated clusters (mpi_scripts/cluster.sh): 1, 2 and 4 hosts with 1
# and 2 workers per host (ranks round-robin over the hosts; the controller shares host 0).
# Writes results/dispatch_*.json, draws results/fig5.png, fig6.png, fig7.png, fig8_*.png and
# prints every Pathways row against SPMD as the median of the rounds' paired ratios with its
# interval (mpi_scripts/dispatch_plot.py, docs/measurement.md). Do not run it while anything
# compiles: the numbers compare throughputs on the same 2 cores.
# Usage: mpi_scripts/dispatch_bench.sh [extra dispatch_bench flags...]
#   NPS="3"            one-host runs at these rank counts only, and no own-core run
#   HOSTS="1 2 4"      host counts of the cluster sweep ("" to skip it); PER_HOST="1 2"
#   HOST_FLAGS=...     dispatch_bench flags of the cluster sweep (default: Fig. 5 only, 3 reps)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# The settings' numbers, read as every script's flags (env.sh), before anything is built.
for v in ${NPS:-3}; do pwm_count dispatch_bench.sh NPS "$v" 2 64; done
for v in ${HOSTS-1}; do pwm_count dispatch_bench.sh HOSTS "$v" 1 16; done
for v in ${PER_HOST:-1}; do pwm_count dispatch_bench.sh PER_HOST "$v" 1 16; done
pwm_install_deps
pwm_build >/dev/null
RES="${PWM_DISPATCH_OUT:-$PWM_ROOT/results}"  # (mpi_scripts/report.sh: its own folder)
mkdir -p "$RES"
BENCH="$BUILD_DIR/bench/pathways/dispatch_bench"
# The numbers are ratios on shared cores: warn when something else is using them.
busy=$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 20 && $2 != "ps" {print $2}' | head -3 | tr '\n' ' ')
[ -n "$busy" ] && echo "dispatch_bench.sh: warning: busy processes ($busy): results will be noisy (check eff_us)" >&2
JSONS=()
for NP in ${NPS:-3 5}; do
  echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $NP $BENCH --json $RES/dispatch_np$NP.json $*"
  "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$NP" "$BENCH" --json "$RES/dispatch_np$NP.json" "$@"
  JSONS+=("$RES/dispatch_np$NP.json")
done
if [ "$(nproc)" -ge 2 ] && [ -z "${NPS:-}" ]; then
  echo "\$ $PWM_MPIRUN $(pwm_mpirun_bind_core) -n 2 $BENCH --figs 8 --json $RES/dispatch_fig8_own_core.json $*"
  "$PWM_MPIRUN" $(pwm_mpirun_bind_core) -n 2 "$BENCH" --figs 8 --json "$RES/dispatch_fig8_own_core.json" "$@"
  JSONS+=("$RES/dispatch_fig8_own_core.json")
fi
# Fig. 5 over emulated hosts. One host is the same machine without namespaces (shared memory
# only); more hosts talk TCP across the bridge.
read -r -a HOST_ARGS <<< "${HOST_FLAGS:---figs 5 --reps 3}"
for K in ${HOSTS-1 2 4}; do
  for W in ${PER_HOST:-1 2}; do
    N=$((K * W + 1)); J="$RES/dispatch_hosts${K}_w$W.json"
    if [ "$K" = 1 ]; then
      echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $N $BENCH ${HOST_ARGS[*]} --json $J"
      "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$N" "$BENCH" "${HOST_ARGS[@]}" --json "$J"
    else
      # One island over every worker, as a TPU pod's ICI spans its hosts (the paper's Fig. 5).
      echo "\$ cluster.sh run --hosts $K --slots 1 -- \$PWM_CLUSTER_MPIRUN -n $N $BENCH ${HOST_ARGS[*]} --islands 1x$((N - 1)) --json $J"
      bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts "$K" --slots 1 --timeout 1800 -- \
        bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n "$N" "$BENCH" "${HOST_ARGS[@]}" --islands "1x$((N - 1))" --json "$J"
    fi
    JSONS+=("$J")
  done
done
python3 "$PWM_ROOT/mpi_scripts/dispatch_plot.py" "$RES" "${JSONS[@]}"
