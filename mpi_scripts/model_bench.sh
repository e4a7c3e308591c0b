#!/usr/bin/env bash
# Model throughput, side by side with the PyTorch peer (../shared/peers/torch_palm_bench.py beside the repository, or
# $PWM_TORCH_PEER), both on ONE thread, same reference config, same machine, one after the other.
# Prints model_bench's figures, the peer's, and the ratio (issue 3 accepts >= 1.2x and MFU >= 50%).
# Both precisions (issue 18; PWM_BENCH_PRECISIONS="fp32 bf16" by default):
#   fp32: model_bench --precision fp32 vs torch_palm_bench.py 1 (fp32, the BLAS rule below)
#   bf16: model_bench --precision bf16 vs torch_ddp_bench.py --ranks 1 --batch 16 --dtype bfloat16
#         (the same model under CPU autocast: bf16 matmuls through PyTorch's oneDNN)
#
# The peer's BLAS: Debian's python3-torch calls sgemm_ from libblas.so.3. With the default
# pthread OpenBLAS, torch.set_num_threads(1) does not reach OpenBLAS, which then runs 2 threads;
# so the peer is run (a) on the pthread OpenBLAS with OPENBLAS_NUM_THREADS=1 and (b) on the OpenMP
# OpenBLAS (libopenblas0-openmp, which honours torch's thread count), and the FASTER of the two is
# the reference. Both sides inherit the same OPENBLAS_* environment.
# Usage: mpi_scripts/model_bench.sh [extra model_bench flags]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# OPENBLAS_CORETYPE pins OpenBLAS to one CPU's kernels (a machine may set it, e.g. Haswell: AVX2
# on an AVX-512 CPU). Our GEMM ignores it and the PyTorch peer's fp32 runs on OpenBLAS, so it would
# only slow the reference: unset unless PWM_BENCH_KEEP_CORETYPE=1.
[ "${PWM_BENCH_KEEP_CORETYPE:-0}" = "1" ] || unset OPENBLAS_CORETYPE
STEPS="${PWM_BENCH_STEPS:-20}"
WARMUP="${PWM_BENCH_WARMUP:-5}"
ROUNDS="${PWM_BENCH_ROUNDS:-3}"
pwm_count model_bench.sh PWM_BENCH_ROUNDS "$ROUNDS"; pwm_count model_bench.sh PWM_BENCH_STEPS "$STEPS"
pwm_count model_bench.sh PWM_BENCH_WARMUP "$WARMUP" 0
pwm_install_deps
pwm_build >/dev/null

PEER="${PWM_TORCH_PEER:-$PWM_ROOT/../shared/peers/torch_palm_bench.py}"
OUT="${PWM_BENCH_OUT:-$BUILD_DIR/model_bench.json}"


if pgrep -x cc1plus >/dev/null; then
  echo "model_bench.sh: warning: a compiler is running; throughput figures will be low" >&2
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset: autodetect>}"

# The machine may be shared: both sides run in $ROUNDS alternating rounds (ours then the peer,
# the peer then ours, ...); the ratio is the median of the per-round ratios with an interval
# (mpi_scripts/measure.py). In a round the fp32 peer is the faster of its two BLAS set-ups.
PRECISIONS="${PWM_BENCH_PRECISIONS:-fp32 bf16}"
DDP_PEER="${PWM_TORCH_DDP_PEER:-$(dirname "$PEER")/torch_ddp_bench.py}"
pwm_install_packages python3-torch libopenblas0-openmp
echo "$("$BUILD_DIR/bench/model/model_bench" --bf16-info)"
run_ours() {  # run_ours PRECISION ROUND [flags]: prints model_bench's output; JSON in $OUT.<precision>.<round>
  local cmd=(env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PWM_MODEL_THREADS=1
             "$BUILD_DIR/bench/model/model_bench" --steps "$STEPS" --warmup "$WARMUP" --precision "$1"
             --json "$OUT.$1.$2" "${@:3}")
  echo "\$ ${cmd[*]}"
  "${cmd[@]}"
}
run_peer() {  # prints the peer's median tokens/s on stdout, its command and output on stderr
  echo "\$ $*" >&2
  local o  # not tee /dev/stderr: reopening a redirected stderr file truncates it
  o=$("$@") || return 1
  echo "$o" >&2
  grep -o 'tokens/s median=[0-9]*' <<<"$o" | cut -d= -f2
}
peer_round() {  # peer_round PRECISION ROUND: the peer's tokens/s this round, appended to PEER_TPS
  local peer=0 t
  if [ "$1" = fp32 ]; then
    echo "== fp32 round $2: torch peer, pthread OpenBLAS, OPENBLAS_NUM_THREADS=1"
    t=$(run_peer env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 "$PEER" 1 "$STEPS" "$WARMUP") &&
      [ "$t" -gt "$peer" ] && peer=$t
    echo "== fp32 round $2: torch peer, OpenMP OpenBLAS (libopenblas0-openmp), OMP_NUM_THREADS=1"
    t=$(run_peer env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OMP_NUM_THREADS=1 \
          /usr/bin/python3 "$PEER" 1 "$STEPS" "$WARMUP") && [ "$t" -gt "$peer" ] && peer=$t
  else
    echo "== bf16 round $2: torch peer, CPU autocast bf16, one rank of one thread"
    t=$(run_peer env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 "$DDP_PEER" --ranks 1 --batch 16 \
          --steps "$STEPS" --warmup "$WARMUP" --dtype bfloat16) && [ "$t" -gt "$peer" ] && peer=$t
  fi
  PEER_TPS[$1]+="${PEER_TPS[$1]:+,}$peer"
}
declare -A PEER_TPS
for prec in $PRECISIONS; do
  for r in $(seq 1 "$ROUNDS"); do
    for side in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$r" ours peer); do
      if [ "$side" = ours ]; then
        echo "== $prec round $r: model_bench (C++, 1 thread)"
        run_ours "$prec" "$r" "$@"
      else
        peer_round "$prec" "$r"
      fi
    done
  done
done

PYTHONPATH="$PWM_ROOT/mpi_scripts" python3 - "$OUT" "$ROUNDS" "$PRECISIONS" "${PEER_TPS[fp32]:-}" "${PEER_TPS[bf16]:-}" <<'EOF2'
import json, statistics, sys
import measure
out, rounds, precisions = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
peers = {"fp32": [float(x) for x in sys.argv[4].split(",") if x], "bf16": [float(x) for x in sys.argv[5].split(",") if x]}
summary = {}
for prec in precisions:
    runs = [json.load(open(f"{out}.{prec}.{r}")) for r in range(1, rounds + 1)]
    ours = [j["tokens_per_s"] for j in runs]
    med = min(runs, key=lambda j: abs(j["tokens_per_s"] - statistics.median(ours)))  # the median round
    peer = peers[prec]
    ok = len(peer) == rounds and all(peer)
    ratio = measure.paired_ratio(peer, ours) if ok else None
    doc = dict(med, tokens_per_s_rounds=ours, peer_tokens_per_s_rounds=peer,
               peer_tokens_per_s=statistics.median(peer) if peer else 0.0,
               ratio_vs_peer=ratio.median if ratio else 0.0, ratio_vs_peer_interval=ratio.as_dict() if ratio else None)
    summary[prec] = doc
    what = "torch_palm_bench.py fp32, best single-thread BLAS" if prec == "fp32" else \
           "torch_ddp_bench.py --ranks 1 --dtype bfloat16 (autocast)"
    print(f"== {prec}: model_bench {statistics.median(ours):.0f} tokens/s ({min(ours):.0f}-{max(ours):.0f}; MFU "
          f"{100 * med['mfu']:.1f}% of a measured {med['peak_gflops']:.1f} GFLOP/s {prec} GEMM peak, median round), torch "
          f"{doc['peer_tokens_per_s']:.0f} tokens/s ({what}); {rounds} alternating rounds")
    if ratio:
        print(f"== {prec}: ratio ours/theirs {ratio.text()}, the median of the rounds' paired ratios "
              f"(bar 1.2x: {'PASS' if ratio.median >= 1.2 else 'FAIL'})")
    else:
        print(f"== {prec}: no ratio: the peer gave no figure in some round")
print(f"== {summary[precisions[0]]['bf16_info']}")
json.dump(summary, open(out, "w"), indent=2)
print(f"== written to {out}")
EOF2
