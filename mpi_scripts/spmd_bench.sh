#!/usr/bin/env bash
# spmd_train throughput on the reference config (issue 4's benchmark), all in one run:
# dp=1 (batch 16), dp=2 (batch 32: weak scaling, 16 sequences per rank; buckets sized from the model),
# dp=2 with 4 MiB buckets and overlap on and off,
# and the PyTorch peer at two threads for reference; then (issue 18) dp=2 in both precisions
# against PyTorch DDP (torch_ddp_bench.py, gloo, one thread per rank, batch 32) in float32 and
# bfloat16 autocast. All of it in PWM_BENCH_ROUNDS (default 3) interleaved rounds; every ratio is
# the median of its per-round paired ratios with an interval (mpi_scripts/measure.py). Writes
# results/spmd_bench.json. About 4 minutes a round on 2 cores.
# Usage: mpi_scripts/spmd_bench.sh [STEPS]   (PWM_BENCH_PRECISIONS="fp32 bf16" by default)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# OPENBLAS_CORETYPE pins OpenBLAS to one CPU's kernels (a machine may set it, e.g. Haswell: AVX2
# on an AVX-512 CPU). Our GEMM ignores it and the PyTorch peer's fp32 runs on OpenBLAS, so it would
# only slow the reference: unset unless PWM_BENCH_KEEP_CORETYPE=1.
[ "${PWM_BENCH_KEEP_CORETYPE:-0}" = "1" ] || unset OPENBLAS_CORETYPE
STEPS="${1:-20}"
ROUNDS="${PWM_BENCH_ROUNDS:-3}"
pwm_count spmd_bench.sh STEPS "$STEPS" 6; pwm_count spmd_bench.sh PWM_BENCH_ROUNDS "$ROUNDS"
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
OUT="$PWM_ROOT/results"; mkdir -p "$OUT"
TRAIN="$BUILD_DIR/spmd/spmd_train"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
run() {  # run NAME NP args...: round $ROUND's metrics in spmd_NAME.r$ROUND.jsonl
  local name=$1 np=$2; shift 2
  local m="$OUT/spmd_$name.r$ROUND.jsonl"
  [ "$ROUND" = 1 ] && echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $np $TRAIN --steps $STEPS --log-every 10 $* --metrics $m"
  "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$np" "$TRAIN" --steps "$STEPS" --log-every 10 "$@" --metrics "$m" | tail -n 1
}
DDP_PEER="${PWM_TORCH_DDP_PEER:-${PWM_TORCH_PEER:-$PWM_ROOT/../shared/peers/torch_palm_bench.py}}"
[ -n "${PWM_TORCH_DDP_PEER:-}" ] || DDP_PEER="$(dirname "$DDP_PEER")/torch_ddp_bench.py"
ddp() {  # ddp PRECISION: DDP's median tokens/s (its output on stderr)
  local dtype=float32; [ "$1" = bf16 ] && dtype=bfloat16
  local cmd=(env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 "$DDP_PEER" --ranks 2 --batch 32
             --steps "$STEPS" --warmup 5 --dtype "$dtype")
  [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}" >&2
  local o; o=$("${cmd[@]}") || o=""
  grep -o 'tokens/s median=[0-9]*' <<<"$o" | cut -d= -f2
}
# One candidate of a round (dp1 ... nooverlap, the peer, and per precision dp=2 and DDP).
one() {
  case $1 in
    dp1) run dp1 1 --dp 1 --batch 16 ;;
    dp2) run dp2 2 --dp 2 --batch 32 ;;
    # Overlap on and off with 4 MiB buckets (the reference model's 15.5 MB of gradients in 4 buckets).
    overlap) run dp2_b4m_overlap 2 --dp 2 --batch 32 --bucket-bytes 4194304 ;;
    nooverlap) run dp2_b4m_nooverlap 2 --dp 2 --batch 32 --bucket-bytes 4194304 --no-overlap ;;
    peer) t=$(pwm_torch_peer 2 "$STEPS" 5); echo "torch peer (2 threads): $t tokens/s"; PEER+="${PEER:+,}$t" ;;
    ours_*) run "dp2_${1#ours_}" 2 --dp 2 --batch 32 --precision "${1#ours_}" ;;
    ddp_*) t=$(ddp "${1#ddp_}"); echo "PyTorch DDP ${1#ddp_}: ${t:-none} tokens/s"; DDP["${1#ddp_}"]+="${DDP[${1#ddp_}]:+,}$t" ;;
  esac
}
# The trainers probe their GEMM peak at the model's shapes through the run (docs/train.md, "MFU");
# the machine's 1024^3 rate is probed before and after the runs too (one process alone, and per
# process with one on every core), and the table's MFU uses the highest peak seen for the run's
# rank count: MFU stays conservative.
echo "$("$BUILD_DIR/bench/model/model_bench" --bf16-info)"
PROBE0=$(pwm_speed_probe)
PEER=""; declare -A DDP
CANDIDATES=(dp1 dp2 overlap nooverlap peer)
for prec in ${PWM_BENCH_PRECISIONS:-fp32 bf16}; do CANDIDATES+=("ours_$prec" "ddp_$prec"); DDP[$prec]=""; done
# ROUNDS interleaved rounds (every other one reversed, mpi_scripts/measure.py): each ratio is
# the median of its per-round paired ratios, with an interval.
for ROUND in $(seq "$ROUNDS"); do
  echo "== round $ROUND/$ROUNDS"
  for c in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$ROUND" "${CANDIDATES[@]}"); do one "$c"; done
done
PROBE1=$(pwm_speed_probe)
echo "GEMM peak probes (fp32 GFLOP/s: one process alone, per process on every core): before $PROBE0, after $PROBE1"
DDP_TPS=()
for prec in ${PWM_BENCH_PRECISIONS:-fp32 bf16}; do DDP_TPS+=("$prec=${DDP[$prec]}"); done
python3 "$PWM_ROOT/mpi_scripts/spmd_report.py" "$OUT" "$ROUNDS" "$PEER" "$PROBE0" "$PROBE1" "${DDP_TPS[@]}"
