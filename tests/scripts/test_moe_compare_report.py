"""mpi_scripts/moe_compare_report.py on hand-made metrics: per-round medians from step WARM on, the
paired ratio to the reference row with its range and verdict, tokens dropped per step from the
config line, the weights against the reference, and the summary JSON."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import moe_compare_report as mcr

CONFIG = {'config': {'batch': 4, 'model': 'd_model=8 n_layers=4 seq_len=16 top_k=2 moe_every=2 experts=4'}}


def write_run(path, tokens, dropped=0.0, trips=0, weights='aa', warm_garbage=True):
    """Steps 0..3: step 0 is slow garbage (before WARM = 1), then `tokens` tokens/s."""
    with open(path, 'w') as f:
        f.write(json.dumps(CONFIG) + '\n')
        for step in range(4):
            tps = 1.0 if (step == 0 and warm_garbage) else tokens
            moe = {'dropped_share': dropped, 'padding_share': 0.25, 'max_mean_tokens': 1.5,
                   'alltoall_ms': {'median': 10.0}, 'round_trips': trips}
            f.write(json.dumps({'step': step, 'tokens_per_s': tps, 'step_ms': 100.0, 'moe': moe}) + '\n')
        f.write(json.dumps({'final': True, 'final_loss': 2.5, 'weights_hash': weights}) + '\n')


class MoeCompareReport(unittest.TestCase):
    def test_verdict(self):
        self.assertEqual(mcr.verdict('a', 'a', [0.5]), '(reference)')
        self.assertEqual(mcr.verdict('b', 'a', [0.97, 1.04, 1.0]), '1.000x, same within noise (0.97-1.04, 75% coverage)')
        self.assertEqual(mcr.verdict('b', 'a', [0.8, 0.9, 0.85]), '0.850x (0.80-0.90, 75% coverage)')
        self.assertEqual(mcr.verdict('b', 'a', [1.015]), '1.015x (one round: no interval)')

    def test_choices_per_step(self):
        with tempfile.TemporaryDirectory() as d:
            write_run(os.path.join(d, 'x.jsonl'), 10.0)
            # batch 4 x seq 16 x top-2 x (4 layers / every 2nd) = 256
            self.assertEqual(mcr.choices_per_step(os.path.join(d, 'x.jsonl')), 256)

    def test_table_and_json(self):
        with tempfile.TemporaryDirectory() as d:
            for r, (ref_tps, pw_tps) in enumerate(((1000.0, 800.0), (1100.0, 990.0)), start=1):
                write_run(os.path.join(d, f'spmd.r{r}.jsonl'), ref_tps, dropped=0.125)
                write_run(os.path.join(d, f'pw.r{r}.jsonl'), pw_tps, dropped=0.125, trips=4, weights='bb')
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                mcr.main([d, '3', '1', '2', 'spmd=spmd', 'pw=spmd'])
            text = out.getvalue()
            self.assertIn('router skew 3: 2 rounds', text)
            # ratios 0.8 and 0.9: median 0.85, outside 1 (two rounds' min and max cover the median 50%)
            self.assertIn('0.850x (0.80-0.90, 50% coverage)', text)
            self.assertIn('differ', text)
            j = json.load(open(os.path.join(d, 'moe_compare.json')))
            pw = j['rows']['pw']
            self.assertEqual(pw['tokens_per_s'], [800.0, 990.0])   # step 0 (before WARM) left out
            self.assertEqual(pw['dropped_per_step'], 0.125 * 256)
            self.assertEqual(pw['round_trips'], 4)
            self.assertAlmostEqual(pw['alltoall_share'], 0.1)
            self.assertEqual(pw['weights'], 'differ')
            self.assertEqual(j['rows']['spmd']['weights'], 'ref')

    def test_layer_costs(self):
        def run(step_ms, trips=0, a2a=0.0, wait=0.0):
            return {"step_ms": step_ms, "round_trips": trips, "alltoall_ms": a2a, "route_wait_ms": wait}
        runs = {"pw_controller": [run(120.0, 4, wait=8.0), run(140.0, 4, wait=12.0)], "pw_worker": [run(100.0), run(100.0)],
                "spmd_dropless": [run(90.0, a2a=8.0), run(90.0, a2a=12.0)]}
        c = mcr.layer_costs(runs, 2)
        self.assertEqual(c["round_trip_ms"], 7.5)            # (20 / 4 + 40 / 4) / 2
        self.assertEqual((c["round_trip_ms_min"], c["round_trip_ms_max"]), (5.0, 10.0))
        self.assertEqual(c["spmd_alltoall_ms"], 5.0)          # median 10 ms over 2 layers
        self.assertEqual(c["route_wait_ms"], 2.5)             # (8 / 4 + 12 / 4) / 2
        self.assertEqual(mcr.layer_costs({"pw_worker": []}, 2), {})

    def test_incomplete_run_is_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, 'a.r1.jsonl'), 'w') as f:
                f.write(json.dumps(CONFIG) + '\n')
            with self.assertRaises(SystemExit) as e:
                mcr.main([d, '0', '1', '1', 'a=a'])
            self.assertIn('is incomplete', str(e.exception))


if __name__ == '__main__':
    unittest.main()
