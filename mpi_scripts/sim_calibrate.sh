#!/usr/bin/env bash
# Measures this machine for the simulator (docs/simulator.md) and writes a profile (JSON):
#   kernels   spmd_train --trace at dp 1 (the forward/backward/optimizer spans per GFLOP) and at
#             dp 2 (the slowdown when two ranks share the cores: "contention")
#   links     collectives_bench AllReduce of 2 ranks (ring and hd, the faster per size): in one
#             host (shared memory), across two emulated hosts (mpi_scripts/cluster.sh, TCP)
#             unshaped and with a shaped DCN; the emulated network's CPU per byte from
#             spmd_train dp 2 across the hosts vs in one
#   dispatch  dispatch_bench Fig. 5 with 1 and 2 workers (controller costs per call, node,
#             worker message; the fetch round trip; the SPMD loop's own cost)
#
#   mpi_scripts/sim_calibrate.sh [--out results/sim/profile.json] [--quick] [--no-hosts]
#                                [--dcn-rate 200mbit] [--dcn-delay D (needs sch_netem)]
# Binaries come from $BUILD_DIR (mpi_scripts/env.sh; build spmd_train collectives_bench
# dispatch_bench pwm_sim_cli first). Without root (no emulated hosts) the cross-host links are
# left at the in-host ones and the profile says so. Takes ~4 minutes (--quick: ~1); PWM_SIM_LAUNCHES
# (default 5) launches of each configuration, PWM_SIM_DLAUNCHES (default 11) of dispatch_bench.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
OUT="$PWM_ROOT/results/sim/profile.json"
pwm_sim_args 2,17 0 "$@"
pwm_sim_binaries spmd/spmd_train pathways/train/pathways_train bench/collectives/collectives_bench bench/pathways/dispatch_bench bench/model/model_bench sim/pwm_sim
# PWM_SIM_KEEP=DIR keeps the raw measurements (traces, metrics, bench JSON) there (pwm_sim_workdir).
pwm_sim_workdir
MPI=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD)
# 30 steps: a Pathways launch takes 4-6 steps to settle (one chained launch: 84, 22, 21, 16, 18,
# 28 and then 8 ms steps; fresh buffers and the completion predictor's first runs are likely, not
# measured), and the median of 10 steps fell between the two regimes, 8.7 or 19.2 ms by launch.
STEPS=${PWM_SIM_STEPS:-30}; ITERS=30; DREPS=60; LAUNCHES=${PWM_SIM_LAUNCHES:-5}; DLAUNCHES=${PWM_SIM_DLAUNCHES:-11}
[ $QUICK = 1 ] && { STEPS=6; ITERS=10; DREPS=10; LAUNCHES=1; DLAUNCHES=1; }
# dispatch_bench at T = 0: DLAUNCHES launches of the best of DREPS repetitions (~2 s each), the
# lower quartile of the launches (the 3rd fastest of 11). What varies is the launch, not the
# repetition: a launch's best of 300 spread as much between launches as its best of 30 (spmd
# 0.65-1.48 us over 24 launches of chain 64), so the launches are many and short; and the slow
# launches come in phases, so their median moved by 48% between blocks of 11 launches run back to
# back where the lower quartile moved by 15% (docs/simulator.md, "The T = 0 rows").
# dispatch_bench calibrates on chains of DCHAIN and DCHAIN2 computations (2 workers; 1 worker at
# DCHAIN only), the validation runs its default 128: between the two, not at either. One chain
# length put the validation's T = 0 rows 10-16% off in one direction for a whole phase (the
# per-computation times do not follow the model's a + b / k from one k: OpByOp's grows from 64
# to 256; docs/simulator.md, "The T = 0 rows").
DCHAIN=64 DCHAIN2=256
# The calibration model (the validation uses other shapes, sim_validate.sh).
CAL=(--d-model 128 --layers 2 --heads 2 --head-dim 64 --d-ff 512 --seq-len 64 --batch 8 --peak-gflops 10 --eval-batches 1)
# The speed probe (pwm_step_probe, env.sh): model_bench's step of the calibration model. The
# profile records these flags, and sim_validate.sh probes with them.
PROBE=(--d-model 128 --layers 2 --heads 2 --head-dim 64 --d-ff 512 --seq 64 --batch 8)

# Every trainer configuration is launched LAUNCHES times and its median taken: one launch's
# step_ms_p50 varies by 5-20% from the next on this VM (page placement, the scheduler), more
# than the steps of one launch do.
echo "== kernels: spmd_train dp 1 at 1, 2 and 4 micro-batches, and dp 2 (${CAL[*]}; $LAUNCHES launches each)" >&2
# The machine's speed at each launch (pwm_step_probe, env.sh): the profile keeps its median, so
# sim_validate.sh can scale the kernels to the speed at its own launches. One-rank launches run on
# core 0, whose speed the probe measures (this VM's two vCPUs differ, by turns).
for r in $(seq 1 $LAUNCHES); do
  pwm_step_probe "$B/bench/model/model_bench" "${PROBE[@]}" >>"$W/probes"
  for mb in 1 2 4; do
    taskset -c 0 "${MPI[@]}" -n 1 "$B/spmd/spmd_train" "${CAL[@]}" --microbatches $mb --steps $STEPS --trace "$W/t1_$mb.json" --metrics "$W/m1_${mb}_$r.jsonl" >/dev/null
    "$B/sim/pwm_sim" --what kernels "${CAL[@]}" --microbatches $mb --sim-trace "$W/t1_$mb.json" --sim-metrics "$W/m1_${mb}_$r.jsonl" >"$W/k1_${mb}_$r.json"
  done
  "${MPI[@]}" -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/m2_$r.jsonl" >/dev/null
done

echo "== kernels: pathways_train dp 2, fused and chained (the trainers' per-step and per-node costs)" >&2
for r in $(seq 1 $LAUNCHES); do
  pwm_step_probe "$B/bench/model/model_bench" "${PROBE[@]}" >>"$W/probes"
  "${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --dp 2 --granularity fused --steps $STEPS --metrics "$W/mf_$r.jsonl" >/dev/null
  "${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --batch 4 --dp 2 --granularity fused --steps $STEPS --metrics "$W/mfs_$r.jsonl" >/dev/null
  "${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --dp 2 --granularity chained --steps $STEPS --metrics "$W/mc_$r.jsonl" >/dev/null
  "${MPI[@]}" -n 3 "$B/pathways/train/pathways_train" "${CAL[@]}" --dp 2 --granularity chained --microbatches 2 --steps $STEPS --metrics "$W/mc2_$r.jsonl" >/dev/null
done

# Dispatch before the emulated hosts: tearing their namespaces down keeps the cores busy for a
# while, which the microsecond costs at T = 0 would take in.
echo "== dispatch: dispatch_bench Fig. 5, 1 and 2 workers, chains of $DCHAIN and $DCHAIN2 ($DLAUNCHES launches each)" >&2
# Ranks pinned (PWM_MPIRUN_PIN_FLAGS, as sim_validate.sh's dispatch launches): unpinned, one
# command's per-computation times at T = 0 spread 2x between launches (docs/simulator.md,
# "Pinned dispatch launches").
DB=(--figs 5 --compute-us 0 --reps $DREPS)
DMPI=("$PWM_MPIRUN" $PWM_MPIRUN_PIN_FLAGS $PWM_MPIRUN_YIELD)
for r in $(seq 1 $DLAUNCHES); do
  "${DMPI[@]}" -n 2 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN --json "$W/d1_$r.json" >/dev/null
  "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN --json "$W/d2_$r.json" >/dev/null
  "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN2 --json "$W/d3_$r.json" >/dev/null
done

COLL=(-b 4 -e 16M -f 4 --algo ring,hd,auto -n $ITERS -w 3)
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
    # The emulated network's CPU (Link::cpu_ns_per_byte): the calibration model's dp 2 step
    # across the two hosts, each launch beside the same step in one host (paired, so the VM's
    # drift over the run cancels).
    for r in $(seq 1 $LAUNCHES); do
      "${MPI[@]}" -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/m2b_$r.jsonl" >/dev/null
      bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 --timeout 600 -- \
        bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/mh_$r.jsonl" >/dev/null
    done
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

mkdir -p "$(dirname "$OUT")"
PWM_PROBE="${PROBE[*]}" PWM_EMU2="$PWM_ROOT/sim/clusters/emu2.json" python3 - "$W" "$OUT" "$CLUSTER_NOTE" "$B/sim/pwm_sim" "$LAUNCHES" "$DCHAIN" "$DCHAIN2" "$DLAUNCHES" "${CAL[@]}" <<'PY'
import json, os, sys, platform, subprocess, time
w, out, note, pwm_sim, launches, dchain, dchain2, dlaunches = sys.argv[1:9]
launches, dchain, dchain2, dlaunches = int(launches), int(dchain), int(dchain2), int(dlaunches)
cal = sys.argv[9:]
def med(v):
    v = sorted(v); n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
def med_json(ds):  # the median of every numeric field of several launches' kernel sections
    return {k: med([d[k] for d in ds]) for k in ds[0] if isinstance(ds[0][k], (int, float))}
def load(n):
    p = os.path.join(w, n)
    return json.load(open(p)) if os.path.exists(p) else None

def small_allreduce(rows):
    return min(r['time_us'] for r in rows if r['algo'] == 'auto' and r['bytes'] <= 8)

def fit_link(rows):
    # AllReduce of 2 ranks: t(S) = 2 L + S / B_eff (each rank sends S/2 twice; the local
    # reduction is folded into B_eff, the same fraction of the bytes at any rank count for a
    # ring). Ring and halving-doubling move exactly these bytes for 2 ranks (hd as one message
    # per phase, the ring in segments); per size the faster of the two is kept. Over the shaped
    # DCN the ring runs at ~75% of a raw TCP stream's rate and hd at ~99% (docs/simulator.md,
    # "The shaped DCN"): the ring's loss is OpenMPI's TCP rendezvous behind the data queued the
    # other way, which the simulator does not model, not the link's; in one host and unshaped
    # the two are within noise.
    # Least squares over those points; L from the intercept, B from the slope.
    best = {}
    for r in rows:
        if r['algo'] in ('ring', 'hd') and r['op'] == 'allreduce':
            best[r['bytes']] = min(best.get(r['bytes'], float('inf')), r['time_us'])
    pts = sorted(best.items())
    n = len(pts); sx = sum(p[0] for p in pts); sy = sum(p[1] for p in pts)
    sxx = sum(p[0] ** 2 for p in pts); sxy = sum(p[0] * p[1] for p in pts)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    icpt = (sy - slope * sx) / n
    # The latency: the least disturbed of the intercept and the 4-byte AllReduce (one exchange
    # for 2 ranks: t = L). The bench averages its iterations, so a preempted one inflates it;
    # interference only slows, so the minimum of these measurements of one thing is the one kept.
    lat = max(icpt / 2, 0.0)
    lat = min(lat, small_allreduce(rows)) if lat > 0 else small_allreduce(rows)
    # The rate per message size: each AllReduce of 2 ranks is two messages of S/2, each
    # t/2 = L + (S/2) / B(S/2). Kept where the wire time is at least twice the latency (below
    # that the rate is latency's noise); the simulator interpolates in log(bytes) (sim/sim.h).
    curve = [(s / 2, (s / 2) / (t / 2 - lat) / 1e3) for s, t in sorted(pts) if t / 2 - lat >= 2 * lat]
    return {'latency_us': lat, 'gbytes_per_s': 1.0 / max(slope, 1e-9) / 1e3, 'overhead_us': 0.0,
            'gbytes_per_s_by_bytes': curve}

# Kernels at 1, 2 and 4 micro-batches of the calibration batch: the rates per micro-batch size.
kmb = {mb: med_json([json.load(open(os.path.join(w, f'k1_{mb}_{r}.json'))) for r in range(1, launches + 1)]) for mb in (1, 2, 4)}
k1 = kmb[1]
seq_len = int(cal[cal.index('--seq-len') + 1]); batch = int(cal[cal.index('--batch') + 1])
# What a step costs outside the spans, against its micro-batches: ov(M) = a + b (M - 1), least
# squares over M = 1, 2, 4 (b: a micro-batch's own sampling, loss and bookkeeping).
Ms = [1, 2, 4]; ovs = [kmb[m]['step_overhead_us'] for m in Ms]
mx, my = sum(m - 1 for m in Ms) / 3, sum(ovs) / 3
mb_over = max(0.0, sum((m - 1 - mx) * (o - my) for m, o in zip(Ms, ovs)) / sum((m - 1 - mx) ** 2 for m in Ms))
step_over = max(0.0, my - mb_over * mx)
rates = sorted(({'tokens': batch // mb * seq_len, 'fwd_us_per_gflop': k['fwd_us_per_gflop'], 'bwd_us_per_gflop': k['bwd_us_per_gflop']}
                for mb, k in kmb.items()), key=lambda r: r['tokens'])
ci = load('c_intra.json')
intra = fit_link(ci['rows'])
cx, cs = load('c_inter.json'), load('c_shaped.json')
inter = fit_link(cx['rows']) if cx else intra
shaped = fit_link(cs['rows']) if cs else inter

def rate(rows, mode, t):
    v = [r for r in rows if r['mode'] == mode and r['compute_us'] == t]
    return v[0]['computations_per_s'] if v else None  # the best repetition: interference only slows
d1 = [load(f'd1_{r}.json') for r in range(1, dlaunches + 1)]
d2 = [load(f'd2_{r}.json') for r in range(1, dlaunches + 1)]
d3 = [load(f'd3_{r}.json') for r in range(1, dlaunches + 1)]
def low_quartile(v):  # the statistic of every T = 0 figure here, and of every dispatch row in sim_validate.sh
    return sorted(v)[len(v) // 4]
def per_comp(ds, mode, t):  # the lower quartile over launches of each launch's best repetition
    return low_quartile([1e6 / rate(d['rows'], mode, t) for d in ds])
def eff(d, mode, t):  # the compute T the kernels actually spun (the bench measures it)
    v = [r for r in d['rows'] if r['mode'] == mode and r['compute_us'] == t]
    return v[0].get('effective_compute_us', t) or t
# The SPMD chain at T = 0 per computation: the AllReduce and an add, independent of the chain in
# the model. Taken from the longer chain: at 64 a launch lands in one of two modes (0.65-0.72 or
# 1.0-1.6 us over 24 launches), at 256 mostly in one (0.91-1.04 us in 10 launches of 12).
spmd = per_comp(d3, 'spmd', 0)
# A 4-byte AllReduce of the 2 workers: the in-host latency, also measured by that SPMD chain in
# the same process layout.
intra['latency_us'] = min(intra['latency_us'], spmd)
ar = intra['latency_us']
# The simulator's own formulas at T = 0 (sim/dispatch.cc; k = the chain, L = a controller
# message's latency = the in-host link's, F = the fetch round trip, X = call + node + 2 msg the
# controller's work per single-node program of 2 workers, se = spmd_exec_us the SPMD loop's own
# cost per computation beyond the AllReduce, pe = program_exec_us a program's):
#   SPMD     per computation = ar + se
#   Fused    per computation = ar + pe + (X + L + F) / k        (one program of one node)
#   Chained  per computation = ar + pe + (X + (k - 1) node + L + F) / k
#   OpByOp   per computation = X + (L + ar + pe + F) / k        (controller-bound: calls back to back)
# fitted to the lower quartiles at both chains c1 < c2: fused's line a + b / k through its two points
# gives pe = a - ar and X + L + F = b; chained - fused = (k - 1) / k node at each k, averaged;
# OpByOp over both chains solved for X with F = b - X - L (>= 0). pe is not se: the fused kernel's
# loop and the SPMD loop are different code, and over chains of 64-512 the fused computation's
# line has an intercept above the SPMD computation (1.15 against 0.95 us in the launches of
# 2026-11-25 10:20). Before branch i19-acc the opbyop rate was taken as X whole and the fused
# constant as X + F: at the validation's chain of 128 that put F / k = ~2 us per computation
# twice into OpByOp.
L = ar
c1, c2 = dchain, dchain2
se = spmd_exec = max(0.0, spmd - ar)
pf = {c1: per_comp(d2, 'fused', 0), c2: per_comp(d3, 'fused', 0)}
pc = {c1: per_comp(d2, 'chained', 0), c2: per_comp(d3, 'chained', 0)}
po = {c1: per_comp(d2, 'opbyop', 0), c2: per_comp(d3, 'opbyop', 0)}
po1, po2 = per_comp(d1, 'opbyop', 0), po[c1]
b_f = (pf[c1] - pf[c2]) / (1 / c1 - 1 / c2)
pe = program_exec = max(0.0, pf[c2] - b_f / c2 - ar)
B = max(0.0, b_f - L)  # = X + F
node = max(0.0, sum((pc[k] - pf[k]) * k / (k - 1) for k in (c1, c2)) / 2)
# X from OpByOp, F = B - X from the fused line, held >= 0: OpByOp's X (6-7 us, the controller's
# calls back to back) is the firmer figure. The fused line's slope is the noisier one: with its
# chain of 64 in the fast mode (1.35 against 1.30 us at 256, run 20 of 2026-11-25) B came out
# 3.1 us, and holding X <= B then put OpByOp at 3.2 us per computation against 6.7 measured.
# With h the mean of 1/k over both chains and po the mean OpByOp: X = po - (L + ar + pe + F) h,
# F = B - X when that is >= 0 (X <= B), else F = 0.
h, po_mean = (1 / c1 + 1 / c2) / 2, (po[c1] + po[c2]) / 2
X = po_mean - (L + ar + pe) * h
if X <= B:
    X = (po_mean - (L + ar + pe + B) * h) / (1 - h)
X = max(0.0, X)
fetch = max(0.0, B - X)
exec_us = 0.0  # the worker's per-launch cost is not separable from the node's here: all on the controller
# One worker more costs one run message more: OpByOp with 2 workers against 1. The 1-worker run
# also has one process less on the 2 cores (no time-sharing with the controller), so the
# difference is an upper bound; it is cut to what X leaves after the node.
msg = min(max(0.0, po2 - po1), max(0.0, (X - node) / 2))
call = max(0.0, X - node - 2 * msg)
prof = {
  'machine': f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; hosts: {note}",
  'kernels': {k: k1[k] for k in ('fwd_us_per_gflop', 'bwd_us_per_gflop', 'opt_us_per_param')} |
             {'step_overhead_us': step_over, 'microbatch_overhead_us': mb_over, 'contention': [[2, 1.0]], 'rates': rates},
  'links': {'reduce_ns_per_byte': 0.0, 'intra': intra, 'inter': inter, 'inter_shaped': shaped},
  'dispatch': {'call_us': call, 'node_us': node, 'msg_us': msg, 'exec_us': exec_us, 'spmd_exec_us': spmd_exec,
               'program_exec_us': program_exec, 'fetch_rtt_us': fetch, 'step_kernel_us': 0.0},
  'measured': {'kernels_dp1_by_microbatches': kmb, 'launches': launches, 'dispatch_launches': dlaunches, 'dispatch_chains': [c1, c2], 'allreduce_4B_intra_us': ar,
               'opbyop_per_comp_us': {'w1': po1, 'w2': po2},
               'per_comp_us_2_workers': {str(k): {'spmd': per_comp(d, 'spmd', 0), 'opbyop': po[k], 'chained': pc[k], 'fused': pf[k]}
                                         for k, d in ((c1, d2), (c2, d3))}},
}
# Ranks sharing the cores: the factor on the kernels that makes the simulated step of the
# calibration model at dp 2 (2 ranks; fused: 3 with the controller) equal the measured one
# (compute scales with it, the rest does not). Then the chained step's excess over the
# prediction, per node, is the trainer's per-node cost on the workers (train_node_us).
def final1(m):
    return [json.loads(l) for l in open(os.path.join(w, m)) if l.strip() and json.loads(l).get('final')][-1]
def final(prefix):  # the median launch's step_ms_p50
    return {'step_ms_p50': med([final1(f'{prefix}_{r}.jsonl')['step_ms_p50'] for r in range(1, launches + 1)])}
def predict(p, *extra, batch=None):
    tmp = os.path.join(w, 'p.json'); json.dump(p, open(tmp, 'w'))
    args = list(cal)
    if batch is not None: args[args.index('--batch') + 1] = str(batch)
    r = subprocess.run([pwm_sim, '--profile', tmp, '--what', 'step', *args, '--dp', '2', *extra], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
def factor(measured_ms, pred):
    rest = pred['step_ms'] - pred['compute_ms']
    return max(0.5, (measured_ms - rest) / pred['compute_ms'])
prof['kernels']['contention'] = [[2, 1.0]]
f2 = factor(final('m2')['step_ms_p50'], predict(prof))
# Three processes on two cores (the Pathways trainers: the controller polls beside the two
# workers): a factor f3 on the kernels (time-sharing) and a constant K per step (the step's
# dispatch and fetch round trip, the program's set-up on the workers), told apart by the fused
# step at two batches (8 and 4: twice the compute, the same per-step work):
#   measured_b = rest_b + K + f3 compute_b
prof['kernels']['contention'] = [[2, f2], [3, 1.0]]
pf8, pf4 = predict(prof, '--granularity', 'fused'), predict(prof, '--granularity', 'fused', batch=4)
e8 = final('mf')['step_ms_p50'] - (pf8['step_ms'] - pf8['compute_ms'])
e4 = final('mfs')['step_ms_p50'] - (pf4['step_ms'] - pf4['compute_ms'])
f3 = (e8 - e4) / (pf8['compute_ms'] - pf4['compute_ms'])
K = e8 - f3 * pf8['compute_ms']
if f3 < f2 or K < 0:  # noise put the solution outside the physical range: keep the other term at its bound
    if f3 < f2:
        f3 = f2
        K = max(0.0, 0.5 * (e8 - f3 * pf8['compute_ms'] + e4 - f3 * pf4['compute_ms']))
    else:
        K = 0.0
        f3 = max(f2, e8 / pf8['compute_ms'])
prof['kernels']['contention'] = [[2, f2], [3, f3]]
prof['dispatch']['step_kernel_us'] = K * 1e3
# A program of nodes (chained, opbyop, the pipeline): a cost per node (train_node_us: its
# buffers, inputs and launch on the worker) and per step (node_step_us: dispatch and fetch),
# told apart by the chained step at 1 and 2 micro-batches (the units' nodes double, the
# compute stays): excess_m = node_step + nodes_m node.
ec, nc = [], []
for pre, extra in (('mc', []), ('mc2', ['--microbatches', '2'])):
    pc = predict(prof, '--granularity', 'chained', *extra)
    ec.append((final(pre)['step_ms_p50'] - pc['step_ms']) * 1e3)
    nc.append(pc['nodes'])
node_c = (ec[1] - ec[0]) / (nc[1] - nc[0])
step_c = ec[0] - node_c * nc[0]
if node_c < 0 or step_c < 0:  # outside the physical range: the bound, the other term fitted to both
    if node_c < 0:
        node_c, step_c = 0.0, max(0.0, 0.5 * (ec[0] + ec[1]))
    else:
        step_c, node_c = 0.0, max(0.0, 0.5 * (ec[0] / nc[0] + ec[1] / nc[1]))
prof['dispatch']['train_node_us'] = node_c
prof['dispatch']['node_step_us'] = step_c
# The emulated network's CPU per byte: what the dp 2 step across two emulated hosts takes beyond
# the same step in one host (paired launches), less what the links themselves add in the
# simulator, over the bytes a rank sends and receives a step (a 2-rank ring: its gradient
# buffer each way). Set on both cross-host links: the shaped DCN runs through the same stack.
if os.path.exists(os.path.join(w, 'mh_1.jsonl')):
    emu = os.environ['PWM_EMU2']
    pl, ph = predict(prof), predict(prof, '--cluster', emu)
    extra_ms = (final('mh')['step_ms_p50'] - final('m2b')['step_ms_p50']) - (ph['step_ms'] - pl['step_ms'])
    bytes_per_rank = 2 * 4 * ph['params']
    cpu = max(0.0, extra_ms * 1e6 / bytes_per_rank)
    for l in ('inter', 'inter_shaped'): prof['links'][l]['cpu_ns_per_byte'] = cpu
    prof['measured']['emulated_net'] = {'spmd_dp2_1host_ms': final('m2b')['step_ms_p50'], 'spmd_dp2_2hosts_ms': final('mh')['step_ms_p50'],
                                        'sim_links_ms': ph['step_ms'] - pl['step_ms'], 'bytes_per_rank': bytes_per_rank}
probes = [tuple(map(float, l.split())) for l in open(os.path.join(w, 'probes')) if l.strip()]
prof['measured']['speed_probe'] = {'kind': 'model_step', 'model': os.environ['PWM_PROBE'].split(),
                                   'gflops_1': med([p[0] for p in probes]), 'probes': [p[0] for p in probes]}
prof['measured']['steps_ms'] = {'spmd_dp1': final('m1_1')['step_ms_p50'], 'spmd_dp2': final('m2')['step_ms_p50'],
                                'fused_dp2': final('mf')['step_ms_p50'], 'fused_dp2_batch4': final('mfs')['step_ms_p50'],
                                'chained_dp2': final('mc')['step_ms_p50'], 'chained_dp2_m2': final('mc2')['step_ms_p50']}
json.dump(prof, open(out, 'w'), indent=1)
print(json.dumps(prof, indent=1))
PY
echo "wrote $OUT" >&2
