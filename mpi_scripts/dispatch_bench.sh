#!/usr/bin/env bash
# The Pathways dispatch benchmark (paper Fig. 5-8) at 2 and 4 workers (3 and 5 ranks: rank 0 is
# the controller), then Fig. 8 again with the controller on a core of its own (1 worker, each rank
# bound to a core), the paper's layout, where the controller's CPU is not taken from a device.
# Writes results/dispatch_np<NP>.json and results/dispatch_fig8_own_core.json. Do not run it while anything compiles:
# the numbers compare throughputs on the same 2 cores.
# Usage: mpi_scripts/dispatch_bench.sh [extra dispatch_bench flags...]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
pwm_install_deps
pwm_build >/dev/null
mkdir -p "$PWM_ROOT/results"
BENCH="$BUILD_DIR/bench/pathways/dispatch_bench"
# The numbers are ratios on shared cores: warn when something else is using them.
busy=$(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 20 && $2 != "ps" {print $2}' | head -3 | tr '\n' ' ')
[ -n "$busy" ] && echo "dispatch_bench.sh: warning: busy processes ($busy): results will be noisy (check eff_us)" >&2
for NP in ${NPS:-3 5}; do
  echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $NP $BENCH --json $PWM_ROOT/results/dispatch_np$NP.json $*"
  "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$NP" "$BENCH" --json "$PWM_ROOT/results/dispatch_np$NP.json" "$@"
done
if [ "$(nproc)" -ge 2 ] && [ -z "${NPS:-}" ]; then
  echo "\$ $PWM_MPIRUN $(pwm_mpirun_bind_core) -n 2 $BENCH --figs 8 --json $PWM_ROOT/results/dispatch_fig8_own_core.json $*"
  "$PWM_MPIRUN" $(pwm_mpirun_bind_core) -n 2 "$BENCH" --figs 8 --json "$PWM_ROOT/results/dispatch_fig8_own_core.json" "$@"
fi
