"""mpi_scripts/spmd_report.py on hand-made metrics of two rounds: MFU against the highest peak seen
for the rank count, the weak-scaling efficiency and the ratios to the peers, paired by round."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import spmd_report


class SpmdReport(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.d = self.tmp.name
        # 1e9 FLOP per token; start-up peaks of 10 GFLOP/s per rank.
        # Round 2 ran on a machine half as fast: every figure halves, no ratio moves.
        for name, ranks, tok in (('dp1', 1, 5.0), ('dp2', 2, 9.0), ('dp2_b4m_overlap', 2, 8.0), ('dp2_b4m_nooverlap', 2, 6.4),
                                 ('dp2_fp32', 2, 9.0), ('dp2_bf16', 2, 12.0)):
            for k, speed in ((1, 1.0), (2, 0.5)):
                with open(os.path.join(self.d, f'spmd_{name}.r{k}.jsonl'), 'w') as f:
                    f.write(json.dumps({'ranks': ranks, 'peak_gflops_per_rank': 10.0, 'flops_per_token': 1e9}) + '\n')
                    f.write(json.dumps({'final': True, 'tokens_per_s': tok * speed, 'step_ms_p50': 100.0,
                                        'comm_share': 0.1}) + '\n')

    def test_mfu_against_the_highest_peak_for_the_rank_count(self):
        # One rank: the alone figures (16 before, 12 after) beat the start-up 10.
        self.assertEqual(spmd_report.mfu(self.d, 'dp1.r1', [[16.0, 8.0], [12.0, 9.0]]), (5.0 / 16.0, 16.0))
        # Two ranks: the every-core figures (8, 9) do not: 9 tokens/s x 1 GFLOP / (2 x 10 GFLOP/s).
        self.assertEqual(spmd_report.mfu(self.d, 'dp2.r1', [[16.0, 8.0], [12.0, 9.0]]), (0.45, 10.0))

    def test_per_round(self):
        self.assertEqual(spmd_report.per_round(['fp32=4.5,2.25', 'bf16=']), {'fp32': [4.5, 2.25], 'bf16': []})

    def test_mfu_against_the_peak_the_run_ended_with(self):
        # The final line's peak (the run's highest probe, or its fastest step) above every other.
        with open(os.path.join(self.d, 'spmd_dp2.r1.jsonl'), 'w') as f:
            f.write(json.dumps({'ranks': 2, 'peak_gflops_per_rank': 3.0, 'flops_per_token': 1e9}) + '\n')
            f.write(json.dumps({'final': True, 'tokens_per_s': 9.0, 'peak_gflops_per_rank': 4.5,
                                'step_ms_p50': 100.0, 'comm_share': 0.1}) + '\n')
        self.assertEqual(spmd_report.mfu(self.d, 'dp2.r1', [[4.0, 2.0], [4.0, 2.0]]), (1.0, 4.5))

    def test_summary(self):
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            spmd_report.main([self.d, '2', '3.0,1.5', '16 8', '12 9', 'fp32=4.5,2.25', 'bf16='])
        with open(os.path.join(self.d, 'spmd_bench.json')) as f:
            doc = json.load(f)
        self.assertAlmostEqual(doc['weak_scaling_efficiency'], 0.9)    # 9 / (2 x 5), both rounds
        self.assertEqual(doc['dp2_vs_peer'], 3.0)                      # 9 / 3 and 4.5 / 1.5
        self.assertEqual(doc['dp2_vs_peer_interval']['per_round'], [3.0, 3.0])
        self.assertEqual(doc['dp2_vs_ddp']['fp32']['ratio'], 2.0)      # 9 / 4.5
        self.assertEqual(doc['dp2_vs_ddp']['bf16']['ratio'], 0.0)      # no DDP figure
        self.assertIn('dp=2 vs PyTorch peer at 2 threads: 3.000x (3.00-3.00, 50% coverage)', stdout.getvalue())
        self.assertIn('overlap on vs off (dp=2, 4 MiB buckets): 1.250x (1.25-1.25, 50% coverage)', stdout.getvalue())


if __name__ == '__main__':
    unittest.main()
