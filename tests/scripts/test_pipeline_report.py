"""mpi_scripts/pipeline_report.py on hand-made metrics: the ratio to the SPMD reference of the
same devices, the 1F1B / GPipe memory ratio, the hosts against one host, and the summary JSON."""
import contextlib
import io
import json
import math
import os
import tempfile
import unittest

import pipeline_report

MiB = 1 << 20


def pipe(tok, bubble=0.3, bound=0.2, act0=4 * MiB, **kw):
    return {'final': True, 'tokens_per_s': tok, 'bubble': bubble, 'bubble_bound': bound,
            'peak_intermediate_bytes': [act0, MiB], 'peak_store_bytes': [8 * MiB, 2 * MiB], 'stage_islands': [0, 1], **kw}


class PipelineReport(unittest.TestCase):
    def write_runs(self, d, runs):
        args = []
        for key, j in runs.items():
            path = os.path.join(d, key.replace('/', '_') + '.jsonl')
            with open(path, 'w') as f:
                f.write(json.dumps({'step': 1}) + '\n' + json.dumps({'final': True, 'tokens_per_s': -1}) + '\n' + json.dumps(j) + '\n')
            args.append(f'{key}={path}')
        return args

    def test_vs_spmd_takes_the_reference_of_the_same_devices(self):
        rows = {'spmd_dp2': {'tokens_per_s': 1000.0}, 'spmd_dp4': {'tokens_per_s': 4000.0}}
        self.assertEqual(pipeline_report.vs_spmd('S2_M4_gpipe', {'tokens_per_s': 500.0}, rows), 0.5)
        self.assertEqual(pipeline_report.vs_spmd('S2_M4_gpipe', {'tokens_per_s': 1000.0, 'stage_dp': 2}, rows), 0.25)
        self.assertTrue(math.isnan(pipeline_report.vs_spmd('S8_M4_gpipe', {'tokens_per_s': 1.0}, rows)))

    def test_rounds_pair_by_round(self):
        # Round 2 on a machine half as fast: the ratio stays 0.5 in both rounds.
        with tempfile.TemporaryDirectory() as d:
            args = []
            for key, tps in (('local/spmd_dp2', (1000.0, 500.0)), ('local/S2_M4_gpipe', (500.0, 250.0))):
                paths = []
                for k, t in enumerate(tps):
                    paths.append(os.path.join(d, f"{key.replace('/', '_')}.r{k}.jsonl"))
                    with open(paths[-1], 'w') as f:
                        f.write(json.dumps(pipe(t) if 'S2' in key else {'final': True, 'tokens_per_s': t}) + '\n')
                args.append(f"{key}={','.join(paths)}")
            res = pipeline_report.load_runs(args)
            self.assertEqual(res['local/S2_M4_gpipe']['tokens_per_s_rounds'], [500.0, 250.0])
            rows = {'spmd_dp2': res['local/spmd_dp2']}
            r = pipeline_report.vs_spmd_ratio('S2_M4_gpipe', res['local/S2_M4_gpipe'], rows)
            self.assertEqual(r.per_round, [0.5, 0.5])

    def test_report_and_summary(self):
        with tempfile.TemporaryDirectory() as d:
            runs = {'local/spmd_dp2': {'final': True, 'tokens_per_s': 1000.0},
                    'local/S2_M4_gpipe': pipe(500.0), 'local/S2_M4_1f1b': pipe(600.0, act0=2 * MiB),
                    'hosts2/S2_M4_gpipe': pipe(250.0)}
            out = os.path.join(d, 'pipeline_bench.json')
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                pipeline_report.main([out, '2', '1gbit'] + self.write_runs(d, runs))
            text = stdout.getvalue()
            # The last final record of each file is the run's.
            self.assertIn('S2_M4_gpipe                   500    0.500  one round: no interval       -                       -    30.0%   20.0%    +10.0     -   4.0 1.0 | 8.0 2.0   (islands 0,1)', text)
            self.assertIn('  S2_M4: 0.500 (2.00 / 4.00 MiB)', text)        # 1F1B / GPipe, stage 0
            self.assertIn('hosts2 (DCN 1gbit) against one host, tokens/s:\n  S2_M4_gpipe     0.500', text)
            with open(out) as f:
                doc = json.load(f)
            self.assertEqual((doc['hosts'], doc['dcn']), (2, '1gbit'))
            self.assertEqual(doc['runs']['local/S2_M4_1f1b']['tokens_per_s'], 600.0)


    def test_static_rows_pair_with_pathways(self):
        # A static row: its ratio to spmd_train's row of its devices and to pathways_train's row
        # of the same configuration, its messages; no object store, no islands.
        static = {k: v for k, v in pipe(750.0, messages_per_step=12.0).items() if k not in ('peak_store_bytes', 'stage_islands')}
        with tempfile.TemporaryDirectory() as d:
            runs = {'local/spmd_dp2': {'final': True, 'tokens_per_s': 1000.0}, 'local/S2_M4_gpipe': pipe(500.0),
                    'local/static_S2_M4_gpipe': static}
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                pipeline_report.main([os.path.join(d, 'p.json'), '0', 'unshaped'] + self.write_runs(d, runs))
            self.assertIn('static_S2_M4_gpipe            750    0.750  one round: no interval   1.500  one round: no interval'
                          '    30.0%   20.0%    +10.0    12   4.0 1.0 | -', stdout.getvalue())
        self.assertIsNone(pipeline_report.vs_pathways_ratio('S2_M4_gpipe', pipe(1.0), {}))


if __name__ == '__main__':
    unittest.main()
