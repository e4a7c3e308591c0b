#!/usr/bin/env python3
"""Projects the paper's configurations with pwm_sim (docs/simulator.md, "Projection").

    sim/project.py BUILD_DIR PROFILE [OUTDIR=results/sim] [--validation FILE=OUTDIR/validation.json]

Writes OUTDIR/projection.json and fig5_sim.png, fig6_sim.png: Fig. 5 (computations/s vs T at 16
hosts), Fig. 6 (break-even T vs hosts 2..512), PaLM's two-pod weak scaling, Table 2's pipeline (under
Pathways, and under the static model when the profile has its costs).
Every figure rests on the cluster descriptions in sim/clusters (their sources in
docs/simulator.md) and on this machine's measured dispatch costs: see the doc for what is assumed.
Each figure is printed with a band: the range the validation's signed errors (sim_validate.sh's
validation.json; mpi_scripts/sim_band.py) put around it, the dispatch rows' for Fig. 5 and 6, the
training-step rows' for PaLM and Table 2. Without a validation file the projection stops (one line).
"""
import json, os, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, 'mpi_scripts'))
import sim_band
build, profile, out, validation = sim_band.projection_args('project.py', sys.argv[1:])
try:
    band_disp = sim_band.load_band(validation, ['fig5_'])
    band_step = sim_band.load_band(validation, sim_band.STEP_ROWS)
except (OSError, ValueError, KeyError) as e:
    sys.exit(f'project.py: error: no validation band ({e}): run mpi_scripts/sim_validate.sh first, or give --validation FILE')
cl = os.path.join(root, 'sim', 'clusters')
exe = os.path.join(build, 'sim', 'pwm_sim')
if not os.access(exe, os.X_OK):
    sys.exit(f'project.py: error: no {exe}: build it first (ninja -C {build} pwm_sim_cli)')
if not os.path.isfile(profile):
    sys.exit(f'project.py: error: no profile {profile}: run mpi_scripts/sim_calibrate.sh first')
os.makedirs(out, exist_ok=True)  # the Table 2 clusters are written there before the results

def sim(*args):
    r = subprocess.run([exe, '--profile', profile, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f'project.py: pwm_sim {" ".join(args)} failed: {r.stderr.strip()}')
    return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]

res = {}
hosts = [2, 4, 8, 16, 32, 64, 128, 256, 512]
res['fig6'] = sim('--what', 'fig6', '--cluster', f'{cl}/tpu_v3_hosts.json', '--controller-alone', '--host-executors',
                  '--hosts-list', ','.join(map(str, hosts)))
ts = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]
res['fig5_16hosts'] = sim('--what', 'dispatch', '--cluster', f'{cl}/tpu_v3_hosts.json', '--workers', '64',
                          '--controller-alone', '--host-executors', '--compute-us', ','.join(map(str, ts)))
# PaLM 540B (PaLM paper, Table 1 shapes), weak scaling: one pod at batch B vs two pods at 2B.
palm = ['--d-model', '18432', '--layers', '118', '--heads', '48', '--head-dim', '256', '--d-ff', '73728',
        '--vocab', '65536', '--seq-len', '2048', '--no-overlap', '--bucket-bytes', '4000000000000']
one = sim('--what', 'step', '--cluster', f'{cl}/palm_pod.json', *palm, '--batch', '2048')[0]
two = sim('--what', 'step', '--cluster', f'{cl}/palm_2pods.json', *palm, '--batch', '4096', '--dp', '2')[0]
res['palm'] = {'one_pod': one, 'two_pods': two, 'weak_scaling': two['tokens_per_s'] / one['tokens_per_s'], 'paper': 1.95}
# Table 2: a 3B decoder-only LM on 128 TPU v3 cores (shapes assumed, docs/simulator.md).
lm3b = ['--d-model', '2560', '--layers', '32', '--heads', '32', '--head-dim', '80', '--d-ff', '10240',
        '--vocab', '32000', '--seq-len', '1024']
def table2(cluster, S, M, batch, mpmd='pathways'):
    c = json.load(open(f'{cl}/{cluster}.json'))
    c['device_gflops'] = 64 * 123000 / S  # 64 chips split over S stages (the same assumed MFU cancels in ratios)
    c['hosts'] = max(1, S // c['devices_per_host']) if cluster == 'table2_dcn' else 1
    if cluster != 'table2_dcn': c['devices_per_host'] = max(S, 1)
    path = os.path.join(out, f'_cluster_{cluster}_{S}.json')
    json.dump(c, open(path, 'w'))
    if S == 1:
        r = sim('--what', 'step', '--cluster', path, *lm3b, '--batch', str(batch), '--microbatches', '1')[0]
    else:
        r = sim('--what', 'pipeline', '--mpmd', mpmd, '--cluster', path, '--stages', str(S), '--schedule', 'gpipe', *lm3b,
                '--batch', str(batch), '--microbatches', str(M))[0]
    os.remove(path)
    return r
spmd = table2('table2_ici', 1, 1, 256)
rows = [('SPMD', spmd, 125.7), ('S=4 M=16', table2('table2_ici', 4, 16, 256), 133.7),
        ('S=16 M=64', table2('table2_ici', 16, 64, 256), 131.4), ('S=16 M=64, 4 islands DCN', table2('table2_dcn', 16, 64, 256), 131.4)]
# The same pipelines under the static model (mpmd_train: no controller, its own per-node and
# per-step costs), beside Pathways' rows; only with a profile that measured it. No paper figure.
if 'static' in json.load(open(profile)):
    rows += [(f'{n}, static', table2(cl_, S, M, 256, 'static'), None)
             for n, cl_, S, M in (('S=4 M=16', 'table2_ici', 4, 16), ('S=16 M=64', 'table2_ici', 16, 64),
                                  ('S=16 M=64, 4 islands DCN', 'table2_dcn', 16, 64))]
res['table2'] = [{'config': n, 'tokens_per_s': r['tokens_per_s'], 'relative_to_spmd': r['tokens_per_s'] / spmd['tokens_per_s'],
                  # (SPMD against itself: no band)
                  'relative_band': sim_band.ratio_range(r['tokens_per_s'] / spmd['tokens_per_s'], band_step) if r is not spmd else (1.0, 1.0),
                  'bubble': r['bubble'], 'paper_ktok_s': p, 'paper_relative': p / 125.7 if p else None} for n, r, p in rows]
res['palm']['weak_scaling_band'] = sim_band.ratio_range(res['palm']['weak_scaling'], band_step)
# The bands: a break-even T is a time the dispatch rows' errors scale like any other.
for r in res['fig6']:
    for m in ('opbyop', 'chained', 'fused'):
        r[f'{m}_break_even_band_us'] = sim_band.time_range(r[f'{m}_break_even_us'], band_disp)
res['bands'] = {'dispatch': band_disp, 'step': band_step, 'validation': validation}
json.dump(res, open(os.path.join(out, 'projection.json'), 'w'), indent=1)
bt = sim_band.band_text
print(f'Fig. 6 (projected break-even, us; {sim_band.band_note(band_disp)}):')
for r in res['fig6']:
    print(f"  hosts {r['hosts']:4d} ({r['devices']:5d} chips): " + '  '.join(
        f"{m} {r[f'{m.lower()}_break_even_us']:.0f} ({bt(*r[f'{m.lower()}_break_even_band_us'], '{:.0f}')})" for m in ('OpByOp', 'Chained', 'Fused')))
print(f"PaLM two pods: weak scaling {res['palm']['weak_scaling']:.3f}x ({bt(*res['palm']['weak_scaling_band'], '{:.3f}')}, the step rows' band; paper 1.95x); "
      f"step {one['step_ms']/1e3:.2f} s, two pods {two['step_ms']/1e3:.2f} s")
print(f'Table 2 (relative to SPMD, {sim_band.band_note(band_step)}; paper in brackets):')
for r in res['table2']:
    paper = f"({r['paper_relative']:.3f})" if r['paper_relative'] else '       '
    print(f"  {r['config']:36} {r['relative_to_spmd']:.3f} ({bt(*r['relative_band'], '{:.3f}')}) {paper}  bubble {r['bubble']:.3f}")
# Plots: gnuplot, as mpi_scripts/dispatch_plot.py draws the measured figures.
from dispatch_plot import line_plot, write_data
series = []
for m in ('opbyop', 'chained', 'fused'):
    pts = [(r['hosts'], r[f'{m}_break_even_us'] / 1e3) for r in res['fig6'] if r[f'{m}_break_even_us'] > 0]
    if not pts: continue
    data = os.path.join(out, f'_fig6_{m}.dat'); write_data(data, pts)
    series.append(f"'{data}' using 1:2 with linespoints title '{m} (projected)'")
paper = os.path.join(out, '_fig6_paper.dat'); write_data(paper, [(16, 2.3), (512, 35)])
series.append(f"'{paper}' using 1:2 with points pt 3 ps 2 title 'paper: 2.3 ms at 16 hosts, 35 ms at 512'")
line_plot(os.path.join(out, 'fig6_sim.png'), 'Projected Fig. 6: T where Pathways reaches 95% of SPMD (4 TPU v3 per host)',
          'hosts', 'break-even T (ms)', series, 'set logscale xy\nset termoption noenhanced\nset key top left')
series = []
for m in ('spmd', 'opbyop', 'chained', 'fused'):
    data = os.path.join(out, f'_fig5_{m}.dat'); write_data(data, [(r['compute_us'], r[m]) for r in res['fig5_16hosts']])
    series.append(f"'{data}' using 1:2 with linespoints title '{m}'")
line_plot(os.path.join(out, 'fig5_sim.png'), 'Projected Fig. 5: 16 hosts, 64 TPU v3, chain of 128', 'computation time T (us)',
          'computations / s', series, 'set logscale xy\nset termoption noenhanced\nset key top left')
for f in os.listdir(out):
    if f.startswith('_fig') and f.endswith('.dat'): os.remove(os.path.join(out, f))
