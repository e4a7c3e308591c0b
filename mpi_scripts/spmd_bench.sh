#!/usr/bin/env bash
# spmd_train throughput on the reference config (issue 4's benchmark), all in one run:
# dp=1 (batch 16), dp=2 (batch 32: weak scaling, 16 sequences per rank; default 25 MiB bucket),
# dp=2 with 4 MiB buckets and overlap on and off,
# and the PyTorch peer at two threads for reference; then (issue 18) dp=2 in both precisions
# against PyTorch DDP (torch_ddp_bench.py, gloo, one thread per rank, batch 32) in float32 and
# bfloat16 autocast. Writes results/spmd_bench.json.
# Usage: mpi_scripts/spmd_bench.sh [STEPS]   (PWM_BENCH_PRECISIONS="fp32 bf16" by default)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# OPENBLAS_CORETYPE pins OpenBLAS to one CPU's kernels (a machine may set it, e.g. Haswell: AVX2
# on an AVX-512 CPU). Our GEMM ignores it and the PyTorch peer's fp32 runs on OpenBLAS, so it would
# only slow the reference: unset unless PWM_BENCH_KEEP_CORETYPE=1.
[ "${PWM_BENCH_KEEP_CORETYPE:-0}" = "1" ] || unset OPENBLAS_CORETYPE
STEPS="${1:-20}"
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
OUT="$PWM_ROOT/results"; mkdir -p "$OUT"
TRAIN="$BUILD_DIR/spmd/spmd_train"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
run() {  # run NAME NP args...
  local name=$1 np=$2; shift 2
  echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n $np $TRAIN $* --metrics $OUT/spmd_$name.jsonl"
  "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n "$np" "$TRAIN" --steps "$STEPS" --log-every 10 "$@" --metrics "$OUT/spmd_$name.jsonl" | tail -n 2
}
# The trainers measure their GEMM peak once at start-up (5 products); on this shared VM a slow
# moment there can put MFU over 100%. So the machine's rate is probed before and after the fp32
# runs too (one process alone, and per process with one on every core), and the table's MFU uses
# the highest peak seen for the run's rank count: MFU stays conservative.
PROBE0=$(pwm_speed_probe)
run dp1 1 --dp 1 --batch 16
run dp2 2 --dp 2 --batch 32
# Overlap on and off with 4 MiB buckets (the reference model's 15.5 MB of gradients in 4 buckets).
run dp2_b4m_overlap 2 --dp 2 --batch 32 --bucket-bytes 4194304
run dp2_b4m_nooverlap 2 --dp 2 --batch 32 --bucket-bytes 4194304 --no-overlap
PROBE1=$(pwm_speed_probe)
echo "GEMM peak probes (fp32 GFLOP/s: one process alone, per process on every core): before $PROBE0, after $PROBE1"
echo "== PyTorch peer, 2 threads"
peer=$(pwm_torch_peer 2 "$STEPS" 5)
# dp = 2 against DDP, per precision (the DDP peer beside torch_palm_bench.py).
DDP_PEER="${PWM_TORCH_DDP_PEER:-${PWM_TORCH_PEER:-$PWM_ROOT/../shared/peers/torch_palm_bench.py}}"
[ -n "${PWM_TORCH_DDP_PEER:-}" ] || DDP_PEER="$(dirname "$DDP_PEER")/torch_ddp_bench.py"
echo "$("$BUILD_DIR/bench/model/model_bench" --bf16-info)"
DDP_TPS=()
for prec in ${PWM_BENCH_PRECISIONS:-fp32 bf16}; do
  run "dp2_$prec" 2 --dp 2 --batch 32 --precision "$prec"
  dtype=float32; [ "$prec" = bf16 ] && dtype=bfloat16
  cmd=(env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 "$DDP_PEER" --ranks 2 --batch 32
       --steps "$STEPS" --warmup 5 --dtype "$dtype")
  echo "\$ ${cmd[*]}"
  o=$("${cmd[@]}") || o=""
  echo "$o"
  t=$(grep -o 'tokens/s median=[0-9]*' <<<"$o" | cut -d= -f2)
  DDP_TPS+=("$prec=$t")
done
python3 - "$OUT" "$peer" "$PROBE0" "$PROBE1" "${DDP_TPS[@]}" <<'PY'
import json, sys
out, peer = sys.argv[1], float(sys.argv[2])
probes = [[float(x) for x in p.split()] for p in sys.argv[3:5]]  # [alone, per process on every core]
ddp = {a.split("=")[0]: float(a.split("=")[1] or 0) for a in sys.argv[5:]}
def lines(name):
    return [json.loads(line) for line in open(f"{out}/spmd_{name}.jsonl")]
def final(name):
    return next(j for j in lines(name) if j.get("final"))
def mfu(name):  # against the highest peak seen: the run's own start-up one, or a probe for its rank count
    head, j = lines(name)[0], final(name)
    ranks = head["ranks"]
    peak = max([head["peak_gflops_per_rank"]] + [p[0 if ranks == 1 else 1] for p in probes])
    return j["tokens_per_s"] * head["flops_per_token"] / (ranks * peak * 1e9), peak
r = {n: final(n) for n in ("dp1", "dp2", "dp2_b4m_overlap", "dp2_b4m_nooverlap")}
print(f"\n{'run':<16}{'tokens/s':>10}{'MFU':>8}{'step p50 ms':>13}{'comm share':>12}{'peak used':>11}")
for n, j in r.items():
    m, pk = mfu(n)
    j["mfu_conservative"], j["mfu_peak_gflops"] = m, pk
    print(f"{n:<18}{j['tokens_per_s']:>10.0f}{100*m:>7.1f}%{j['step_ms_p50']:>13.1f}{100*j['comm_share']:>11.1f}%{pk:>11.1f}")
print(f"{'torch peer (2T)':<18}{peer:>10.0f}")
print("MFU: against the highest GEMM peak per rank seen for the run's rank count (its start-up measurement, probes before and after)")
eff = r["dp2"]["tokens_per_s"] / (2 * r["dp1"]["tokens_per_s"])
ratio = r["dp2"]["tokens_per_s"] / peer
print(f"\nweak-scaling efficiency dp=2 vs dp=1: {100*eff:.1f}% (bar 90%)")
print(f"dp=2 vs PyTorch peer at 2 threads: {ratio:.2f}x (bar 1.2x)")
print(f"overlap on vs off (dp=2, 4 MiB buckets): {r['dp2_b4m_overlap']['tokens_per_s']/r['dp2_b4m_nooverlap']['tokens_per_s']:.3f}x")
vs_ddp = {}
for prec, t in ddp.items():
    ours = final(f"dp2_{prec}")["tokens_per_s"]
    r[f"dp2_{prec}"] = final(f"dp2_{prec}")
    vs_ddp[prec] = {"ours_tokens_per_s": ours, "ddp_tokens_per_s": t, "ratio": ours / t if t else 0.0}
    print(f"dp=2 {prec}: spmd_train {ours:.0f} tokens/s vs PyTorch DDP {'bfloat16 autocast' if prec == 'bf16' else 'float32'} "
          f"{t:.0f}: {vs_ddp[prec]['ratio']:.2f}x (bar 1.2x)")
json.dump({"runs": r, "torch_peer_2threads_tokens_per_s": peer, "weak_scaling_efficiency": eff,
           "dp2_vs_peer": ratio, "dp2_vs_ddp": vs_ddp}, open(f"{out}/spmd_bench.json", "w"), indent=1)
PY
