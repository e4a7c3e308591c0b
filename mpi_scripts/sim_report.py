#!/usr/bin/env python3
"""The simulator's validation (mpi_scripts/sim_validate.sh): profiles scaled to the machine's
speed, and the report of predicted against measured.

    sim_report.py scale PROFILE PROBES OUT [RANKS]
        OUT = PROFILE with its costs scaled by the speed probes in PROBES (GFLOP/s; per line core
        0's, or with RANKS > 1 the slower core's: read_probes) against the calibration's
        (scale_profile).
    sim_report.py imbalance METRICS...
        The MoE steps' device imbalance the launches measured: the median over every step line of
        the metrics files of moe.device_max_mean (the busiest expert-parallel device's rows over
        the mean, train/report.h), 1 when none reports it. pwm_sim's --moe-imbalance for that row:
        the simulator costs the router's outcome, it does not predict it.
    sim_report.py report WORK_DIR OUT_DIR PROFILE PWM_SIM
        WORK_DIR/list has a line per trainer configuration, `NAME PREDICTION METRICS...` (pwm_sim's
        output, each launch's metrics), beside NAME.profile.json (its scaled profile);
        WORK_DIR/dispatch_*.json are dispatch_bench launches (dispatch_0_<r> at T = 0,
        dispatch_T_<r> at T > 0), predicted by PWM_SIM from WORK_DIR/dispatch.profile.json (or
        PROFILE); WORK_DIR/goodput/failure_bench.json (optional) a short failure_bench.sh run,
        its goodput against sim/project_goodput.py's model (goodput_rows). Prints the table, writes OUT_DIR/validation.json and OUT_DIR/validation.png;
        exit code 0 when every row is within TOLERANCE (10%), else 1.
Beside each measured figure, its order-statistic interval over the launches (measure.py:
median_interval for a median, quantile_interval for dispatch_bench's lower quartile) and whether
the prediction lies inside it: outside means the launches place the figure away from the
prediction, inside that they cannot tell the two apart.
Unit-tested in tests/scripts/test_sim_report.py.
"""
import json
import os
import subprocess
import sys
import time

import measure
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'sim'))
import project_goodput  # noqa: E402  (sim/, added above)
from dispatch_plot import line_plot, write_data
from sim_fit import low_quartile, med, read_json, read_lines, write_json

TOLERANCE = 0.10  # a configuration passes when |predicted - measured| / measured is at most this


def scale_profile(prof, probes):
    """The profile with its costs scaled to the speed now (in place; returns it).

    probes: this configuration's speed probes (GFLOP/s). The kernels, the optimizer and the
    controller's costs are multiplied by calibration / now (the profile's speed_probe gflops_1
    over the probes' median; the static model's node_us and exec_us with them), recorded under
    'scaled'. Unchanged without probes or without a
    calibration probe in the profile. The 2-rank contention factors are the calibration's
    (docs/simulator_calibration.md, "Speed scaling").
    """
    cal = prof.get('measured', {}).get('speed_probe')
    if cal and probes:
        g1 = med(probes)
        s = cal['gflops_1'] / g1
        k = prof['kernels']
        for f in ('fwd_us_per_gflop', 'bwd_us_per_gflop', 'opt_us_per_param'): k[f] *= s
        for r in k.get('rates', []):
            r['fwd_us_per_gflop'] *= s; r['bwd_us_per_gflop'] *= s
        d = prof['dispatch']
        for f in ('call_us', 'node_us', 'msg_us', 'exec_us', 'spmd_exec_us', 'program_exec_us', 'train_node_us', 'train_call_us'):
            if f in d: d[f] *= s
        # The static executor's CPU per node and per computation, as train_node_us and
        # spmd_exec_us; not its per-step and per-run constants (as node_step_us and the fetch).
        for f in ('node_us', 'exec_us'):
            if f in prof.get('static', {}): prof['static'][f] *= s
        prof['scaled'] = {'probe_now': g1, 'kernel_factor': s}
    return prof


def read_probes(path, ranks=1):
    """Per non-blank line of a probes file (pwm_core_probes: core 0's, then core 1's), the speed a
    launch of `ranks` ranks went at: core 0's for one rank (pinned there), the slower core's for
    more (its ranks meet every step; a line of one field: that field)."""
    return [float(f[0]) if ranks <= 1 else min(map(float, f)) for f in (l.split() for l in read_lines(path) if l.strip())]


def spread(v):
    """The launches' range over their median (0 for none)."""
    return (max(v) - min(v)) / med(v) if v else 0.0


def interval_fields(launches, predicted, quantile=0.5):
    """The measured figure's interval over the launches (measure.median_interval, or
    measure.quantile_interval for another quantile) and whether `predicted` lies inside it:
    'interval' [lo, hi], 'coverage', 'inside'; all None for one launch (no interval)."""
    iv = measure.median_interval(launches) if quantile == 0.5 else measure.quantile_interval(launches, quantile)
    if iv is None:
        return {'interval': None, 'coverage': None, 'inside': None}
    lo, hi, cov = iv
    return {'interval': [lo, hi], 'coverage': cov, 'inside': lo <= predicted <= hi}


def last_line_json(text):
    """The JSON object on the last line of a program's output (pwm_sim prints its result last)."""
    return json.loads(text.strip().splitlines()[-1])


def trainer_rows(w):
    """One row per configuration in WORK_DIR/list with at least one finished launch."""
    rows = []
    for line in read_lines(os.path.join(w, 'list')):
        name, pred, *ms = line.split()
        finals = []
        for m in ms:
            f = [json.loads(l) for l in read_lines(m) if l.strip() and json.loads(l).get('final')]
            if f: finals.append(f[-1])
        if not finals: continue
        p = last_line_json(''.join(read_lines(pred)))
        steps = [f['step_ms_p50'] for f in finals]
        rows.append({'config': name, 'measured': med(steps), 'predicted': p['step_ms'], 'unit': 'ms/step', 'spread': spread(steps),
                     'launches': steps, 'measured_tok_s': med([f['tokens_per_s'] for f in finals]), 'predicted_tok_s': p['tokens_per_s'],
                     'params': p.get('params'), 'speed': read_json(os.path.join(w, name + '.profile.json')).get('scaled'),
                     **interval_fields(steps, p['step_ms'])})
    return rows


def measured_imbalance(files):
    """sim_report.py imbalance: the median moe.device_max_mean of the files' step lines, >= 1."""
    v = []
    for m in files:
        for line in read_lines(m):
            j = json.loads(line) if line.strip() else {}
            if 'loss' in j and (j.get('moe') or {}).get('device_max_mean'):
                v.append(j['moe']['device_max_mean'])
    return max(1.0, med(v)) if v else 1.0


def group_dispatch(files):
    """dispatch_bench rows of Fig. 5 by (mode, compute_us), in file order.

    dispatch_bench labels T = 0 '5' and T > 0 '6'; the T = 0 rows of a dispatch_T_* launch only
    give the bench the effective compute and are left out.
    """
    by = {}
    for dj in files:
        for r in read_json(dj)['rows']:
            if r['fig'] not in ('5', '6'): continue  # dispatch_bench labels T = 0 '5', T > 0 '6'
            if os.path.basename(dj).startswith('dispatch_T_') and r['compute_us'] == 0: continue
            by.setdefault((r['mode'], r['compute_us']), []).append(r)
    return by


def dispatch_rows(by, predict):
    """One row per (mode, T): us per computation measured against predict(effective T)[mode].

    Per launch the best repetition (as dispatch_bench reports), then the lower quartile of the
    launches (the 3rd fastest of 11 at T = 0, the 2nd of 5 at T > 0), as the calibration's T = 0
    figures: slow launches come in phases of minutes, which moved the median of 11 launches by
    up to 48% (docs/simulator_calibration.md, "The T = 0 rows"). Time per computation so that "lower is
    better" as for step times. T is the kernel's duration as dispatch_bench measured it
    (effective_compute_us: a loaded machine stretches the calibrated spin), the median of the
    launches.
    """
    rows = []
    for (mode, t), rs in by.items():
        eff = med([r.get('effective_compute_us', r['compute_us']) for r in rs])
        p = predict(eff)
        if mode not in p: continue  # a mode the profile cannot predict (static: a profile from before it)
        per = [1e6 / r['computations_per_s'] for r in rs]
        rows.append({'config': f"fig5_{mode}_T{t}", 'measured': low_quartile(per), 'predicted': 1e6 / p[mode], 'unit': 'us/comp',
                     'spread': spread(per), 'launches': per, **interval_fields(per, 1e6 / p[mode], quantile=0.25)})
    return rows


def dispatch_predictor(pwm_sim, profile):
    """predict(T): pwm_sim's computations/s per mode for 2 workers at compute T (us)."""
    def predict(eff):
        out = subprocess.run([pwm_sim, '--profile', profile, '--what', 'dispatch', '--workers', '2', '--compute-us', str(eff)],
                             capture_output=True, text=True, check=True).stdout
        return last_line_json(out)
    return predict


def goodput_rows(path):
    """One row per trainer of failure_bench.sh's JSON: its measured goodput against the goodput
    model's (sim/project_goodput.py's check_bench: what each fault costs at the run's own step,
    checkpoint interval, MTBF and measured detection and restart, times the faults the run drew).
    One run each: no interval."""
    return [{'config': f"goodput_{c['trainer']}", 'measured': c['measured'], 'predicted': c['predicted'], 'unit': 'goodput',
             'spread': 0.0, 'launches': [c['measured']], 'interval': None, 'coverage': None, 'inside': None}
            for c in project_goodput.check_bench(path) if c['measured'] > 0]


def add_errors(rows):
    """Each row's relative error of the prediction ('error'; 'tok_error' for tokens/s too)."""
    for r in rows:
        r['error'] = (r['predicted'] - r['measured']) / r['measured']
        if 'measured_tok_s' in r: r['tok_error'] = (r['predicted_tok_s'] - r['measured_tok_s']) / r['measured_tok_s']
    return rows


def within(rows, tol=TOLERANCE):
    """How many rows have |error| <= tol."""
    return sum(abs(r['error']) <= tol for r in rows)


def inside(rows):
    """(predictions inside the measured interval, rows with an interval)."""
    return sum(r.get('inside') is True for r in rows), sum(r.get('inside') is not None for r in rows)


# The families of rows the simulator was never fitted to (sim_validate.sh names them so).
UNFITTED = ('size_', 'moe_', 'island_', 'goodput_')


def acceptance(rows, tol=TOLERANCE):
    """The validation's three summary figures (issue 57's acceptance, each run on its own):

    'median_step_error': the median signed error of the training-step rows (unit ms/step): a
    calibration bias shows as one sign on all of them, noise as errors of both signs;
    'good', 'rows': the rows within tol or whose prediction lies inside the measured interval;
    'largest': the size_* row of the most parameters ({'config', 'error'}), None without one.
    """
    steps = [r['error'] for r in rows if r['unit'] == 'ms/step']
    good = sum(abs(r['error']) <= tol or r.get('inside') is True for r in rows)
    sizes = [r for r in rows if r['config'].startswith('size_') and r.get('params')]
    big = max(sizes, key=lambda r: (r['params'], r['config'])) if sizes else None
    return {'median_step_error': med(steps) if steps else None, 'good': good, 'rows': len(rows),
            'largest': {'config': big['config'], 'error': big['error']} if big else None}


def acceptance_line(a):
    """The report's line of acceptance(): median step error, rows good, the largest size's error."""
    med_txt = f"{100 * a['median_step_error']:+.1f}%" if a['median_step_error'] is not None else 'n/a'
    big = f"{a['largest']['config']} {100 * a['largest']['error']:+.1f}%" if a['largest'] else 'no size_* row'
    return (f"training-step rows: median signed error {med_txt}; {a['good']}/{a['rows']} rows within 10% or inside "
            f"their interval; largest size: {big}")


def interval_text(r):
    """'10.000-12.000 (75%)' (the coverage the launches give), or 'one launch'."""
    if not r.get('interval'):
        return 'one launch'
    return f"{r['interval'][0]:.3f}-{r['interval'][1]:.3f} ({100 * r['coverage']:.0f}%)"


def passed(rows, tol=TOLERANCE):
    """Whether there are rows and every one is within tol (the script's exit code 0)."""
    return bool(rows) and within(rows, tol) == len(rows)


def table(rows, load):
    """The report's lines: a header, a line per row, the count within 10% and 5%, how many predictions
    lie inside their measured interval, and the load."""
    lines = [f"{'configuration':32} {'measured':>12} {'spread':>7} {'interval (coverage)':>26} {'predicted':>12} {'unit':8} {'error':>7} "
             f"{'pred in':>7}   {'tok/s meas':>10} {'tok/s pred':>10} {'error':>7}"]
    for r in rows:
        tok = f"{r['measured_tok_s']:10.0f} {r['predicted_tok_s']:10.0f} {100*r['tok_error']:6.1f}%" if 'tok_error' in r else ''
        sp = r.get('speed') or {}
        spd = f"   speed x{sp['kernel_factor']:.2f}" if sp else ''
        where = {True: 'inside', False: 'outside'}.get(r.get('inside'), '-')
        lines.append(f"{r['config']:32} {r['measured']:12.3f} {100*r['spread']:6.1f}% {interval_text(r):>26} {r['predicted']:12.3f} {r['unit']:8} "
                     f"{100*r['error']:6.1f}% {where:>7}   {tok}{spd}")
    n_in, n_iv = inside(rows)
    lines.append(f"{within(rows)}/{len(rows)} within 10% ({within(rows, 0.05)} within 5%); {n_in}/{n_iv} predictions inside the "
                 f"measured interval; load {load[0]:.2f} {load[1]:.2f}")
    lines.append(acceptance_line(acceptance(rows)))
    return lines


def plot(rows, w, outdir):
    """validation.png: predicted against measured, log-log, with the +-10% band (gnuplot)."""
    series = []
    for unit, title in (('ms/step', 'step time (ms)'), ('us/comp', 'dispatch_bench Fig. 5 (us per computation)')):
        rs = [r for r in rows if r['unit'] == unit]
        if not rs: continue
        data = os.path.join(w, f"v_{unit.replace('/', '_')}.dat")
        write_data(data, [(r['measured'], r['predicted'], r['config']) for r in rs])
        series.append(f"'{data}' using 1:2 with points pt 7 title '{title}', '' using 1:2:3 with labels offset 0,0.8 font ',7' notitle")
    if series:
        series += ["x with lines lc 'black' title 'predicted = measured'", "1.1*x with lines dt 2 lc 'gray' title '+-10%'",
                   "0.9*x with lines dt 2 lc 'gray' notitle"]
        line_plot(os.path.join(outdir, 'validation.png'), 'pwm_sim: predicted vs measured', 'measured', 'predicted', series,
                  'set logscale xy\nset termoption noenhanced\nset key top left')


def report(w, outdir, profile, pwm_sim):
    """The validation report of WORK_DIR (see the module's docstring); returns the exit code."""
    rows = trainer_rows(w)
    djs = [os.path.join(w, f) for f in sorted(os.listdir(w)) if f.startswith('dispatch_') and f.endswith('.json')]
    if djs:
        dprof = os.path.join(w, 'dispatch.profile.json')
        rows += dispatch_rows(group_dispatch(djs), dispatch_predictor(pwm_sim, dprof if os.path.exists(dprof) else profile))
    gp = os.path.join(w, 'goodput', 'failure_bench.json')
    if os.path.exists(gp):
        rows += goodput_rows(gp)
    add_errors(rows)
    load = os.getloadavg()
    print('\n'.join(table(rows, load)))
    write_json({'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'profile': profile, 'load': load, 'rows': rows,
                'acceptance': acceptance(rows)},
               os.path.join(outdir, 'validation.json'), indent=1)
    # The plot: gnuplot, as mpi_scripts/dispatch_plot.py draws the dispatch figures.
    plot(rows, w, outdir)
    return 0 if passed(rows) else 1


def main(argv=None):
    """sim_report.py scale PROFILE PROBES OUT [RANKS] | imbalance METRICS... | report WORK_DIR OUT_DIR PROFILE PWM_SIM"""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['scale'] and len(argv) in (4, 5):
        prof = scale_profile(read_json(argv[1]), read_probes(argv[2], int(argv[4]) if len(argv) == 5 else 1))
        write_json(prof, argv[3], indent=1)
        return 0
    if argv[:1] == ['imbalance'] and len(argv) > 1:
        print(f'{measured_imbalance(argv[1:]):.4f}')
        return 0
    if argv[:1] == ['report'] and len(argv) == 5:
        return report(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main())
