#!/usr/bin/env bash
# The MPMD pipeline's benchmark (issue 16): pathways_train --stages S over S islands of one
# device and the static model's mpmd_train --stages S (the same program, no controller: S ranks,
# rows static_S<S>_...), GPipe against 1F1B, for S in {2, 4} and M in {4, 8, 16} micro-batches, on the reference
# model (d_model 256, 4 layers, seq 128) with the same global batch everywhere (32 sequences).
# Per run: tokens/s, the measured bubble (1 - mean device busy time / step time, median over the
# steps) against the bound (S-1)/(M+S-1), and per stage the peak bytes of intermediates
# (activations and gradients in flight) and the object store's high-water mark; per (S, M) the
# ratio 1F1B / GPipe of stage 0's peak intermediates. A spmd_train --dp S row per S is the
# reference measured in the same run (the same global batch on the same number of devices); a
# static row's "vs pw" is its tokens/s over pathways_train's row of the same S, M and schedule,
# paired by round, and "msgs" its point-to-point messages per step and rank (the most of any rank).
#
# Usage: mpi_scripts/pipeline_bench.sh [--steps N] [--rounds R] [--stages "2 4"] [--micro "4 8 16"]
#                                     [--schedules "gpipe 1f1b"] [--stage-dp D] [--models "pathways static"]
#                                     [--hosts K [--dcn-rate R]] [--out DIR] [-- TRAINER FLAGS...]
#   --rounds R      every configuration R times (default 3), in interleaved rounds; each ratio to
#                   spmd_train is the median of its per-round ratios with an interval
#   --models M      which MPMD models run the pipelines (default both: "pathways static")
#   --stage-dp D    every stage a slice of D data-parallel devices (S D + 1 ranks, --islands SxD;
#                   the stage's dp AllReduce overlapping its backward), against spmd_train --dp S D
#   --hosts K       also run every configuration over an emulated cluster of K hosts
#                   (mpi_scripts/cluster.sh; ranks round-robin over the hosts, each host an
#                   island, so consecutive stages sit on different hosts) and report its
#                   tokens/s against the same configuration on this one host
#   --dcn-rate R    with --hosts: shape every host's link (tc tbf), e.g. 1gbit
# Results: DIR/pipeline_bench.json (default results/), the metrics of every run.
# S = 4 needs 5 ranks: on a machine with fewer cores than 5 the stages share cores and the
# measured bubble includes that sharing (the script prints the core count).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
STEPS=12; ROUNDS=3; STAGES="2 4"; MICRO="4 8 16"; SCHEDS="gpipe 1f1b"; HOSTS=0; DCN_RATE=""; OUT="$PWM_ROOT/results"; EXTRA=(); SDP=1
MODELS="pathways static"
ME=pipeline_bench.sh  # (flags read by env.sh's pwm_value, pwm_count, pwm_words)
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --rounds) ROUNDS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --stages) STAGES=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --micro) MICRO=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --schedules) SCHEDS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --hosts) HOSTS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --stage-dp) SDP=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --models) MODELS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --dcn-rate) DCN_RATE=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "pipeline_bench.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
pwm_count "$ME" --rounds "$ROUNDS"; pwm_count "$ME" --steps "$STEPS" 4
pwm_words "$ME" --models "$MODELS" pathways static
pwm_words "$ME" --schedules "$SCHEDS" gpipe 1f1b
[ -n "${STAGES//[ ,]/}" ] || { echo "$ME: error: --stages is empty: give stage counts such as \"2 4\"" >&2; exit 2; }
for s in ${STAGES//,/ }; do pwm_count "$ME" --stages "$s" 2 64; done
pwm_count "$ME" --stage-dp "$SDP" 1 64
pwm_words "$ME" --micro "$MICRO" 1 2 4 8 16 32  # (the divisors of the batch, 32)
STAGES=${STAGES//,/ }; MICRO=${MICRO//,/ }; MODELS=${MODELS//,/ }; SCHEDS=${SCHEDS//,/ }
if [ "$HOSTS" != 0 ]; then
  pwm_count "$ME" --hosts "$HOSTS" 2 16
elif [ -n "$DCN_RATE" ]; then
  echo "pipeline_bench.sh: error: --dcn-rate needs --hosts K" >&2; exit 2
fi
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "pipeline_bench: $(getconf _NPROCESSORS_ONLN) cores; load: $(uptime | sed 's/.*load average: //'); commit $(git -C "$PWM_ROOT" rev-parse --short HEAD 2>/dev/null); $(date -u '+%Y-%m-%d %H:%M UTC')"
# Every run measures its own MFU peak at the model's shapes (docs/train.md, "MFU").
WORKLOAD=(--steps "$STEPS" --batch 32 --log-every 100 "${EXTRA[@]}")
PT="$BUILD_DIR/mpmd/pathways_train"
SPMD="$BUILD_DIR/spmd/spmd_train"
STATIC="$BUILD_DIR/mpmd/mpmd_train"
LOCAL=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD)
declare -A RUNS  # WHERE/NAME -> its rounds' metrics, comma-separated
run() {  # run WHERE NAME LAUNCHER... :: N BIN FLAGS...  (the launcher may contain "--")
  local where=$1 name=$2; shift 2
  local launch=(); while [ "$1" != "::" ]; do launch+=("$1"); shift; done; shift
  local n=$1 bin=$2; shift 2
  local base="$OUT/pipe_${where}_$name.r$ROUND"
  local cmd=("${launch[@]}" -n "$n" "$bin" "${WORKLOAD[@]}" "$@" --metrics "$base.jsonl")
  [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}"
  if ! "${cmd[@]}" > "$base.log" 2>&1; then
    echo "pipeline_bench.sh: error: run $where/$name failed (log: $base.log)" >&2; exit 1
  fi
  echo "r$ROUND $(grep "done:" "$base.log")"
  RUNS[$where/$name]+="${RUNS[$where/$name]:+,}$base.jsonl"
}
# Every configuration once per round, the round's order from mpi_scripts/measure.py (every other
# round reversed); each pipeline run's ratio to the spmd run of its devices is paired by round.
sweep() {  # sweep WHERE ISLANDS_FLAG_MODE LAUNCHER...
  local where=$1 mode=$2; shift 2
  local names=()
  for S in $STAGES; do
    names+=("spmd_dp$((S * SDP))")
    for M in $MICRO; do for K in $SCHEDS; do for P in $MODELS; do
      if [ "$P" = static ]; then names+=("static_S${S}_M${M}_$K"); else names+=("S${S}_M${M}_$K"); fi
    done; done; done
  done
  for ROUND in $(seq "$ROUNDS"); do
    for name in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$ROUND" "${names[@]}"); do
      if [[ $name == spmd_dp* ]]; then
        run "$where" "$name" "$@" :: "${name#spmd_dp}" "$SPMD" --dp "${name#spmd_dp}"
        continue
      fi
      local cfg=${name#static_}
      local S=${cfg%%_*}; S=${S#S}
      local M=${cfg#*_M}; M=${M%%_*}
      local K=${cfg##*_}
      local sdp=(); [ "$SDP" != 1 ] && sdp=(--dp "$SDP")
      if [[ $name == static_* ]]; then  # no controller, no islands: S x D ranks, stage s on ranks [s D, (s+1) D)
        run "$where" "$name" "$@" :: $((S * SDP)) "$STATIC" --stages "$S" "${sdp[@]}" --microbatches "$M" --schedule "$K"
        continue
      fi
      local isl=(); [ "$mode" = local ] && isl=(--islands "${S}x$SDP")
      run "$where" "$name" "$@" :: $((S * SDP + 1)) "$PT" --stages "$S" "${sdp[@]}" "${isl[@]}" --microbatches "$M" --schedule "$K"
    done
  done
  for name in "${names[@]}"; do ORDERED+=("$where/$name=${RUNS[$where/$name]}"); done
}
ORDERED=()
SECONDS=0
sweep local local "${LOCAL[@]}"
if [ "$HOSTS" != 0 ]; then
  CLUSTER=$(bash "$PWM_ROOT/mpi_scripts/cluster.sh" up --hosts "$HOSTS" --slots 1 ${DCN_RATE:+--dcn-rate "$DCN_RATE"}) || exit 1
  trap 'bash "$PWM_ROOT/mpi_scripts/cluster.sh" down --name "$CLUSTER" >/dev/null' EXIT
  echo "cluster: $HOSTS emulated hosts ($CLUSTER), ranks round-robin, one island per host, DCN ${DCN_RATE:-unshaped}"
  sweep "hosts$HOSTS" cluster bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --name "$CLUSTER" --timeout 3600 -- \
    bash -c '$PWM_CLUSTER_MPIRUN "$@"' _
fi
python3 "$PWM_ROOT/mpi_scripts/pipeline_report.py" "$OUT/pipeline_bench.json" "$HOSTS" "${DCN_RATE:-unshaped}" "${ORDERED[@]}"
echo "pipeline_bench.sh: finished in ${SECONDS} s"
