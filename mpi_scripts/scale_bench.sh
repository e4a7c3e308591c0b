#!/usr/bin/env bash
# The execution models across model sizes (issue 57): for each preset (docs/model.md, "Presets"),
# in interleaved rounds on NP = 2 compute ranks,
#   spmd       spmd_train --dp 2                          (the reference of every ratio)
#   fused      pathways_train --granularity fused --dp 2  (3 processes: controller + 2 workers)
#   chained    pathways_train --granularity chained --dp 2
#   static     mpmd_train --granularity chained --dp 2    (no controller)
#   pipeline   pathways_train --stages 2 --islands 2x1, GPipe (3 processes)
#   spmd_bf16  spmd_train --dp 2 --precision bf16          (oneDNN; against DDP's bf16)
#   ddp_fp32   PyTorch DDP over gloo, one thread a rank (../shared/peers/torch_ddp_bench.py)
#   ddp_bf16   the same under CPU autocast to bfloat16
# then per size the trainers' side-by-side table (mpi_scripts/compare_report.py: tokens/s, the
# paired ratio to spmd with its interval, MFU against each run's GEMM peak, where the step's time
# goes, peak RSS and state bytes per rank) and, over the sizes (mpi_scripts/scale_report.py),
# spmd against DDP in both precisions, MFU against the core's fp32 FMA peak too, and plots of
# tokens/s and memory against the parameter count. Writes OUT/<size>/ (metrics, traces, logs,
# compare.json) and OUT/scale.json, OUT/scale.md, OUT/scale_throughput.png, OUT/scale_memory.png.
#
# Usage: mpi_scripts/scale_bench.sh [--sizes 4m,30m,100m] [--rounds R] [--out DIR] [--no-ddp]
#   --sizes LIST   presets to measure, smallest first (default 4m,30m,100m: ~20 minutes on 2 cores)
#   --rounds R     rounds per size (default 3); every ratio is the median of the rounds' paired
#                  ratios with its interval (mpi_scripts/measure.py); odd rounds in one order,
#                  even rounds reversed
#   --out DIR      results directory (default results/scale)
#   --no-ddp       leave the PyTorch DDP peer out (it needs Debian's python3-torch, installed
#                  here when missing)
# Each size's workload is fixed here so a run takes tens of seconds at 100m (below, WORKLOAD_*):
# the global batch, the steps (the first 2 of every run are warm-up, reported apart) and the
# pipeline's micro-batches (512 tokens each at every size).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ME=scale_bench.sh
SIZES=4m,30m,100m; ROUNDS=3; OUT="$PWM_ROOT/results/scale"; DDP=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --rounds) ROUNDS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --rounds "$ROUNDS"; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --no-ddp) DDP=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "$ME: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# Per size: global batch (sequences), steps, pipeline micro-batches. The batch keeps a 100m run
# to ~6 s a step here (2 sequences of 512 tokens per rank); 2 warm-up steps + the measured ones.
declare -A WORKLOAD=([4m]="32 8 8" [30m]="8 5 4" [100m]="4 4 4")
IFS=, read -r -a SIZE_LIST <<<"$SIZES"
[ ${#SIZE_LIST[@]} -ge 1 ] || { echo "$ME: error: --sizes is empty: name presets such as 4m,30m" >&2; exit 2; }
for s in "${SIZE_LIST[@]}"; do
  [ -n "${WORKLOAD[$s]:-}" ] ||
    { echo "$ME: error: --sizes names '$s', not a preset with a workload here: use some of ${!WORKLOAD[*]}" >&2; exit 2; }
done
pwm_install_deps
pwm_install_packages time
PEER="${PWM_TORCH_DDP_PEER:-$PWM_ROOT/../shared/peers/torch_ddp_bench.py}"
if [ "$DDP" = 1 ]; then
  [ -f "$PEER" ] || { echo "$ME: error: the DDP peer $PEER is missing: set PWM_TORCH_DDP_PEER or pass --no-ddp" >&2; exit 1; }
  pwm_install_packages python3-torch
fi
pwm_build >/dev/null
pwm_warn_if_busy
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
NP=2
MPIRUN=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS)
PT=mpmd/pathways_train
CPU="$(lscpu | sed -n 's/^Model name: *//p') ($(nproc --all) cores; $(grep -o -m1 -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tail -1 || echo scalar))"
echo "CPU: $CPU | MPI: $PWM_MPI | sizes ${SIZE_LIST[*]} | $ROUNDS rounds"
SECONDS=0

# trainer NAME NRANKS BINARY FLAGS...: one run of round $ROUND into $DIR; the metrics and trace
# paths collect in METRICS[NAME] and TRACES[NAME] (comma-separated, in round order).
trainer() {
  local name=$1 n=$2 bin=$3; shift 3
  local tag="$name.r$ROUND"
  # One validation batch at the end (4 cost ~8 s a run at 100m): the sweep measures speed; the
  # presets' curves are loss_curve.py's (docs/results/presets.md).
  local cmd=("${MPIRUN[@]}" -n "$n" "$BUILD_DIR/$bin" --preset "$SIZE" --batch "$BATCH" --steps "$STEPS"
             --log-every 10 --eval-batches 1 "$@" --metrics "$DIR/$tag.jsonl" --trace "$DIR/$tag.trace.json")
  [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}"
  "${cmd[@]}" > "$DIR/$tag.log" 2>&1 ||
    { tail -5 "$DIR/$tag.log" >&2; echo "$ME: error: run '$name' ($SIZE, round $ROUND) failed (log: $DIR/$tag.log)" >&2; exit 1; }
  METRICS[$name]+="${METRICS[$name]:+,}$DIR/$tag.jsonl"
  TRACES[$name]+="${TRACES[$name]:+,}$DIR/$tag.trace.json"
}
# ddp DTYPE: one run of the PyTorch peer at this size; its output and peak RSS (the largest
# process, GNU time's %M of the spawned ranks) in $DIR/ddp_DTYPE.rROUND.txt. The peer runs on
# OpenBLAS with the machine's core-type pins unset, one thread a rank (this command alone).
ddp() {
  local dtype=$1 tag="ddp_$1.r$ROUND"
  local cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
             /usr/bin/time -f "peak_rss_kb=%M" /usr/bin/python3 "$PEER" --ranks "$NP" --batch "$BATCH"
             --steps $((STEPS - 2)) --warmup 2 --dtype "$dtype" --port $((29600 + RANDOM % 200)) $MODEL_FLAGS)
  [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}"
  "${cmd[@]}" > "$DIR/$tag.txt" 2>&1 ||
    { tail -5 "$DIR/$tag.txt" >&2; echo "$ME: error: the DDP peer ($dtype, $SIZE, round $ROUND) failed (log: $DIR/$tag.txt)" >&2; exit 1; }
}
one() {
  case $1 in
    spmd) trainer spmd "$NP" spmd/spmd_train --dp "$NP" ;;
    fused) trainer fused $((NP + 1)) $PT --dp "$NP" --granularity fused ;;
    chained) trainer chained $((NP + 1)) $PT --dp "$NP" --granularity chained ;;
    static) trainer static "$NP" mpmd/mpmd_train --dp "$NP" --granularity chained ;;
    pipeline) trainer pipeline $((NP + 1)) $PT --stages "$NP" --islands "${NP}x1" --microbatches "$MICRO" --schedule gpipe ;;
    spmd_bf16) trainer spmd_bf16 "$NP" spmd/spmd_train --dp "$NP" --precision bf16 ;;
    ddp_fp32) ddp float32 ;;
    ddp_bf16) ddp bfloat16 ;;
  esac
}
NAMES=(spmd fused chained static pipeline spmd_bf16)
[ "$DDP" = 1 ] && NAMES+=(ddp_fp32 ddp_bf16)
for SIZE in "${SIZE_LIST[@]}"; do
  read -r BATCH STEPS MICRO <<<"${WORKLOAD[$SIZE]}"
  DIR="$OUT/$SIZE"; rm -rf "$DIR"; mkdir -p "$DIR"
  # The model's shape as the peer's flags (the preset's, from the trainer's own description).
  MODEL_FLAGS=$("$BUILD_DIR/spmd/spmd_train" --help | python3 -c '
import re, sys
m = re.search(r"\b" + sys.argv[1] + r" \([^;]*?d_model (\d+), (\d+) layers, (\d+) heads of (\d+), d_ff (\d+), seq_len (\d+)", sys.stdin.read())
if not m: sys.exit("scale_bench.sh: error: spmd_train --help does not describe preset " + sys.argv[1])
print("--d-model %s --layers %s --heads %s --head-dim %s --d-ff %s --seq-len %s" % m.groups())' "$SIZE")
  declare -A METRICS=() TRACES=()
  echo "== $SIZE: batch $BATCH, $STEPS steps, pipeline $MICRO micro-batches; ${NAMES[*]}"
  for ROUND in $(seq "$ROUNDS"); do
    for r in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$ROUND" "${NAMES[@]}"); do one "$r"; done
    echo "$SIZE round $ROUND/$ROUNDS done (${SECONDS} s)"
  done
  python3 - "$DIR/workload.json" "$NP" "$STEPS" "$BATCH" "$SIZE" "$MICRO" "$CPU" <<'PY'
import json, sys
a = sys.argv
json.dump({"compute_ranks": int(a[2]), "steps": int(a[3]), "batch_per_rank": int(a[4]) // int(a[2]),
           "batch": int(a[4]), "preset": a[5], "pipeline_microbatches": int(a[6]), "cpu": a[7],
           "cluster": "one host", "model": f"preset {a[5]} (docs/model.md, \"Presets\")",
           "data": "/usr/share/common-licenses", "extra_flags": [], "precision": "fp32 (spmd_bf16: bf16)"},
          open(a[1], "w"))
PY
  RUNS=()
  for r in spmd fused chained static pipeline spmd_bf16; do RUNS+=("$r=${METRICS[$r]}:${TRACES[$r]}"); done
  python3 "$PWM_ROOT/mpi_scripts/compare_report.py" "$DIR" "$DIR/workload.json" "${RUNS[@]}" | tee "$DIR/report.txt"
  echo
done
python3 "$PWM_ROOT/mpi_scripts/scale_report.py" "$OUT" "${SIZE_LIST[@]}"
echo "scale_bench.sh: finished in ${SECONDS} s"
