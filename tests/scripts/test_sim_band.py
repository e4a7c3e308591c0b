"""mpi_scripts/sim_band.py against hand-computable inputs: the band of the validation rows' errors,
selected by name, and the range a projected time, rate or ratio takes over it."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import sim_band


def rows():
    # Errors: +10%, -20%, +25%, 0.
    return [{'config': 'spmd_dp1', 'predicted': 11.0, 'measured': 10.0},
            {'config': 'size_30m_dp1', 'predicted': 8.0, 'measured': 10.0},
            {'config': 'size_100m_dp1', 'predicted': 5.0, 'measured': 4.0},
            {'config': 'moe_spmd_capacity', 'predicted': 3.0, 'measured': 3.0, 'error': 0.0}]


class Band(unittest.TestCase):
    def test_least_and_greatest_error(self):
        b = sim_band.error_band(rows())
        self.assertAlmostEqual(b['lo'], -0.2)
        self.assertAlmostEqual(b['hi'], 0.25)
        self.assertEqual(b['rows'], 4)

    def test_rows_by_prefix(self):
        self.assertEqual([r['config'] for r in sim_band.select(rows(), ['size_'])], ['size_30m_dp1', 'size_100m_dp1'])
        self.assertEqual(len(sim_band.select(rows(), None)), 4)
        b = sim_band.error_band(sim_band.select(rows(), ['size_']))
        self.assertAlmostEqual(b['lo'], -0.2)
        self.assertAlmostEqual(b['hi'], 0.25)

    def test_no_row_is_an_error(self):
        with self.assertRaises(ValueError):
            sim_band.error_band([])

    def test_time_rate_and_ratio_ranges(self):
        b = {'lo': -0.2, 'hi': 0.25}
        # A time predicted 10 would measure 10 / 1.25 = 8 to 10 / 0.8 = 12.5.
        lo, hi = sim_band.time_range(10.0, b)
        self.assertAlmostEqual(lo, 8.0)
        self.assertAlmostEqual(hi, 12.5)
        # A rate predicted 100: 80 to 125.
        lo, hi = sim_band.rate_range(100.0, b)
        self.assertAlmostEqual(lo, 80.0)
        self.assertAlmostEqual(hi, 125.0)
        # A ratio predicted 1: 0.8 / 1.25 = 0.64 to 1.25 / 0.8 = 1.5625.
        lo, hi = sim_band.ratio_range(1.0, b)
        self.assertAlmostEqual(lo, 0.64)
        self.assertAlmostEqual(hi, 1.5625)

    def test_load_band_falls_back_and_names_its_rows(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, 'validation.json')
            with open(p, 'w') as f:
                json.dump({'rows': rows()}, f)
            b = sim_band.load_band(p, ['goodput_'], fallback=['size_'])
            self.assertEqual(b['from'], ['size_100m_dp1', 'size_30m_dp1'])
            with self.assertRaises(ValueError):
                sim_band.load_band(p, ['goodput_'])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(sim_band.main([p, 'moe_']), 0)
            self.assertEqual(json.loads(out.getvalue())['rows'], 1)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(sim_band.main([os.path.join(d, 'missing.json')]), 1)
            self.assertEqual(len(err.getvalue().strip().splitlines()), 1)


if __name__ == '__main__':
    unittest.main()
