"""mpi_scripts/sim_report.py against hand-computable inputs: the speed scaling, the dispatch rows'
statistic, the measured figure's interval over the launches and whether the prediction lies in
it, and the report's pass/fail against its tolerance (end to end with a stand-in pwm_sim)."""
import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import unittest

import sim_report


def profile():
    return {'kernels': {'fwd_us_per_gflop': 10.0, 'bwd_us_per_gflop': 20.0, 'opt_us_per_param': 0.5,
                        'contention': [[2, 1.3]], 'rates': [{'tokens': 128, 'fwd_us_per_gflop': 1.0, 'bwd_us_per_gflop': 2.0}]},
            'dispatch': {'call_us': 3.0, 'node_us': 1.0, 'fetch_rtt_us': 7.0, 'train_node_us': 4.0},
            'measured': {'speed_probe': {'kind': 'model_step', 'gflops_1': 200.0}}}


class ScaleProfile(unittest.TestCase):
    def test_costs_scale_by_calibration_over_now(self):
        # Probes median 100 against 200 at calibration: the machine is half as fast, costs x2.
        p = sim_report.scale_profile(profile(), [90.0, 110.0, 100.0])
        self.assertEqual(p['scaled'], {'probe_now': 100.0, 'kernel_factor': 2.0})
        self.assertEqual((p['kernels']['fwd_us_per_gflop'], p['kernels']['bwd_us_per_gflop'], p['kernels']['opt_us_per_param']),
                         (20.0, 40.0, 1.0))
        self.assertEqual(p['kernels']['rates'][0], {'tokens': 128, 'fwd_us_per_gflop': 2.0, 'bwd_us_per_gflop': 4.0})
        self.assertEqual((p['dispatch']['call_us'], p['dispatch']['node_us'], p['dispatch']['train_node_us']), (6.0, 2.0, 8.0))
        # Not the fetch round trip, the contention factors, or fields the profile lacks.
        self.assertEqual(p['dispatch']['fetch_rtt_us'], 7.0)
        self.assertEqual(p['kernels']['contention'], [[2, 1.3]])
        self.assertNotIn('msg_us', p['dispatch'])

    def test_the_static_node_cost_scales_its_step_cost_not(self):
        prof = profile() | {'static': {'node_us': 3.0, 'step_us': 40.0, 'exec_us': 0.5, 'run_us': 20.0}}
        p = sim_report.scale_profile(prof, [100.0])
        self.assertEqual(p['static'], {'node_us': 6.0, 'step_us': 40.0, 'exec_us': 1.0, 'run_us': 20.0})

    def test_unchanged_without_probes_or_a_calibration_probe(self):
        self.assertEqual(sim_report.scale_profile(profile(), []), profile())
        p = profile()
        del p['measured']
        self.assertEqual(sim_report.scale_profile(p, [100.0]), {k: v for k, v in profile().items() if k != 'measured'})

    def test_scale_command_reads_the_first_field_of_each_probe_line(self):
        with tempfile.TemporaryDirectory() as d:
            src, probes, out = (os.path.join(d, n) for n in ('p.json', 'probes', 'out.json'))
            with open(src, 'w') as f:
                json.dump(profile(), f)
            with open(probes, 'w') as f:
                f.write('50 999\n\n50\n')
            self.assertEqual(sim_report.main(['scale', src, probes, out]), 0)
            with open(out) as f:
                self.assertEqual(json.load(f)['scaled']['kernel_factor'], 4.0)
            # Two ranks go at the slower core's pace: core 1's 25 against core 0's 50 on every line.
            with open(probes, 'w') as f:
                f.write('50 25\n100 25\n25\n')
            self.assertEqual(sim_report.read_probes(probes, 2), [25.0, 25.0, 25.0])
            self.assertEqual(sim_report.read_probes(probes), [50.0, 100.0, 25.0])
            self.assertEqual(sim_report.main(['scale', src, probes, out, '2']), 0)
            with open(out) as f:
                self.assertEqual(json.load(f)['scaled']['kernel_factor'], 8.0)


class Imbalance(unittest.TestCase):
    def test_median_of_the_step_lines_device_imbalance_or_one(self):
        with tempfile.TemporaryDirectory() as d:
            a, b, dense = (os.path.join(d, n) for n in ('a.jsonl', 'b.jsonl', 'dense.jsonl'))
            step = lambda s, x: json.dumps({'step': s, 'loss': 5.0, 'moe': {'device_max_mean': x}})
            with open(a, 'w') as f:  # steps 1.2 and 1.4; a validation line and the final line ignored
                f.write('\n'.join([step(0, 1.2), json.dumps({'step': 0, 'val_loss': 5.1}), step(1, 1.4), json.dumps({'final': True})]) + '\n')
            with open(b, 'w') as f:
                f.write(step(0, 1.3) + '\n')
            with open(dense, 'w') as f:
                f.write(json.dumps({'step': 0, 'loss': 5.0}) + '\n')
            self.assertAlmostEqual(sim_report.measured_imbalance([a, b]), 1.3)
            self.assertEqual(sim_report.measured_imbalance([dense]), 1.0)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(sim_report.main(['imbalance', a, b]), 0)
            self.assertEqual(out.getvalue(), '1.3000\n')


class Rows(unittest.TestCase):
    def test_spread(self):
        self.assertAlmostEqual(sim_report.spread([9.0, 12.0, 10.0]), 0.3)
        self.assertEqual(sim_report.spread([]), 0.0)

    def test_errors_within_and_passed(self):
        rows = sim_report.add_errors([{'measured': 100.0, 'predicted': 105.0}, {'measured': 100.0, 'predicted': 90.0},
                                      {'measured': 100.0, 'predicted': 111.0},
                                      {'measured': 10.0, 'predicted': 10.0, 'measured_tok_s': 200.0, 'predicted_tok_s': 150.0}])
        self.assertEqual([r['error'] for r in rows], [0.05, -0.1, 0.11, 0.0])
        self.assertEqual(rows[3]['tok_error'], -0.25)
        self.assertEqual(sim_report.within(rows), 3)       # 10% (the edge included)
        self.assertEqual(sim_report.within(rows, 0.05), 2)
        self.assertFalse(sim_report.passed(rows))
        self.assertTrue(sim_report.passed(rows, 0.2))
        self.assertFalse(sim_report.passed([]))            # nothing measured is no pass

    def test_dispatch_rows_by_the_lower_quartile_of_the_launches(self):
        with tempfile.TemporaryDirectory() as d:
            files = []
            for name, rows in (('dispatch_0_1.json', [('fused', 0, 1e6, '5'), ('fused', 0, 2.5e5, '5')]),
                               ('dispatch_0_2.json', [('fused', 0, 5e5, '5'), ('fused', 0, 2e5, '5'), ('fused', 4, 1e3, '7')]),
                               ('dispatch_T_1.json', [('fused', 0, 1.0, '5'), ('fused', 100, 5e3, '6')])):
                files.append(os.path.join(d, name))
                with open(files[-1], 'w') as f:
                    json.dump({'rows': [{'mode': m, 'compute_us': t, 'computations_per_s': r, 'fig': fig,
                                         'effective_compute_us': t + 1} for m, t, r, fig in rows]}, f)
            by = sim_report.group_dispatch(files)
            # Fig. 7 rows and the T = 0 rows of a T > 0 launch are left out.
            self.assertEqual(sorted(by), [('fused', 0), ('fused', 100)])
            self.assertEqual(len(by[('fused', 0)]), 4)
            asked = []
            rows = sim_report.dispatch_rows(by, lambda eff: asked.append(eff) or {'fused': 2.5e5})
            self.assertEqual(asked, [1, 101])   # the launches' effective T
            # A mode the prediction lacks (dispatch_bench's static row, a profile from before it) is left out.
            self.assertEqual(sim_report.dispatch_rows(by, lambda eff: {'spmd': 1e6}), [])
            # 1, 4, 2, 5 us per computation: sorted 1, 2, 4, 5, element 4 // 4 = 1.
            self.assertEqual(rows[0]['config'], 'fig5_fused_T0')
            self.assertEqual((rows[0]['measured'], rows[0]['predicted'], rows[0]['unit']), (2.0, 4.0, 'us/comp'))
            self.assertEqual(rows[1]['measured'], 200.0)
            # The lower quartile's interval over 4 launches: B ~ Bin(4, 1/4) below it, P(B = 0) =
            # 81/256 is more than a tail, so min and max, covering P(1 <= B <= 3) = 174/256.
            self.assertEqual((rows[0]['interval'], rows[0]['coverage'], rows[0]['inside']), ([1.0, 5.0], 174 / 256, True))
            # One launch: no interval.
            self.assertEqual((rows[1]['interval'], rows[1]['coverage'], rows[1]['inside']), (None, None, None))

    def test_interval_of_the_median_or_the_lower_quartile_and_the_prediction_in_it(self):
        # Five launches: the median's interval is their min and max, 1 - 2/32.
        self.assertEqual(sim_report.interval_fields([10.0, 12.0, 11.0, 10.5, 11.5], 12.5),
                         {'interval': [10.0, 12.0], 'coverage': 30 / 32, 'inside': False})
        self.assertTrue(sim_report.interval_fields([10.0, 12.0, 11.0, 10.5, 11.5], 12.0)['inside'])  # the edge is in
        # Eleven launches, the lower quartile: the minimum and the 6th (measure.quantile_interval).
        launches = [11.0, 3.0, 9.0, 1.0, 7.0, 5.0, 10.0, 2.0, 8.0, 4.0, 6.0]
        f = sim_report.interval_fields(launches, 6.5, quantile=0.25)
        self.assertEqual((f['interval'], f['inside']), ([1.0, 6.0], False))
        self.assertAlmostEqual(f['coverage'], 3873177 / 4 ** 11)
        self.assertTrue(sim_report.interval_fields(launches, 1.0, quantile=0.25)['inside'])  # the minimum, the edge

    def test_inside_counts_rows_with_an_interval(self):
        rows = [{'inside': True}, {'inside': False}, {'inside': None}, {}]
        self.assertEqual(sim_report.inside(rows), (1, 2))
        self.assertEqual(sim_report.interval_text({'interval': [1.0, 2.5], 'coverage': 0.75}), '1.000-2.500 (75%)')
        self.assertEqual(sim_report.interval_text({'interval': None}), 'one launch')


FAKE_SIM = """#!{python}
import json
print("a line before the result")
print(json.dumps({{"spmd": 1e6, "fused": {fused}, "chained": 1e5, "opbyop": 1e5}}))
"""


class Report(unittest.TestCase):
    """report() end to end: one trainer configuration and one dispatch point, the exit code by
    whether both are within 10%."""

    def run_report(self, fused_rate):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = tmp.name
        w, out = os.path.join(d, 'w'), os.path.join(d, 'out')
        os.mkdir(w); os.mkdir(out)
        sim = os.path.join(d, 'pwm_sim')
        with open(sim, 'w') as f:
            f.write(FAKE_SIM.format(python=sys.executable, fused=fused_rate))
        os.chmod(sim, os.stat(sim).st_mode | stat.S_IXUSR)
        for r, (ms, tok) in enumerate(((10.0, 1000.0), (12.0, 900.0), (11.0, 950.0)), 1):
            with open(os.path.join(w, f'spmd_{r}.jsonl'), 'w') as f:
                f.write(json.dumps({'step': 1}) + '\n' + json.dumps({'final': True, 'step_ms_p50': ms, 'tokens_per_s': tok}) + '\n')
        with open(os.path.join(w, 'spmd.pred'), 'w') as f:
            f.write('noise\n' + json.dumps({'step_ms': 11.5, 'tokens_per_s': 900.0}) + '\n')
        with open(os.path.join(w, 'spmd.profile.json'), 'w') as f:
            json.dump({'scaled': {'probe_now': 100.0, 'kernel_factor': 1.25}}, f)
        with open(os.path.join(w, 'list'), 'w') as f:
            f.write(f"spmd {w}/spmd.pred {w}/spmd_1.jsonl {w}/spmd_2.jsonl {w}/spmd_3.jsonl\n")
        with open(os.path.join(w, 'dispatch_0_1.json'), 'w') as f:
            json.dump({'rows': [{'mode': 'fused', 'compute_us': 0, 'computations_per_s': 5e5, 'fig': '5'}]}, f)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            code = sim_report.report(w, out, os.path.join(d, 'none.json'), sim)
        with open(os.path.join(out, 'validation.json')) as f:
            doc = json.load(f)
        # The table, without what the plot printed after it.
        return code, [l for l in stdout.getvalue().splitlines() if not l.startswith('wrote ')], doc

    def test_all_within_passes(self):
        code, lines, doc = self.run_report(fused_rate=4.8e5)  # 2.0833 us against 2.0 measured: +4.2%
        self.assertEqual(code, 0)
        trainer, fused = doc['rows']
        self.assertEqual((trainer['measured'], trainer['predicted'], trainer['measured_tok_s']), (11.0, 11.5, 950.0))
        self.assertAlmostEqual(trainer['error'], 0.5 / 11)
        self.assertAlmostEqual(fused['error'], 1 / 24)
        self.assertIn('speed x1.25', lines[1])
        # Three launches 10, 12, 11 ms: the median's interval is min and max, 1 - 2/8 = 75%;
        # 11.5 predicted lies inside. The dispatch point had one launch: no interval.
        self.assertEqual((trainer['interval'], trainer['coverage'], trainer['inside']), ([10.0, 12.0], 0.75, True))
        self.assertIn(' 10.000-12.000 (75%) ', lines[1])
        self.assertIn(' inside ', lines[1])
        self.assertIsNone(fused['inside'])
        self.assertIn(' one launch ', lines[2])
        self.assertTrue(lines[-2].startswith('2/2 within 10% (2 within 5%); 1/1 predictions inside the measured interval; load '),
                        lines[-2])
        # One training-step row (+4.5%); both rows good; no size_* row.
        self.assertEqual(lines[-1], 'training-step rows: median signed error +4.5%; 2/2 rows within 10% or inside their '
                                    'interval; largest size: no size_* row')
        self.assertEqual(doc['acceptance']['good'], 2)

    def test_one_outside_fails(self):
        code, lines, doc = self.run_report(fused_rate=4e5)  # 2.5 us against 2.0: +25%
        self.assertEqual(code, 1)
        self.assertAlmostEqual(doc['rows'][1]['error'], 0.25)
        self.assertTrue(lines[-2].startswith('1/2 within 10% (1 within 5%); 1/1 predictions inside'), lines[-2])
        # The dispatch row misses by 25% and has no interval: not good.
        self.assertEqual(doc['acceptance']['good'], 1)


class Goodput(unittest.TestCase):
    def test_goodput_row_against_daly_at_the_runs_own_times(self):
        # 10 steps in 10 s fault-free: 1 s a step; a checkpoint every 2 steps (tau 2 s); MTBF 10 s;
        # detection 0.4 + restart 0.6 = 1 s. Predicted 2 / (10 e^0.1 (e^0.2 - 1)) = 0.81737.
        doc = {'mtbf_s': 10.0, 'steps': 10, 'ckpt_every': 2,
               'rows': [{'trainer': 'spmd', 'goodput': 0.75, 'free': {'wall_s': 10.0},
                         'median_recovery': {'detect_s': 0.4, 'restart_s': 0.6}}]}
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, 'failure_bench.json')
            with open(p, 'w') as f:
                json.dump(doc, f)
            (r,) = sim_report.goodput_rows(p)
        self.assertEqual((r['config'], r['unit'], r['measured'], r['inside']), ('goodput_spmd', 'goodput', 0.75, None))
        self.assertAlmostEqual(r['predicted'], 0.817366, places=5)
        # With the faulty run's count (2 faults): each costs the restart, 1 s, and the training the
        # fault cut, 10 - 2 / (e^0.2 - 1) = 0.96669 s: 10 / (10 + 2 x 1.96669) = 0.717702.
        doc['rows'][0]['faulty'] = {'faults': 2}
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, 'failure_bench.json')
            with open(p, 'w') as f:
                json.dump(doc, f)
            (r,) = sim_report.goodput_rows(p)
        self.assertAlmostEqual(r['predicted'], 0.717702, places=5)


class Acceptance(unittest.TestCase):
    def rows(self):
        # Step errors -6%, +2%, +4% (median +2%); a dispatch row +20% inside its interval; a
        # size row of more parameters +12% outside.
        return [{'config': 'spmd_dp1', 'unit': 'ms/step', 'error': -0.06, 'inside': False},
                {'config': 'size_30m_dp1', 'unit': 'ms/step', 'error': 0.02, 'params': 30, 'inside': None},
                {'config': 'size_100m_dp1', 'unit': 'ms/step', 'error': 0.12, 'params': 100, 'inside': False},
                {'config': 'size_4m_dp1', 'unit': 'ms/step', 'error': 0.04, 'params': 4, 'inside': True},
                {'config': 'fig5_spmd_T0', 'unit': 'us/comp', 'error': 0.20, 'inside': True}]

    def test_median_good_and_largest(self):
        a = sim_report.acceptance(self.rows())
        self.assertAlmostEqual(a['median_step_error'], 0.03)  # the mean of the middle two of 4
        self.assertEqual((a['good'], a['rows']), (4, 5))
        self.assertEqual(a['largest']['config'], 'size_100m_dp1')
        self.assertAlmostEqual(a['largest']['error'], 0.12)
        self.assertEqual(sim_report.acceptance_line(a), 'training-step rows: median signed error +3.0%; 4/5 rows within '
                                                        '10% or inside their interval; largest size: size_100m_dp1 +12.0%')

    def test_no_step_row(self):
        a = sim_report.acceptance([{'config': 'fig5_spmd_T0', 'unit': 'us/comp', 'error': 0.0}])
        self.assertIsNone(a['median_step_error'])
        self.assertIsNone(a['largest'])
        self.assertIn('median signed error n/a', sim_report.acceptance_line(a))


if __name__ == '__main__':
    unittest.main()
