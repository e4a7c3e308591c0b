"""mpi_scripts/straggler_report.py on hand-made metrics: the ratio with the delay over without,
paired by round, the ratio a delay added to the step would give, a pipeline's bubble both ways."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import straggler_report


def final(tps, step=200.0, **kw):
    return {'final': True, 'tokens_per_s': tps, 'step_ms_p50': step, **kw}


class StragglerReport(unittest.TestCase):
    def write(self, d, runs):
        args = []
        for key, finals in runs.items():
            paths = []
            for k, j in enumerate(finals):
                paths.append(os.path.join(d, key.replace('/', '_') + f'.r{k}.jsonl'))
                with open(paths[-1], 'w') as f:
                    f.write(json.dumps({'step': 1}) + '\n' + json.dumps(j) + '\n')
            args.append(f"{key}={','.join(paths)}")
        return args

    def test_rows_pair_by_round_and_keep_the_bubble(self):
        with tempfile.TemporaryDirectory() as d:
            # Round 2 on a machine half as fast: the ratio stays 0.8 in both rounds.
            runs = {'spmd_dp2/0': [final(1000.0), final(500.0)], 'spmd_dp2/50': [final(800.0), final(400.0)],
                    'static_pipe2/0': [final(900.0, bubble=0.1)], 'static_pipe2/50': [final(450.0, bubble=0.4)],
                    'alone/0': [final(1.0)]}
            out = os.path.join(d, 's.json')
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                straggler_report.main([out, '50'] + self.write(d, runs))
            with open(out) as f:
                doc = json.load(f)
            rows = {r['name']: r for r in doc['rows']}
            self.assertEqual(sorted(rows), ['spmd_dp2', 'static_pipe2'])  # (alone never ran delayed)
            self.assertEqual(rows['spmd_dp2']['per_round'], [0.8, 0.8])
            self.assertEqual(rows['spmd_dp2']['added'], 200.0 / 250.0)
            self.assertEqual((rows['static_pipe2']['bubble'], rows['static_pipe2']['bubble_delayed']), (0.1, 0.4))
            self.assertIn('static_pipe2           900       450   0.500  one round: no interval   0.800    10.0%    40.0%',
                          stdout.getvalue())


if __name__ == '__main__':
    unittest.main()
