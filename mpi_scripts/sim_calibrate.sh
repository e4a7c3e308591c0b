#!/usr/bin/env bash
# Measures this machine for the simulator (docs/simulator.md) and writes a profile (JSON):
#   kernels   spmd_train --trace at dp 1 (the forward/backward/optimizer spans per GFLOP) and at
#             dp 2 (the slowdown when two ranks share the cores: "contention")
#   links     collectives_bench ring AllReduce of 2 ranks: in one host (shared memory), across two
#             emulated hosts (mpi_scripts/cluster.sh, TCP) unshaped and with a shaped DCN
#   dispatch  dispatch_bench Fig. 5 with 1 and 2 workers (controller costs per call, node,
#             worker message; the fetch round trip; the SPMD loop's own cost)
#
#   mpi_scripts/sim_calibrate.sh [--out results/sim/profile.json] [--quick] [--no-hosts]
#                                [--dcn-rate 200mbit] [--dcn-delay D (needs sch_netem)]
# Binaries come from $BUILD_DIR (mpi_scripts/env.sh; build spmd_train collectives_bench
# dispatch_bench pwm_sim_cli first). Without root (no emulated hosts) the cross-host links are
# left at the in-host ones and the profile says so. Takes ~3 minutes (--quick: ~1).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
OUT="$PWM_ROOT/results/sim/profile.json"
QUICK=0 HOSTS=1 DCN_RATE=200mbit DCN_DELAY=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-hosts) HOSTS=0; shift ;;
    --dcn-rate) DCN_RATE=$2; shift 2 ;;
    --dcn-delay) DCN_DELAY=$2; shift 2 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "sim_calibrate.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
B=${PWM_SIM_BUILD:-$BUILD_DIR}
for exe in spmd/spmd_train pathways/train/pathways_train bench/collectives/collectives_bench bench/pathways/dispatch_bench sim/pwm_sim; do
  [ -x "$B/$exe" ] || { echo "sim_calibrate.sh: error: $B/$exe is missing: ninja -C $B spmd_train pathways_train collectives_bench dispatch_bench pwm_sim_cli" >&2; exit 1; }
done
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
MPI=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS)
[ "$PWM_MPI" = "openmpi" ] 2>/dev/null && MPI+=(--mca mpi_yield_when_idle 1) || true
STEPS=10; ITERS=30; REPS=3
[ $QUICK = 1 ] && { STEPS=6; ITERS=10; REPS=2; }
# The calibration model (the validation uses other shapes, sim_validate.sh).
CAL=(--d-model 128 --layers 2 --heads 2 --head-dim 64 --d-ff 512 --seq-len 64 --batch 8 --peak-gflops 10 --eval-batches 1)

echo "== kernels: spmd_train dp 1 and dp 2 (${CAL[*]})" >&2
"${MPI[@]}" -n 1 "$B/spmd/spmd_train" "${CAL[@]}" --steps $STEPS --trace "$W/t1.json" --metrics "$W/m1.jsonl" >/dev/null
"$B/sim/pwm_sim" --what kernels "${CAL[@]}" --sim-trace "$W/t1.json" --sim-metrics "$W/m1.jsonl" >"$W/k1.json"
"${MPI[@]}" -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --trace "$W/t2.json" --metrics "$W/m2.jsonl" >/dev/null
"$B/sim/pwm_sim" --what kernels "${CAL[@]}" --dp 2 --sim-trace "$W/t2.json" --sim-metrics "$W/m2.jsonl" >"$W/k2.json"

echo "== kernels: pathways_train dp 2, fused and chained (the trainers' per-step and per-node costs)" >&2
"${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --dp 2 --granularity fused --steps $STEPS --metrics "$W/mf.jsonl" >/dev/null
"${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --dp 2 --granularity chained --steps $STEPS --metrics "$W/mc.jsonl" >/dev/null

COLL=(-b 4 -e 16M -f 4 --algo ring,auto -n $ITERS -w 3)
echo "== links: collectives_bench, 2 ranks in one host" >&2
"${MPI[@]}" -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_intra.json" >/dev/null
CLUSTER_NOTE="none"
if [ $HOSTS = 1 ]; then
  echo "== links: collectives_bench, 2 emulated hosts, unshaped and shaped (${DCN_RATE}${DCN_DELAY:+, $DCN_DELAY})" >&2
  SHAPE=(--dcn-rate "$DCN_RATE")
  [ -n "$DCN_DELAY" ] && SHAPE+=(--dcn-delay "$DCN_DELAY")
  if bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 --timeout 600 -- \
       bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_inter.json" >/dev/null; then
    CLUSTER_NOTE="2 hosts unshaped"
    if bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 "${SHAPE[@]}" --timeout 600 -- \
         bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_shaped.json" >/dev/null; then
      CLUSTER_NOTE="$CLUSTER_NOTE; shaped: ${SHAPE[*]}"
    else
      echo "sim_calibrate.sh: the shaped run failed: inter_shaped = inter" >&2
    fi
  else
    echo "sim_calibrate.sh: emulated hosts unavailable: cross-host links = in-host ones" >&2
  fi
fi

echo "== dispatch: dispatch_bench Fig. 5, 1 and 2 workers" >&2
DB=(--figs 5 --compute-us 0 --reps $REPS)
"${MPI[@]}" -n 2 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --json "$W/d1.json" >/dev/null
"${MPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --json "$W/d2.json" >/dev/null

mkdir -p "$(dirname "$OUT")"
python3 - "$W" "$OUT" "$CLUSTER_NOTE" "$B/sim/pwm_sim" "${CAL[@]}" <<'PY'
import json, os, sys, platform, subprocess, time
w, out, note, pwm_sim = sys.argv[1:5]
cal = sys.argv[5:]
def load(n):
    p = os.path.join(w, n)
    return json.load(open(p)) if os.path.exists(p) else None

def small_allreduce(rows):
    return min(r['time_us'] for r in rows if r['algo'] == 'auto' and r['bytes'] <= 8)

def fit_link(rows):
    # Ring AllReduce of 2 ranks: t(S) = 2 L + S / B_eff (each rank sends S/2 twice; the local
    # reduction is folded into B_eff, the same fraction of the bytes at any rank count for a
    # ring). Least squares over the ring rows; L from the intercept, B from the slope.
    pts = [(r['bytes'], r['time_us']) for r in rows if r['algo'] == 'ring' and r['op'] == 'allreduce']
    n = len(pts); sx = sum(p[0] for p in pts); sy = sum(p[1] for p in pts)
    sxx = sum(p[0] ** 2 for p in pts); sxy = sum(p[0] * p[1] for p in pts)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    icpt = (sy - slope * sx) / n
    # The latency: the least disturbed of the intercept and the 4-byte AllReduce (one exchange
    # for 2 ranks: t = L). The bench averages its iterations, so a preempted one inflates it;
    # interference only slows, so the minimum of these measurements of one thing is the one kept.
    lat = max(icpt / 2, 0.0)
    lat = min(lat, small_allreduce(rows)) if lat > 0 else small_allreduce(rows)
    return {'latency_us': lat, 'gbytes_per_s': 1.0 / max(slope, 1e-9) / 1e3, 'overhead_us': 0.0}

k1, k2 = json.loads(open(os.path.join(w, 'k1.json')).read()), json.loads(open(os.path.join(w, 'k2.json')).read())
contention = (k2['fwd_us_per_gflop'] + k2['bwd_us_per_gflop']) / (k1['fwd_us_per_gflop'] + k1['bwd_us_per_gflop'])
ci = load('c_intra.json')
intra = fit_link(ci['rows'])
cx, cs = load('c_inter.json'), load('c_shaped.json')
inter = fit_link(cx['rows']) if cx else intra
shaped = fit_link(cs['rows']) if cs else inter

def rate(rows, mode, t):
    v = [r for r in rows if r['mode'] == mode and r['compute_us'] == t]
    return v[0]['computations_per_s'] if v else None  # the best repetition: interference only slows
d1, d2 = load('d1.json'), load('d2.json')
chain = 128
def per_comp(d, mode, t):
    return 1e6 / rate(d['rows'], mode, t)
def eff(d, mode, t):  # the compute T the kernels actually spun (the bench measures it)
    v = [r for r in d['rows'] if r['mode'] == mode and r['compute_us'] == t]
    return v[0].get('effective_compute_us', t) or t
# A 4-byte AllReduce of the 2 workers: the in-host latency, also measured by dispatch_bench's SPMD
# chain at T = 0 (per computation: the AllReduce and an add) in the same process layout.
intra['latency_us'] = min(intra['latency_us'], per_comp(d2, 'spmd', 0))
ar = intra['latency_us']
# OpByOp at T = 0 is controller-bound: per computation = call + node + W msg.
po1, po2 = per_comp(d1, 'opbyop', 0), per_comp(d2, 'opbyop', 0)
msg = max(0.0, po2 - po1)
# Chained minus fused at T = 0: (k - 1) more nodes on the controller and launches on the workers.
node_plus_exec = max(0.0, (per_comp(d2, 'chained', 0) - per_comp(d2, 'fused', 0)) * chain / (chain - 1))
node = node_plus_exec  # the split with exec_us is not identifiable here: all on the controller
exec_us = 0.0
# po2 = call + node + 2 msg must hold (it is what was measured): a msg larger than that allows
# (the 1-worker run is faster for reasons other than one message less, e.g. one process less
# on the cores) is cut back.
msg = min(msg, max(0.0, (po2 - node) / 2))
call = max(0.0, po2 - node - 2 * msg)
fused_const = per_comp(d2, 'fused', 0) * chain - chain * ar
fetch = max(0.0, fused_const - (call + node + 2 * msg + exec_us))
spmd_exec = max(0.0, per_comp(d2, 'spmd', 0) - ar)
prof = {
  'machine': f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; hosts: {note}",
  'kernels': {k: k1[k] for k in ('fwd_us_per_gflop', 'bwd_us_per_gflop', 'opt_us_per_param', 'step_overhead_us')} | {'contention': [[2, contention]]},
  'links': {'reduce_ns_per_byte': 0.0, 'intra': intra, 'inter': inter, 'inter_shaped': shaped},
  'dispatch': {'call_us': call, 'node_us': node, 'msg_us': msg, 'exec_us': exec_us, 'spmd_exec_us': spmd_exec,
               'fetch_rtt_us': fetch, 'step_kernel_us': 0.0},
  'measured': {'kernels_dp1': k1, 'kernels_dp2': k2, 'allreduce_4B_intra_us': ar,
               'opbyop_per_comp_us': {'w1': po1, 'w2': po2}},
}
# Ranks sharing the cores: the factor on the kernels that makes the simulated step of the
# calibration model at dp 2 (2 ranks; fused: 3 with the controller) equal the measured one
# (compute scales with it, the rest does not). Then the chained step's excess over the
# prediction, per node, is the trainer's per-node cost on the workers (train_node_us).
def final(m):
    return [json.loads(l) for l in open(os.path.join(w, m)) if l.strip() and json.loads(l).get('final')][-1]
def predict(p, *extra):
    tmp = os.path.join(w, 'p.json'); json.dump(p, open(tmp, 'w'))
    r = subprocess.run([pwm_sim, '--profile', tmp, '--what', 'step', *cal, '--dp', '2', *extra], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
def factor(measured_ms, pred):
    rest = pred['step_ms'] - pred['compute_ms']
    return max(0.5, (measured_ms - rest) / pred['compute_ms'])
prof['kernels']['contention'] = [[2, 1.0]]
f2 = factor(final('m2.jsonl')['step_ms_p50'], predict(prof))
f3 = factor(final('mf.jsonl')['step_ms_p50'], predict(prof, '--granularity', 'fused'))
prof['kernels']['contention'] = [[2, f2], [3, f3]]
pc = predict(prof, '--granularity', 'chained')
prof['dispatch']['train_node_us'] = max(0.0, (final('mc.jsonl')['step_ms_p50'] - pc['step_ms']) * 1e3 / max(pc['nodes'], 1))
prof['measured']['steps_ms'] = {'spmd_dp1': final('m1.jsonl')['step_ms_p50'], 'spmd_dp2': final('m2.jsonl')['step_ms_p50'],
                                'fused_dp2': final('mf.jsonl')['step_ms_p50'], 'chained_dp2': final('mc.jsonl')['step_ms_p50']}
json.dump(prof, open(out, 'w'), indent=1)
print(json.dumps(prof, indent=1))
PY
echo "wrote $OUT" >&2
