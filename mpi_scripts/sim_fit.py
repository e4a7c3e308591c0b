#!/usr/bin/env python3
"""The simulator's calibration fit: sim_calibrate.sh's measurements in, a profile (JSON) out.

    sim_fit.py WORK_DIR OUT NOTE PWM_SIM LAUNCHES DCHAIN DCHAIN2 DLAUNCHES CAL_FLAGS...

WORK_DIR holds what sim_calibrate.sh measured (r = 1..LAUNCHES, or 1..DLAUNCHES for d*):
  k1_<M>_<r>.json      pwm_sim --what kernels of spmd_train dp 1 at M = 1, 2, 4 micro-batches
  kw_<r>.json, mw_<r>.jsonl
                       the same of the reference model (PWM_WIDE's flags) at the calibration's
                       one-micro-batch tokens, launched right after k1_1_<r> (optional: without
                       them no width factor)
  m1_<M>_<r>.jsonl, m2_<r>.jsonl, mf_<r>, mfs_<r>, mc_<r>, mc2_<r>, mo_<r>.jsonl
                       the trainers' metrics (spmd dp 1 and 2; pathways fused at batch 8 and 4,
                       chained at 1 and 2 micro-batches, opbyop (optional: without it no
                       train_call_us))
  ms_<r>.jsonl, ms2_<r>.jsonl
                       mpmd_train (the static model) dp 2 chained at 1 and 2 micro-batches
                       (optional: without them the profile has no static section)
  d1_<r>.json, d2_<r>.json, d3_<r>.json
                       dispatch_bench Fig. 5 at T = 0: 1 worker chain DCHAIN, 2 workers chains
                       DCHAIN and DCHAIN2 (their "static" rows give the static chain's costs)
  c_intra.json, c_inter.json, c_shaped.json
                       collectives_bench in one host, across 2 emulated hosts, over the shaped
                       DCN (the last two optional)
  m2b_<r>.jsonl, mh_<r>.jsonl
                       spmd_train dp 2 in one host and across two (optional, paired)
  probes               pwm_step_probe's GFLOP/s, one a line: every probe the calibration took
  <launch>.probe       the probes taken right before that trainer launch, core 0's then core 1's
                       (pwm_core_probes; m1_<M>_<r>, m2_<r>, mf_<r>,
                       ...; without them, older directories: one probe per round in `probes`,
                       LAUNCHES rounds of each phase: k1/m1/m2, then mf/mfs/mc/mc2, then ms/ms2)
Every launch of those phases is brought to the profile's reference speed (the median probe) by its
own probe (Measurements.factor): the VM's speed moves by 20-40% between phases, and a
phase's median at its own speed labelled with the whole calibration's median put every cost fitted
from it off by that phase's distance from the median (docs/simulator_calibration.md, "Speed
within the calibration").
NOTE is the profile's note on the hosts; PWM_SIM the simulator's CLI (run for step predictions);
CAL_FLAGS the calibration model's flags. Environment: PWM_PROBE (the speed probe's model flags,
recorded in the profile), PWM_WIDE (the reference model's flags, needed with kw_1.json), PWM_EMU2 (the 2-host cluster file, needed with mh_1.jsonl).
Writes OUT and prints the profile. The fits are functions of plain numbers, unit-tested in
tests/scripts/test_sim_fit.py; docs/simulator.md explains the model they fit.
"""
import json
import os
import platform
import subprocess
import sys
import time


def read_json(path):
    """The JSON document of a file."""
    with open(path) as f:
        return json.load(f)


def write_json(obj, path, **kw):
    """Writes obj to a file as JSON (json.dump's keywords)."""
    with open(path, 'w') as f:
        json.dump(obj, f, **kw)


def read_lines(path):
    """A text file's lines."""
    with open(path) as f:
        return f.readlines()


def med(v):
    """The median of a non-empty sequence (the mean of the middle two for an even count)."""
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def med_json(ds):
    """The median of every numeric field of several launches' kernel sections (the first's keys)."""
    return {k: med([d[k] for d in ds]) for k in ds[0] if isinstance(ds[0][k], (int, float))}


def low_quartile(v):
    """The lower quartile: element len // 4 of the sorted values (the 3rd fastest of 11 launches).

    The statistic of every T = 0 dispatch figure of the calibration, and of every dispatch row in
    sim_validate.sh (sim_report.py).
    """
    return sorted(v)[len(v) // 4]


def small_allreduce(rows):
    """The time (us) of the fastest `auto` AllReduce of at most 8 bytes in collectives_bench rows."""
    return min(r['time_us'] for r in rows if r['algo'] == 'auto' and r['bytes'] <= 8)


def fit_link(rows):
    """A link's latency, bandwidth and rate by message size from collectives_bench rows of 2 ranks.

    AllReduce of 2 ranks: t(S) = 2 L + S / B_eff (each rank sends S/2 twice; the local reduction
    is folded into B_eff, the same fraction of the bytes at any rank count for a ring). Ring and
    halving-doubling move exactly these bytes for 2 ranks (hd as one message per phase, the ring
    in segments); per size the faster of the two is kept. Over the shaped DCN the ring runs at
    ~75% of a raw TCP stream's rate and hd at ~99% (docs/simulator_calibration.md, "The shaped DCN"): the
    ring's loss is OpenMPI's TCP rendezvous behind the data queued the other way, which the
    simulator does not model, not the link's; in one host and unshaped the two are within noise.
    Least squares over those points; L from the intercept, B from the slope.
    """
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


def fit_step_overhead(ms, ovs):
    """(step_overhead_us, microbatch_overhead_us): ov(M) = a + b (M - 1) by least squares.

    What a step costs outside the spans, ovs, against its micro-batches ms (1, 2, 4): b is a
    micro-batch's own sampling, loss and bookkeeping. Both held >= 0 (b first, then a with it).
    """
    mx, my = sum(m - 1 for m in ms) / len(ms), sum(ovs) / len(ms)
    mb_over = max(0.0, sum((m - 1 - mx) * (o - my) for m, o in zip(ms, ovs)) / sum((m - 1 - mx) ** 2 for m in ms))
    step_over = max(0.0, my - mb_over * mx)
    return step_over, mb_over


def kernel_rates(kmb, batch, seq_len):
    """The kernels' rates per micro-batch size, by tokens: kmb maps micro-batches to kernel medians."""
    return sorted(({'tokens': batch // mb * seq_len, 'fwd_us_per_gflop': k['fwd_us_per_gflop'], 'bwd_us_per_gflop': k['bwd_us_per_gflop']}
                   for mb, k in kmb.items()), key=lambda r: r['tokens'])


def fit_width_scale(base, wide):
    """The kernels' width factor: the median over rounds of the wide model's cost per GFLOP over
    the calibration model's (fwd and bwd each), both at the same tokens a kernel. base and wide:
    per round, pwm_sim --what kernels' costs at the reference speed. Paired by round, as
    Measurements.paired: the two launches ran seconds apart, while the VM's speed moves 10-20%
    between rounds."""
    return {d: med([w[f'{d}_us_per_gflop'] / b[f'{d}_us_per_gflop'] for b, w in zip(base, wide)]) for d in ('fwd', 'bwd')}


def flag(flags, name):
    """The value after NAME in a list of command-line words."""
    return flags[flags.index(name) + 1]


def rate(rows, mode, t):
    """computations/s of MODE at compute T in dispatch_bench rows (its best repetition), or None."""
    v = [r for r in rows if r['mode'] == mode and r['compute_us'] == t]
    return v[0]['computations_per_s'] if v else None  # the best repetition: interference only slows


def per_comp(ds, mode, t):
    """us per computation: the lower quartile over launches ds of each launch's best repetition."""
    return low_quartile([1e6 / rate(d['rows'], mode, t) for d in ds])


def fit_dispatch(spmd, ar, c1, c2, pf, pc, po, po1):
    """The controller's costs from dispatch_bench's per-computation times at T = 0 (us).

    spmd: the SPMD chain (longer chain); ar: the in-host 4-byte AllReduce; c1 < c2: the chains;
    pf, pc, po: fused, chained and OpByOp with 2 workers by chain; po1: OpByOp with 1 worker at c1.
    Returns the profile's dispatch fields (step_kernel_us 0, fitted later with the trainers).

    The simulator's own formulas at T = 0 (sim/dispatch.cc; k = the chain, L = a controller
    message's latency = the in-host link's, F = the fetch round trip, X = call + node + 2 msg the
    controller's work per single-node program of 2 workers, se = spmd_exec_us the SPMD loop's own
    cost per computation beyond the AllReduce, pe = program_exec_us a program's):
      SPMD     per computation = ar + se
      Fused    per computation = ar + pe + (X + L + F) / k        (one program of one node)
      Chained  per computation = ar + pe + (X + (k - 1) node + L + F) / k
      OpByOp   per computation = X + (L + ar + pe + F) / k        (controller-bound: calls back to back)
    fitted to the lower quartiles at both chains c1 < c2: fused's line a + b / k through its two
    points gives pe = a - ar and X + L + F = b; chained - fused = (k - 1) / k node at each k,
    averaged; OpByOp over both chains solved for X with F = b - X - L (>= 0). pe is not se: the
    fused kernel's loop and the SPMD loop are different code, and over chains of 64-512 the fused
    computation's line has an intercept above the SPMD computation (1.15 against 0.95 us in the
    launches of 2026-11-25 10:20). Before branch i19-acc the opbyop rate was taken as X whole and
    the fused constant as X + F: at the validation's chain of 128 that put F / k = ~2 us per
    computation twice into OpByOp.
    """
    L = ar
    spmd_exec = max(0.0, spmd - ar)
    b_f = (pf[c1] - pf[c2]) / (1 / c1 - 1 / c2)
    pe = program_exec = max(0.0, pf[c2] - b_f / c2 - ar)
    B = max(0.0, b_f - L)  # = X + F
    node = max(0.0, sum((pc[k] - pf[k]) * k / (k - 1) for k in (c1, c2)) / 2)
    # X from OpByOp, F = B - X from the fused line, held >= 0: OpByOp's X (6-7 us, the
    # controller's calls back to back) is the firmer figure. The fused line's slope is the noisier
    # one: with its chain of 64 in the fast mode (1.35 against 1.30 us at 256, run 20 of
    # 2026-11-25) B came out 3.1 us, and holding X <= B then put OpByOp at 3.2 us per computation
    # against 6.7 measured. With h the mean of 1/k over both chains and po the mean OpByOp:
    # X = po - (L + ar + pe + F) h, F = B - X when that is >= 0 (X <= B), else F = 0.
    h, po_mean = (1 / c1 + 1 / c2) / 2, (po[c1] + po[c2]) / 2
    X = po_mean - (L + ar + pe) * h
    if X <= B:
        X = (po_mean - (L + ar + pe + B) * h) / (1 - h)
    X = max(0.0, X)
    fetch = max(0.0, B - X)
    exec_us = 0.0  # the worker's per-launch cost is not separable from the node's here: all on the controller
    # One worker more costs one run message more: OpByOp with 2 workers against 1. The 1-worker
    # run also has one process less on the 2 cores (no time-sharing with the controller), so the
    # difference is an upper bound; it is cut to what X leaves after the node.
    msg = min(max(0.0, po[c1] - po1), max(0.0, (X - node) / 2))
    call = max(0.0, X - node - 2 * msg)
    return {'call_us': call, 'node_us': node, 'msg_us': msg, 'exec_us': exec_us, 'spmd_exec_us': spmd_exec,
            'program_exec_us': program_exec, 'fetch_rtt_us': fetch, 'step_kernel_us': 0.0}


def contention_factor(measured_ms, pred):
    """The factor on a prediction's compute that makes its step measured_ms, at least 1.

    At least 1: two ranks on two cores never ran a kernel faster than one rank alone did. Traced
    side by side (2026-12-06, Intel Xeon family 6 model 167; docs/simulator_calibration.md, "The
    2-rank factor"), the calibration model's block backward took 2128 us at dp 2 against 2142 at
    dp 1, its forward +2%, the optimizer +13%; a fit below 1 (0.976 in that session's calibration)
    is the one-rank launches' drift against the two-rank ones, and it put every multi-rank row of
    the validation 10-17% fast.
    """
    rest = pred['step_ms'] - pred['compute_ms']
    return max(1.0, (measured_ms - rest) / pred['compute_ms'])


def fit_three_ranks(f2, e8, c8, e4, c4):
    """(f3, K ms): measured - rest = K + f3 compute at two batches (e8, c8 and e4, c4).

    Three processes on two cores (the Pathways trainers: the controller polls beside the two
    workers): a factor f3 on the kernels (time-sharing) and a constant K per step (the step's
    dispatch and fetch round trip, the program's set-up on the workers), told apart by the fused
    step at two batches (8 and 4: twice the compute, the same per-step work). When noise puts the
    solution outside the physical range (f3 < f2 or K < 0), one term is held at its bound and the
    other fitted to both.
    """
    f3 = (e8 - e4) / (c8 - c4)
    K = e8 - f3 * c8
    if f3 < f2 or K < 0:  # noise put the solution outside the physical range: keep the other term at its bound
        if f3 < f2:
            f3 = f2
            K = max(0.0, 0.5 * (e8 - f3 * c8 + e4 - f3 * c4))
        else:
            K = 0.0
            f3 = max(f2, e8 / c8)
    return f3, K


def fit_node_costs(ec, nc):
    """(train_node_us, node_step_us): excess_m = node_step + nodes_m node through two points.

    ec: the chained step's excess over the prediction (us) at 1 and 2 micro-batches; nc: the
    program's nodes at each. Outside the physical range (a negative term) that term is held at 0
    and the other fitted to both points.
    """
    node_c = (ec[1] - ec[0]) / (nc[1] - nc[0])
    step_c = ec[0] - node_c * nc[0]
    if node_c < 0 or step_c < 0:  # outside the physical range: the bound, the other term fitted to both
        if node_c < 0:
            node_c, step_c = 0.0, max(0.0, 0.5 * (ec[0] + ec[1]))
        else:
            step_c, node_c = 0.0, max(0.0, 0.5 * (ec[0] / nc[0] + ec[1] / nc[1]))
    return node_c, step_c


def fit_call_cost(measured_ms, predict_ms, hi=1.0, cap=1e6):
    """The opbyop step's training-call cost (train_call_us): the c >= 0 at which predict_ms(c), the
    predicted step (ms; non-decreasing in c), equals measured_ms, by bisection to 0.01 us. 0 when
    the prediction at c = 0 is already at or above the measurement; `cap` when even that is short.
    """
    if predict_ms(0.0) >= measured_ms:
        return 0.0
    while predict_ms(hi) < measured_ms:
        if hi >= cap:
            return cap
        hi *= 2
    lo = 0.0
    while hi - lo > 0.01:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if predict_ms(mid) < measured_ms else (lo, mid)
    return 0.5 * (lo + hi)


def fit_static(measured_ms, preds):
    """The static model's costs {'node_us', 'step_us'} from mpmd_train's chained step.

    measured_ms: the measured step (ms) at 1 and 2 micro-batches; preds: pwm_sim's rows of the same
    steps under --mpmd static with both costs 0 (their step_ms and nodes). As the Pathways node
    costs (fit_node_costs): excess_m = step + nodes_m node, solved through the two points, a
    negative term held at 0 and the other fitted to both.
    """
    ex = [(ms - p['step_ms']) * 1e3 for ms, p in zip(measured_ms, preds)]
    node, step = fit_node_costs(ex, [p['nodes'] for p in preds])
    return {'node_us': node, 'step_us': step}


def fit_static_chain(ar, c1, c2, ps):
    """{'exec_us', 'run_us'}: dispatch_bench's static chain per computation at T = 0 (us).

    The simulator's formula (sim/dispatch.cc, simulate_static_chain): per computation
    ar + exec + run / k at chain k (no controller, no fetch: the workers' executors alone), a line
    in 1/k through the lower quartiles at c1 < c2 (ps by chain): run from the slope, exec from the
    intercept less the AllReduce ar. A negative run is held at 0 and exec fitted to both chains'
    mean; exec is held >= 0.
    """
    run = (ps[c1] - ps[c2]) / (1 / c1 - 1 / c2)
    if run < 0:
        return {'exec_us': max(0.0, (ps[c1] + ps[c2]) / 2 - ar), 'run_us': 0.0}
    return {'exec_us': max(0.0, ps[c2] - run / c2 - ar), 'run_us': run}


def static_section(m, predict, prof, chain):
    """Sets prof['static'] from mpmd_train's launches ms_<r>, ms2_<r> (fit_static) and the static
    chain's costs `chain` (fit_static_chain), and returns the launches' measured steps (ms, at 1
    and 2 micro-batches); without those files (or without `chain`) leaves prof alone, None."""
    if not os.path.exists(m.path('ms_1.jsonl')) or chain is None:
        return None
    # The second point as the first's median plus the rounds' paired difference (Measurements.paired).
    ms = m.final('ms')['step_ms_p50']
    measured = [ms, ms + m.paired('ms', 'ms2')]
    prof['static'] = {'node_us': 0.0, 'step_us': 0.0} | chain  # the prediction without the trainer's costs
    preds = [predict(prof, '--granularity', 'chained', '--mpmd', 'static', *extra) for extra in ([], ['--microbatches', '2'])]
    prof['static'] = fit_static(measured, preds) | chain
    return measured


def final_line(path):
    """The last `final` record of a trainer's metrics (JSON lines)."""
    return [json.loads(l) for l in read_lines(path) if l.strip() and json.loads(l).get('final')][-1]


# The phases of rounds, in the order sim_calibrate.sh probes them: a launch's prefix -> its phase.
PHASES = {'k1': 0, 'm1': 0, 'mw': 0, 'm2': 0, 'mf': 1, 'mfs': 1, 'mc': 1, 'mc2': 1, 'mo': 1, 'ms': 2, 'ms2': 2}


def round_factors(probes, launches, phases=3):
    """Per phase, per round: the round's probe over the reference (the median of all), the factor
    that brings a cost measured in that round to the reference speed (a slower round, a lower probe,
    measured higher costs: times its factor < 1). All 1 when the probes are not one per round of
    every phase (a calibration's file from before this)."""
    if len(probes) != phases * launches or not probes:
        return [[1.0] * launches for _ in range(phases)]
    ref = med(probes)
    return [[probes[ph * launches + r] / ref for r in range(launches)] for ph in range(phases)]


def scale_kernels(k, f):
    """pwm_sim --what kernels' costs of one launch times a speed factor f (its other fields kept)."""
    return k | {n: k[n] * f for n in ('fwd_us_per_gflop', 'bwd_us_per_gflop', 'opt_us_per_param', 'step_overhead_us') if n in k}


class Measurements:
    """The files of one calibration's work directory (see the module's docstring)."""

    def __init__(self, w, launches, dlaunches):
        self.w, self.launches, self.dlaunches = w, launches, dlaunches
        p = self.path('probes')
        self.probes = [float(l.split()[0]) for l in read_lines(p) if l.strip()] if os.path.exists(p) else []
        self.factors = round_factors(self.probes, launches)

    def factor(self, prefix, r):
        """The speed factor of launch PREFIX_r (r 1-based): its own probe (PREFIX_r.probe: core 0's,
        or for a launch of more ranks than one the slower core's) over the reference (the median
        of core 0's); without that file, its round's (round_factors); 1 for a prefix of no phase."""
        p = self.path(f'{prefix}_{r}.probe')
        if os.path.exists(p) and self.probes:
            v = [list(map(float, l.split())) for l in read_lines(p) if l.strip()]
            # One rank (m1, mw: on core 0): core 0's probe; more: the slower core's (pwm_core_probes).
            if v: return (v[0][0] if prefix.split('_')[0] in ('m1', 'mw') else min(v[0])) / med(self.probes)
        ph = PHASES.get(prefix.split('_')[0])
        return 1.0 if ph is None else self.factors[ph][r - 1]

    def path(self, n):
        return os.path.join(self.w, n)

    def load(self, n):
        """A JSON file of the directory, None when it is missing."""
        p = self.path(n)
        return read_json(p) if os.path.exists(p) else None

    def final(self, prefix):
        """The median launch's step_ms_p50 of PREFIX_<r>.jsonl, r = 1..launches, each at the
        reference speed (factor)."""
        return {'step_ms_p50': med([final_line(self.path(f'{prefix}_{r}.jsonl'))['step_ms_p50'] * self.factor(prefix, r)
                                    for r in range(1, self.launches + 1)])}

    def paired(self, a, b):
        """The median over rounds r of B_r - A_r (step_ms_p50, each at the reference speed): launches
        of one round ran moments apart, so their difference leaves out the round's state, which
        moves each launch by 10-20% on this VM (docs/simulator_calibration.md, "Speed within the
        calibration")."""
        return med([final_line(self.path(f'{b}_{r}.jsonl'))['step_ms_p50'] * self.factor(b, r) -
                    final_line(self.path(f'{a}_{r}.jsonl'))['step_ms_p50'] * self.factor(a, r) for r in range(1, self.launches + 1)])

    def dispatch(self, stem):
        """dispatch_bench's launches STEM_<r>.json, r = 1..dlaunches."""
        return [self.load(f'{stem}_{r}.json') for r in range(1, self.dlaunches + 1)]


def predictor(pwm_sim, w, cal):
    """predict(profile, *extra, batch=None): pwm_sim's dp 2 step of the calibration model CAL.

    The profile goes through WORK_DIR/p.json; batch replaces --batch's value in CAL.
    """
    def predict(p, *extra, batch=None):
        tmp = os.path.join(w, 'p.json'); write_json(p, tmp)
        args = list(cal)
        if batch is not None: args[args.index('--batch') + 1] = str(batch)
        r = subprocess.run([pwm_sim, '--profile', tmp, '--what', 'step', *args, '--dp', '2', *extra], capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])
    return predict


def width_scales(m, launches, cal, wide):
    """Profile kernels.width_scales: 1 at the calibration model's d_model, the paired factor
    (fit_width_scale) at the reference model's; [] without its launches (kw_1.json) or flags."""
    if not wide or not os.path.exists(m.path('kw_1.json')):
        return []
    tokens = int(flag(cal, '--batch')) * int(flag(cal, '--seq-len'))
    if int(flag(wide, '--batch')) * int(flag(wide, '--seq-len')) != tokens:
        raise SystemExit(f"sim_fit.py: PWM_WIDE's model runs {flag(wide, '--batch')} x {flag(wide, '--seq-len')} tokens a kernel, "
                         f"the calibration model {tokens}: give it the same (the factor is of the width alone)")
    rounds = range(1, launches + 1)
    base = [scale_kernels(read_json(m.path(f'k1_1_{r}.json')), m.factor('m1_1', r)) for r in rounds]
    wide_k = [scale_kernels(read_json(m.path(f'kw_{r}.json')), m.factor('mw', r)) for r in rounds]
    f = fit_width_scale(base, wide_k)
    return [{'d_model': float(flag(cal, '--d-model')), 'fwd': 1.0, 'bwd': 1.0},
            {'d_model': float(flag(wide, '--d-model')), 'fwd': f['fwd'], 'bwd': f['bwd']}]


def calibrate(w, note, pwm_sim, launches, dchain, dchain2, dlaunches, cal, probe_model, emu2):
    """The profile (a dict) from the measurements in w; runs pwm_sim for the trainers' fits."""
    m = Measurements(w, launches, dlaunches)
    # Kernels at 1, 2 and 4 micro-batches of the calibration batch: the rates per micro-batch size.
    kmb = {mb: med_json([scale_kernels(read_json(m.path(f'k1_{mb}_{r}.json')), m.factor(f'm1_{mb}', r)) for r in range(1, launches + 1)])
           for mb in (1, 2, 4)}
    k1 = kmb[1]
    seq_len, batch = int(flag(cal, '--seq-len')), int(flag(cal, '--batch'))
    step_over, mb_over = fit_step_overhead([1, 2, 4], [kmb[mb]['step_overhead_us'] for mb in (1, 2, 4)])
    rates = kernel_rates(kmb, batch, seq_len)
    widths = width_scales(m, launches, cal, os.environ.get('PWM_WIDE', '').split())
    ci = m.load('c_intra.json')
    intra = fit_link(ci['rows'])
    cx, cs = m.load('c_inter.json'), m.load('c_shaped.json')
    inter = fit_link(cx['rows']) if cx else intra
    shaped = fit_link(cs['rows']) if cs else inter

    d1, d2, d3 = m.dispatch('d1'), m.dispatch('d2'), m.dispatch('d3')
    # The SPMD chain at T = 0 per computation: the AllReduce and an add, independent of the chain
    # in the model. Taken from the longer chain: at 64 a launch lands in one of two modes
    # (0.65-0.72 or 1.0-1.6 us over 24 launches), at 256 mostly in one (0.91-1.04 us in 10
    # launches of 12).
    spmd = per_comp(d3, 'spmd', 0)
    # A 4-byte AllReduce of the 2 workers: the in-host latency, also measured by that SPMD chain
    # in the same process layout.
    intra['latency_us'] = min(intra['latency_us'], spmd)
    ar = intra['latency_us']
    c1, c2 = dchain, dchain2
    pf = {c1: per_comp(d2, 'fused', 0), c2: per_comp(d3, 'fused', 0)}
    pc = {c1: per_comp(d2, 'chained', 0), c2: per_comp(d3, 'chained', 0)}
    po = {c1: per_comp(d2, 'opbyop', 0), c2: per_comp(d3, 'opbyop', 0)}
    po1, po2 = per_comp(d1, 'opbyop', 0), po[c1]
    dispatch = fit_dispatch(spmd, ar, c1, c2, pf, pc, po, po1)
    # dispatch_bench's static chain (its row "static" since 5d70c64; absent from older benches).
    has_static = all(rate(d['rows'], 'static', 0) is not None for d in d2 + d3)
    ps = {c1: per_comp(d2, 'static', 0), c2: per_comp(d3, 'static', 0)} if has_static else None
    static_chain = fit_static_chain(ar, c1, c2, ps) if has_static else None
    prof = {
      'machine': f"{platform.node()} {platform.processor() or platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; hosts: {note}",
      'kernels': {k: k1[k] for k in ('fwd_us_per_gflop', 'bwd_us_per_gflop', 'opt_us_per_param')} |
                 {'step_overhead_us': step_over, 'microbatch_overhead_us': mb_over, 'contention': [[2, 1.0]], 'rates': rates,
                  'width_scales': widths},
      'links': {'reduce_ns_per_byte': 0.0, 'intra': intra, 'inter': inter, 'inter_shaped': shaped},
      'dispatch': dispatch,
      'measured': {'kernels_dp1_by_microbatches': kmb, 'launches': launches, 'dispatch_launches': dlaunches, 'dispatch_chains': [c1, c2], 'allreduce_4B_intra_us': ar,
                   'opbyop_per_comp_us': {'w1': po1, 'w2': po2},
                   'per_comp_us_2_workers': {str(k): {'spmd': per_comp(d, 'spmd', 0), 'opbyop': po[k], 'chained': pc[k], 'fused': pf[k]}
                                             | ({'static': ps[k]} if ps else {}) for k, d in ((c1, d2), (c2, d3))}},
    }
    predict = predictor(pwm_sim, w, cal)
    # Ranks sharing the cores: the factor on the kernels that makes the simulated step of the
    # calibration model at dp 2 (2 ranks; fused: 3 with the controller) equal the measured one
    # (compute scales with it, the rest does not). Then the chained step's excess over the
    # prediction, per node, is the trainer's per-node cost on the workers (train_node_us).
    prof['kernels']['contention'] = [[2, 1.0]]
    f2 = contention_factor(m.final('m2')['step_ms_p50'], predict(prof))
    # Three processes on two cores: measured_b = rest_b + K + f3 compute_b (fit_three_ranks).
    prof['kernels']['contention'] = [[2, f2], [3, 1.0]]
    pf8, pf4 = predict(prof, '--granularity', 'fused'), predict(prof, '--granularity', 'fused', batch=4)
    e8 = m.final('mf')['step_ms_p50'] - (pf8['step_ms'] - pf8['compute_ms'])
    e4 = m.final('mf')['step_ms_p50'] + m.paired('mf', 'mfs') - (pf4['step_ms'] - pf4['compute_ms'])  # (paired: Measurements.paired)
    f3, K = fit_three_ranks(f2, e8, pf8['compute_ms'], e4, pf4['compute_ms'])
    prof['kernels']['contention'] = [[2, f2], [3, f3]]
    prof['dispatch']['step_kernel_us'] = K * 1e3
    # A program of nodes (chained, opbyop, the pipeline): a cost per node (train_node_us: its
    # buffers, inputs and launch on the worker) and per step (node_step_us: dispatch and fetch),
    # told apart by the chained step at 1 and 2 micro-batches (the units' nodes double, the
    # compute stays): excess_m = node_step + nodes_m node.
    ec, nc = [], []
    for pre, extra in (('mc', []), ('mc2', ['--microbatches', '2'])):
        p = predict(prof, '--granularity', 'chained', *extra)
        got = m.final('mc')['step_ms_p50'] + (m.paired('mc', pre) if pre != 'mc' else 0.0)  # (paired: Measurements.paired)
        ec.append((got - p['step_ms']) * 1e3)
        nc.append(p['nodes'])
    node_c, step_c = fit_node_costs(ec, nc)
    prof['dispatch']['train_node_us'] = node_c
    prof['dispatch']['node_step_us'] = step_c
    # OpByOp (the chained step's nodes, each its own Client::call): the controller's cost per call
    # of a training node beyond dispatch_bench's call_us, whose 1-element calls hold no training
    # arguments; the cost at which the predicted opbyop step exceeds the predicted chained one by
    # what the measured opbyop launches exceeded the chained ones of their rounds (fit_call_cost,
    # m.paired: medians of separate launches moved the fit from 50 to 359 us between two runs).
    if os.path.exists(m.path('mo_1.jsonl')):
        def opbyop_ms(c):
            prof['dispatch']['train_call_us'] = c
            return predict(prof, '--granularity', 'opbyop')['step_ms']
        prof['dispatch']['train_call_us'] = 0.0
        chained_ms = predict(prof, '--granularity', 'chained')['step_ms']
        prof['dispatch']['train_call_us'] = fit_call_cost(chained_ms + m.paired('mc', 'mo'), opbyop_ms)
    # The static model (mpmd_train: two processes on the two cores, no controller): its executor's
    # cost per node and its per-step constant (the statistics' allgather), from its chained step
    # at 1 and 2 micro-batches as the Pathways node costs just above (fit_static).
    static_ms = static_section(m, predict, prof, static_chain)
    # The emulated network's CPU per byte: what the dp 2 step across two emulated hosts takes
    # beyond the same step in one host (paired launches), less what the links themselves add in
    # the simulator, over the bytes a rank sends and receives a step (a 2-rank ring: its gradient
    # buffer each way). Set on both cross-host links: the shaped DCN runs through the same stack.
    if os.path.exists(m.path('mh_1.jsonl')):
        pl, ph = predict(prof), predict(prof, '--cluster', emu2)
        extra_ms = (m.final('mh')['step_ms_p50'] - m.final('m2b')['step_ms_p50']) - (ph['step_ms'] - pl['step_ms'])
        bytes_per_rank = 2 * 4 * ph['params']
        cpu = max(0.0, extra_ms * 1e6 / bytes_per_rank)
        for l in ('inter', 'inter_shaped'): prof['links'][l]['cpu_ns_per_byte'] = cpu
        prof['measured']['emulated_net'] = {'spmd_dp2_1host_ms': m.final('m2b')['step_ms_p50'], 'spmd_dp2_2hosts_ms': m.final('mh')['step_ms_p50'],
                                            'sim_links_ms': ph['step_ms'] - pl['step_ms'], 'bytes_per_rank': bytes_per_rank}
    prof['measured']['speed_probe'] = {'kind': 'model_step', 'model': probe_model.split(),
                                       'gflops_1': med(m.probes), 'probes': m.probes}
    # Each launch's speed factor (or, from an older directory, each round's).
    launches_probed = sorted(n[:-len('.probe')] for n in os.listdir(w) if n.endswith('.probe'))
    prof['measured']['speed_factors'] = {n: round(m.factor(n.rsplit('_', 1)[0], int(n.rsplit('_', 1)[1])), 4)
                                         for n in launches_probed} or m.factors
    prof['measured']['steps_ms'] = {'spmd_dp1': m.final('m1_1')['step_ms_p50'], 'spmd_dp2': m.final('m2')['step_ms_p50'],
                                    'fused_dp2': m.final('mf')['step_ms_p50'], 'fused_dp2_batch4': m.final('mfs')['step_ms_p50'],
                                    'chained_dp2': m.final('mc')['step_ms_p50'], 'chained_dp2_m2': m.final('mc2')['step_ms_p50']}
    if os.path.exists(m.path('mo_1.jsonl')):
        prof['measured']['steps_ms']['opbyop_dp2'] = m.final('mo')['step_ms_p50']
    if static_ms:
        prof['measured']['steps_ms'] |= {'static_chained_dp2': static_ms[0], 'static_chained_dp2_m2': static_ms[1]}
    return prof


def main(argv=None):
    """sim_fit.py WORK_DIR OUT NOTE PWM_SIM LAUNCHES DCHAIN DCHAIN2 DLAUNCHES CAL_FLAGS..."""
    argv = sys.argv[1:] if argv is None else argv
    w, out, note, pwm_sim, launches, dchain, dchain2, dlaunches = argv[:8]
    prof = calibrate(w, note, pwm_sim, int(launches), int(dchain), int(dchain2), int(dlaunches), argv[8:],
                     os.environ['PWM_PROBE'], os.environ.get('PWM_EMU2'))
    write_json(prof, out, indent=1)
    print(json.dumps(prof, indent=1))


if __name__ == '__main__':
    main()
