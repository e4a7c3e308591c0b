"""mpi_scripts/sim_fit.py against hand-computable inputs: the fits recover the parameters that
generated their data, and the bounds hold where the data leaves the physical range."""
import json
import os
import tempfile
import unittest

import sim_fit


class Statistics(unittest.TestCase):
    def test_median_odd_even_unsorted(self):
        self.assertEqual(sim_fit.med([3, 1, 2]), 2)
        self.assertEqual(sim_fit.med([4, 1, 3, 2]), 2.5)
        self.assertEqual(sim_fit.med([7]), 7)

    def test_low_quartile_is_element_len_over_4_of_the_sorted(self):
        # 11 launches: the 3rd fastest (index 2); 5: the 2nd (index 1); 1: itself.
        self.assertEqual(sim_fit.low_quartile([11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]), 3)
        self.assertEqual(sim_fit.low_quartile([5, 1, 4, 2, 3]), 2)
        self.assertEqual(sim_fit.low_quartile([4, 3, 2, 1]), 2)
        self.assertEqual(sim_fit.low_quartile([9.5]), 9.5)

    def test_med_json_takes_the_numeric_fields(self):
        ds = [{'a': 1.0, 'b': 10, 'name': 'x'}, {'a': 3.0, 'b': 30, 'name': 'y'}, {'a': 2.0, 'b': 20, 'name': 'z'}]
        self.assertEqual(sim_fit.med_json(ds), {'a': 2.0, 'b': 20})


def allreduce_rows(lat_us, us_per_byte, sizes, ring_slower_by=0.0):
    """collectives_bench rows of 2 ranks following t(S) = 2 L + S us_per_byte exactly (hd), the
    ring slower by a fixed amount, and `auto` at 4 bytes taking 2 L + 4 us_per_byte."""
    rows = []
    for s in sizes:
        t = 2 * lat_us + s * us_per_byte
        rows.append({'op': 'allreduce', 'algo': 'hd', 'bytes': s, 'time_us': t})
        rows.append({'op': 'allreduce', 'algo': 'ring', 'bytes': s, 'time_us': t + ring_slower_by})
        rows.append({'op': 'allreduce', 'algo': 'auto', 'bytes': s, 'time_us': t + 50})
    return rows


class FitLink(unittest.TestCase):
    SIZES = [4, 64, 1024, 16384, 65536, 262144, 1 << 20]

    def test_a_line_through_known_points(self):
        # L = 5 us, 0.001 us/byte = 1 GB/s; the ring 3 us slower everywhere: hd's points are kept.
        link = sim_fit.fit_link(allreduce_rows(5.0, 0.001, self.SIZES, ring_slower_by=3.0))
        self.assertAlmostEqual(link['gbytes_per_s'], 1.0, places=9)
        # The intercept gives 2 L = 10, so L = 5; auto's 4-byte AllReduce (60 us) is slower.
        self.assertAlmostEqual(link['latency_us'], 5.0, places=6)
        self.assertEqual(link['overhead_us'], 0.0)
        # Kept where the wire time S/2 x 0.001 >= 2 L = 10 us: S >= 20000 bytes; each message
        # (S/2 bytes) at 1 GB/s.
        curve = link['gbytes_per_s_by_bytes']
        self.assertEqual([b for b, _ in curve], [32768.0, 131072.0, 524288.0])
        for _, gbs in curve:
            self.assertAlmostEqual(gbs, 1.0, places=6)

    def test_the_faster_of_ring_and_hd_per_size(self):
        # The ring faster by 2 us at every size: its line is the fitted one (L = 4).
        link = sim_fit.fit_link(allreduce_rows(5.0, 0.001, self.SIZES, ring_slower_by=-2.0))
        self.assertAlmostEqual(link['latency_us'], 4.0, places=6)

    def test_a_faster_small_allreduce_bounds_the_latency(self):
        rows = allreduce_rows(5.0, 0.001, self.SIZES)
        rows.append({'op': 'allreduce', 'algo': 'auto', 'bytes': 8, 'time_us': 3.0})
        self.assertEqual(sim_fit.fit_link(rows)['latency_us'], 3.0)

    def test_a_negative_intercept_takes_the_small_allreduce(self):
        rows = allreduce_rows(-1.0, 0.001, self.SIZES)  # 2 L = -2: no physical intercept
        rows.append({'op': 'allreduce', 'algo': 'auto', 'bytes': 4, 'time_us': 7.0})
        self.assertEqual(sim_fit.fit_link(rows)['latency_us'], 7.0)


class Kernels(unittest.TestCase):
    def test_step_overhead_line(self):
        # ov(M) = 100 + 20 (M - 1) at M = 1, 2, 4.
        step, mb = sim_fit.fit_step_overhead([1, 2, 4], [100.0, 120.0, 160.0])
        self.assertAlmostEqual(step, 100.0)
        self.assertAlmostEqual(mb, 20.0)

    def test_step_overhead_negative_slope_is_held_at_zero(self):
        step, mb = sim_fit.fit_step_overhead([1, 2, 4], [160.0, 120.0, 100.0])
        self.assertEqual(mb, 0.0)
        self.assertAlmostEqual(step, 380.0 / 3)  # the mean, with no slope

    def test_rates_by_tokens_of_a_micro_batch(self):
        kmb = {mb: {'fwd_us_per_gflop': 10.0 * mb, 'bwd_us_per_gflop': 20.0 * mb} for mb in (1, 2, 4)}
        rates = sim_fit.kernel_rates(kmb, batch=8, seq_len=64)
        self.assertEqual([r['tokens'] for r in rates], [128, 256, 512])
        self.assertEqual(rates[0], {'tokens': 128, 'fwd_us_per_gflop': 40.0, 'bwd_us_per_gflop': 80.0})

    def test_width_scale_is_the_median_of_the_rounds_ratios(self):
        # Rounds at different speeds (base 100, 200, 120): the wide model 0.9, 0.8, 0.95 of each
        # forward (median 0.9) and 0.85 of each backward; the medians' ratio would be 190/120.
        base = [{'fwd_us_per_gflop': x, 'bwd_us_per_gflop': x} for x in (100.0, 200.0, 120.0)]
        wide = [{'fwd_us_per_gflop': b['fwd_us_per_gflop'] * f, 'bwd_us_per_gflop': b['bwd_us_per_gflop'] * 0.85}
                for b, f in zip(base, (0.9, 0.8, 0.95))]
        f = sim_fit.fit_width_scale(base, wide)
        self.assertAlmostEqual(f['fwd'], 0.9)
        self.assertAlmostEqual(f['bwd'], 0.85)

    def test_width_scales_from_the_files(self):
        cal = ['--d-model', '128', '--seq-len', '64', '--batch', '8']
        wide = ['--d-model', '256', '--seq-len', '128', '--batch', '4']
        with tempfile.TemporaryDirectory() as w:
            m = sim_fit.Measurements(w, 2, 1)
            self.assertEqual(sim_fit.width_scales(m, 2, cal, wide), [])  # no launches: no factor
            for r, (b, x) in enumerate(((10.0, 9.0), (20.0, 16.0)), 1):
                for n, v in ((f'k1_1_{r}.json', b), (f'kw_{r}.json', x)):
                    with open(os.path.join(w, n), 'w') as f:
                        json.dump({'fwd_us_per_gflop': v, 'bwd_us_per_gflop': 2 * v}, f)
            ws = sim_fit.width_scales(m, 2, cal, wide)
            self.assertEqual([x['d_model'] for x in ws], [128.0, 256.0])
            self.assertEqual((ws[0]['fwd'], ws[0]['bwd']), (1.0, 1.0))
            self.assertAlmostEqual(ws[1]['fwd'], 0.85)  # median of 0.9 and 0.8
            self.assertAlmostEqual(ws[1]['bwd'], 0.85)
            with self.assertRaises(SystemExit):  # other tokens a kernel: not the width alone
                sim_fit.width_scales(m, 2, cal, ['--d-model', '256', '--seq-len', '128', '--batch', '8'])


def per_comp_times(ar, se, pe, call, node, msg, fetch, k):
    """The simulator's T = 0 formulas (sim/dispatch.cc) for 2 workers at chain k, L = ar."""
    L, X = ar, call + node + 2 * msg
    return {'spmd': ar + se,
            'fused': ar + pe + (X + L + fetch) / k,
            'chained': ar + pe + (X + (k - 1) * node + L + fetch) / k,
            'opbyop': X + (L + ar + pe + fetch) / k}


class FitDispatch(unittest.TestCase):
    C1, C2 = 64, 256

    def fit(self, truth, fused_shift=0.0):
        ts = {k: per_comp_times(**truth, k=k) for k in (self.C1, self.C2)}
        pf = {k: ts[k]['fused'] + fused_shift / k for k in ts}
        pc = {k: ts[k]['chained'] + fused_shift / k for k in ts}
        po = {k: ts[k]['opbyop'] for k in ts}
        po1 = po[self.C1] - truth['msg']  # one worker: one run message less
        return sim_fit.fit_dispatch(ts[self.C2]['spmd'], truth['ar'], self.C1, self.C2, pf, pc, po, po1)

    def test_recovers_the_costs_with_a_fetch(self):
        truth = dict(ar=1.0, se=0.5, pe=0.2, call=3.5, node=0.5, msg=1.0, fetch=2.0)
        d = self.fit(truth)
        for field, want in (('spmd_exec_us', 0.5), ('program_exec_us', 0.2), ('call_us', 3.5), ('node_us', 0.5),
                            ('msg_us', 1.0), ('fetch_rtt_us', 2.0)):
            self.assertAlmostEqual(d[field], want, places=9, msg=field)
        self.assertEqual(d['exec_us'], 0.0)
        self.assertEqual(d['step_kernel_us'], 0.0)

    def test_a_fused_line_below_opbyop_gives_no_fetch(self):
        # The fused constant 4 us too low (X + L + F = 5.5 where X = 6.5): X stays OpByOp's, F = 0.
        truth = dict(ar=1.0, se=0.5, pe=0.2, call=4.0, node=0.5, msg=1.0, fetch=0.0)
        d = self.fit(truth, fused_shift=-4.0)
        self.assertEqual(d['fetch_rtt_us'], 0.0)
        self.assertAlmostEqual(d['call_us'] + d['node_us'] + 2 * d['msg_us'], 6.5, places=9)

    def test_an_spmd_chain_below_the_allreduce_costs_nothing(self):
        truth = dict(ar=1.0, se=-0.3, pe=0.2, call=3.5, node=0.5, msg=1.0, fetch=2.0)
        self.assertEqual(self.fit(truth)['spmd_exec_us'], 0.0)

    def test_per_comp_is_the_low_quartile_of_the_launches(self):
        # 5 launches at 1e6, 5e5, 2.5e5, 2e5, 1e5 computations/s: 1, 2, 4, 5, 10 us; the 2nd fastest.
        ds = [{'rows': [{'mode': 'fused', 'compute_us': 0, 'computations_per_s': r},
                        {'mode': 'fused', 'compute_us': 100, 'computations_per_s': 1.0}]}
              for r in (2.5e5, 1e6, 1e5, 5e5, 2e5)]
        self.assertEqual(sim_fit.per_comp(ds, 'fused', 0), 2.0)
        self.assertIsNone(sim_fit.rate(ds[0]['rows'], 'opbyop', 0))


class FitTrainers(unittest.TestCase):
    def test_contention_factor(self):
        pred = {'step_ms': 10.0, 'compute_ms': 4.0}
        self.assertEqual(sim_fit.contention_factor(14.0, pred), 2.0)  # (14 - 6) / 4
        self.assertEqual(sim_fit.contention_factor(9.0, pred), 1.0)   # 0.75, held at 1 (never faster than one rank)

    def test_three_ranks_two_points(self):
        # excess = K + f3 compute: K = 2, f3 = 1.5 at compute 8 and 4.
        self.assertEqual(sim_fit.fit_three_ranks(1.0, 14.0, 8.0, 8.0, 4.0), (1.5, 2.0))

    def test_three_ranks_below_the_two_rank_factor(self):
        # f3 = 1.5 < f2 = 2: f3 = 2 and K the mean of 20 - 16 and 14 - 8.
        self.assertEqual(sim_fit.fit_three_ranks(2.0, 20.0, 8.0, 14.0, 4.0), (2.0, 5.0))

    def test_three_ranks_negative_constant(self):
        # f3 = 1.5, K = -2: K = 0 and f3 = 10 / 8.
        self.assertEqual(sim_fit.fit_three_ranks(1.0, 10.0, 8.0, 4.0, 4.0), (1.25, 0.0))

    def test_node_costs_two_points(self):
        self.assertEqual(sim_fit.fit_node_costs([35.0, 65.0], [10, 20]), (3.0, 5.0))

    def test_node_costs_bounds(self):
        self.assertEqual(sim_fit.fit_node_costs([65.0, 35.0], [10, 20]), (0.0, 50.0))
        self.assertEqual(sim_fit.fit_node_costs([10.0, 40.0], [10, 20]), (1.5, 0.0))

    def test_static_costs_two_points(self):
        # The static chained step predicted without its costs: 10 ms with 20 nodes, 10.5 ms with 36;
        # measured 10.1 and 10.65: excess 100 and 150 us = step + nodes node, node 3.125, step 37.5.
        preds = [{'step_ms': 10.0, 'nodes': 20}, {'step_ms': 10.5, 'nodes': 36}]
        got = sim_fit.fit_static([10.1, 10.65], preds)
        self.assertAlmostEqual(got['node_us'], 3.125)
        self.assertAlmostEqual(got['step_us'], 37.5)

    def test_static_costs_bounds(self):
        # Excess 100 us with 20 nodes and 60 with 36: the node cost held at 0, the step the mean.
        preds = [{'step_ms': 10.0, 'nodes': 20}, {'step_ms': 10.0, 'nodes': 36}]
        got = sim_fit.fit_static([10.1, 10.06], preds)
        self.assertEqual(got['node_us'], 0.0)
        self.assertAlmostEqual(got['step_us'], 80.0)


def write_finals(w, prefix, values):
    """PREFIX_<r>.jsonl, r = 1.., each with one final record of step_ms_p50 = the value."""
    for r, ms in enumerate(values, 1):
        with open(os.path.join(w, f'{prefix}_{r}.jsonl'), 'w') as f:
            f.write(json.dumps({'final': True, 'step_ms_p50': ms}) + '\n')


class CallCost(unittest.TestCase):
    def test_the_cost_that_makes_the_opbyop_prediction_the_measurement(self):
        # 24 calls a step on top of a 10 ms step: measured 13.6 ms -> 150 us a call.
        pred = lambda c: 10.0 + 24 * c * 1e-3
        self.assertAlmostEqual(sim_fit.fit_call_cost(13.6, pred), 150.0, delta=0.02)
        self.assertEqual(sim_fit.fit_call_cost(9.0, pred), 0.0)  # already predicted slower: no cost
        self.assertEqual(sim_fit.fit_call_cost(1e9, pred, cap=1000.0), 1000.0)
        # A controller-bound step: nothing until the calls outlast the devices' 10 ms, then per call.
        bound = lambda c: max(10.0, 24 * (c + 300) * 1e-3)
        self.assertAlmostEqual(sim_fit.fit_call_cost(12.0, bound), 200.0, delta=0.02)


class StaticSection(unittest.TestCase):
    def test_fitted_from_the_median_launches_against_the_static_prediction(self):
        with tempfile.TemporaryDirectory() as w:
            write_finals(w, 'ms', [10.3, 10.1, 10.2])     # median 10.2
            write_finals(w, 'ms2', [10.8, 10.7, 10.75])   # median 10.75
            calls = []

            def predict(prof, *extra):
                calls.append((dict(prof['static']), extra))
                return {'step_ms': 10.0, 'nodes': 20} if '--microbatches' not in extra else {'step_ms': 10.5, 'nodes': 36}
            prof = {}
            chain = {'exec_us': 0.5, 'run_us': 20.0}
            got = sim_fit.static_section(sim_fit.Measurements(w, 3, 1), predict, prof, chain)
            self.assertEqual(got, [10.2, 10.75])
            # Predicted as the static model's chained step with both costs 0; excess 200 and 250 us.
            self.assertEqual([c[0] for c in calls], [{'node_us': 0.0, 'step_us': 0.0, 'exec_us': 0.5, 'run_us': 20.0}] * 2)
            self.assertEqual((prof['static']['exec_us'], prof['static']['run_us']), (0.5, 20.0))
            self.assertTrue(all(('--mpmd', 'static') == c[1][2:4] and c[1][:2] == ('--granularity', 'chained') for c in calls))
            self.assertAlmostEqual(prof['static']['node_us'], 3.125)
            self.assertAlmostEqual(prof['static']['step_us'], 137.5)

    def test_absent_without_mpmd_train_launches(self):
        with tempfile.TemporaryDirectory() as w:
            prof = {'dispatch': {}}
            self.assertIsNone(sim_fit.static_section(sim_fit.Measurements(w, 3, 1), None, prof, {'exec_us': 0, 'run_us': 0}))
            self.assertEqual(prof, {'dispatch': {}})
            write_finals(w, 'ms', [10.0])
            self.assertIsNone(sim_fit.static_section(sim_fit.Measurements(w, 1, 1), None, prof, None))  # no static chain
            self.assertEqual(prof, {'dispatch': {}})

    def test_static_chain_line_in_one_over_k(self):
        # ar 1, exec 0.5, run 32: 1.5 + 0.5 = 2.0 us at 64, 1.5 + 0.125 at 256.
        got = sim_fit.fit_static_chain(1.0, 64, 256, {64: 2.0, 256: 1.625})
        self.assertAlmostEqual(got['run_us'], 32.0)
        self.assertAlmostEqual(got['exec_us'], 0.5)

    def test_static_chain_bounds(self):
        # Slower at the longer chain: run held at 0, exec the mean less ar; below ar: exec 0.
        got = sim_fit.fit_static_chain(1.0, 64, 256, {64: 1.5, 256: 1.7})
        self.assertEqual(got['run_us'], 0.0)
        self.assertAlmostEqual(got['exec_us'], 0.6)
        self.assertEqual(sim_fit.fit_static_chain(3.0, 64, 256, {64: 2.0, 256: 1.625})['exec_us'], 0.0)


class Files(unittest.TestCase):
    def test_final_is_the_median_launch_of_the_last_final_records(self):
        with tempfile.TemporaryDirectory() as w:
            for r, ms in ((1, 12.0), (2, 10.0), (3, 11.0)):
                with open(os.path.join(w, f'mf_{r}.jsonl'), 'w') as f:
                    f.write(json.dumps({'step': 1}) + '\n\n')
                    f.write(json.dumps({'final': True, 'step_ms_p50': 99.0}) + '\n')
                    f.write(json.dumps({'final': True, 'step_ms_p50': ms}) + '\n')
            m = sim_fit.Measurements(w, 3, 1)
            self.assertEqual(m.final('mf'), {'step_ms_p50': 11.0})
            self.assertIsNone(m.load('c_inter.json'))

    def test_each_launch_is_brought_to_the_reference_speed_by_its_rounds_probe(self):
        # 2 launches a phase, 3 phases: probes 100, 50 | 100, 100 | 200, 100; the reference is their
        # median, 100. Phase 0's second round ran at half speed: its costs count half.
        self.assertEqual(sim_fit.round_factors([100, 50, 100, 100, 200, 100], 2), [[1.0, 0.5], [1.0, 1.0], [2.0, 1.0]])
        self.assertEqual(sim_fit.round_factors([100, 50], 2), [[1.0, 1.0]] * 3)  # not one per round: unscaled
        with tempfile.TemporaryDirectory() as w:
            with open(os.path.join(w, 'probes'), 'w') as f:
                f.write('100 1\n50\n100\n100\n200\n100\n')
            for pre, ms in (('m2', (10.0, 20.0)), ('mf', (10.0, 20.0)), ('ms', (10.0, 20.0)), ('mh', (10.0, 20.0))):
                for r, x in enumerate(ms, 1):
                    with open(os.path.join(w, f'{pre}_{r}.jsonl'), 'w') as f:
                        f.write(json.dumps({'final': True, 'step_ms_p50': x}) + '\n')
            m = sim_fit.Measurements(w, 2, 1)
            # m2: 10 x 1 and 20 x 0.5 (the slow round's 20 ms is 10 at the reference); mf: 10 and
            # 20; ms: 20 and 20; mh (no phase: the emulated hosts' paired launches) as measured.
            self.assertEqual([m.final(p)['step_ms_p50'] for p in ('m2', 'mf', 'ms', 'mh')], [10.0, 15.0, 20.0, 15.0])
            self.assertEqual(m.factor('m1_4', 2), 0.5)
            # A launch's own probe (NAME.probe) comes before its round's: 25 against the reference 100.
            with open(os.path.join(w, 'mf_2.probe'), 'w') as f:
                f.write('25\n')
            self.assertEqual(m.factor('mf', 2), 0.25)
            self.assertEqual(m.final('mf')['step_ms_p50'], 7.5)  # 10 x 1 and 20 x 0.25
            # Core 0's then core 1's probe: a launch of 2 ranks goes at the slower core's, one rank
            # (m1, pinned to core 0) at core 0's.
            for n in ('mf_1', 'm1_1_1', 'mw_1'):
                with open(os.path.join(w, f'{n}.probe'), 'w') as f:
                    f.write('100 50\n')
            self.assertEqual((m.factor('mf', 1), m.factor('m1_1', 1), m.factor('mw', 1)), (0.5, 1.0, 1.0))
            k = sim_fit.scale_kernels({'fwd_us_per_gflop': 10.0, 'step_overhead_us': 4.0, 'from': {'x': 1}}, 0.5)
            self.assertEqual(k, {'fwd_us_per_gflop': 5.0, 'step_overhead_us': 2.0, 'from': {'x': 1}})

    def test_paired_is_the_median_of_the_rounds_differences(self):
        # mc 10, 16, 7 and mo 9, 18, 9: the rounds' differences -1, +2, +2 (median 2), where the
        # medians' difference is 9 - 10 = -1.
        with tempfile.TemporaryDirectory() as w:
            write_finals(w, 'mc', [10.0, 16.0, 7.0])
            write_finals(w, 'mo', [9.0, 18.0, 9.0])
            m = sim_fit.Measurements(w, 3, 1)
            self.assertEqual(m.paired('mc', 'mo'), 2.0)
            self.assertEqual(m.final('mo')['step_ms_p50'] - m.final('mc')['step_ms_p50'], -1.0)

if __name__ == '__main__':
    unittest.main()
