#!/usr/bin/env bash
# The straggler experiment (issue 37): one rank of the job spends --delay ms more in every step
# (--straggler-ms, counted as its compute), and each execution model's throughput and bubble
# respond. Two layouts, every run without and with the delay, in interleaved rounds:
#   dp2    data parallelism over 2 devices, the straggler one of them (one replica slowed):
#          spmd_train --dp 2 (rank 1), pathways_train --granularity chained --dp 2 (rank 2, the
#          second worker), mpmd_train --granularity chained --dp 2 (rank 1);
#   pipe2  a 2-stage pipeline, 1F1B, 8 micro-batches, the straggler stage 1 (one stage slowed):
#          pathways_train --stages 2 --islands 2x1 (rank 2), mpmd_train --stages 2 (rank 1)
#          (spmd_train has no pipeline).
# Per model and layout: tokens/s without and with the delay, their ratio (the median of the
# per-round paired ratios with its interval, mpi_scripts/measure.py) beside the ratio a delay
# simply added to the step would give (step / (step + delay)), and a pipeline's bubble both ways.
#
# Usage: mpi_scripts/straggler_bench.sh [--delay MS] [--steps N] [--rounds R] [--out DIR] [-- TRAINER FLAGS...]
#   --delay MS    the straggler's extra time per step (default 50: about a fifth of the
#                 reference model's step on this machine's 2 cores)
#   --steps N     steps per run (default 10; the first 2 are warm-up)
#   --rounds R    interleaved rounds (default 3)
# Results: DIR/straggler_bench.json (default results/), the metrics of every run.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DELAY=50; STEPS=10; ROUNDS=3; OUT="$PWM_ROOT/results"; EXTRA=()
ME=straggler_bench.sh  # (flags read by env.sh's pwm_value, pwm_count, pwm_words)
while [ $# -gt 0 ]; do
  case "$1" in
    --delay) DELAY=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --steps) STEPS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --rounds) ROUNDS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "straggler_bench.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
pwm_count "$ME" --delay "$DELAY" 1; pwm_count "$ME" --steps "$STEPS" 4; pwm_count "$ME" --rounds "$ROUNDS"
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "straggler_bench: $(getconf _NPROCESSORS_ONLN) cores ($(lscpu | sed -n 's/^Model name: *//p')); commit $(git -C "$PWM_ROOT" rev-parse --short HEAD 2>/dev/null); $(date -u '+%Y-%m-%d %H:%M UTC'); delay $DELAY ms"
WORKLOAD=(--steps "$STEPS" --batch 32 --log-every 100 --eval-batches 1 "${EXTRA[@]}")
LAUNCH=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD)
SPMD="$BUILD_DIR/spmd/spmd_train" PT="$BUILD_DIR/mpmd/pathways_train" ST="$BUILD_DIR/mpmd/mpmd_train"
declare -A RUNS
run() {  # run NAME DELAY_MS STRAGGLER_RANK N BIN FLAGS...
  local name=$1 d=$2 rank=$3 n=$4 bin=$5; shift 5
  local base="$OUT/straggler_${name}_d$d.r$ROUND"
  # (The baseline, delay 0, names no straggler: --straggler-rank without a delay is refused.)
  local slow=(--straggler-ms "$d"); [ "$d" -gt 0 ] && slow+=(--straggler-rank "$rank")
  local cmd=("${LAUNCH[@]}" -n "$n" "$bin" "${WORKLOAD[@]}" "$@" "${slow[@]}" --metrics "$base.jsonl")
  [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}"
  "${cmd[@]}" > "$base.log" 2>&1 || { echo "straggler_bench.sh: error: run $name (delay $d) failed (log: $base.log)" >&2; exit 1; }
  RUNS[$name/$d]+="${RUNS[$name/$d]:+,}$base.jsonl"
}
one() {  # one NAME/DELAY
  local name=${1%/*} d=${1#*/}
  case $name in
    spmd_dp2) run "$name" "$d" 1 2 "$SPMD" --dp 2 ;;
    pathways_dp2) run "$name" "$d" 2 3 "$PT" --dp 2 --granularity chained ;;
    static_dp2) run "$name" "$d" 1 2 "$ST" --dp 2 --granularity chained ;;
    pathways_pipe2) run "$name" "$d" 2 3 "$PT" --stages 2 --islands 2x1 --microbatches 8 --schedule 1f1b ;;
    static_pipe2) run "$name" "$d" 1 2 "$ST" --stages 2 --microbatches 8 --schedule 1f1b ;;
  esac
}
NAMES=()
for r in spmd_dp2 pathways_dp2 static_dp2 pathways_pipe2 static_pipe2; do NAMES+=("$r/0" "$r/$DELAY"); done
SECONDS=0
for ROUND in $(seq "$ROUNDS"); do
  for x in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$ROUND" "${NAMES[@]}"); do one "$x"; done
  echo "round $ROUND/$ROUNDS done (${SECONDS} s)"
done
ARGS=()
for x in "${NAMES[@]}"; do ARGS+=("$x=${RUNS[$x]}"); done
python3 "$PWM_ROOT/mpi_scripts/straggler_report.py" "$OUT/straggler_bench.json" "$DELAY" "${ARGS[@]}"
echo "straggler_bench.sh: finished in ${SECONDS} s"
