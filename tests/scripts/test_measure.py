"""mpi_scripts/measure.py against hand-computed values: the rounds' order, the paired ratio, the
median's (and any quantile's) order-statistic interval and its coverage, the verdict's words and the attribution."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import measure


class Order(unittest.TestCase):
    def test_odd_rounds_as_given_even_rounds_reversed(self):
        self.assertEqual(measure.order(["a", "b", "c"], 1), ["a", "b", "c"])
        self.assertEqual(measure.order(["a", "b", "c"], 2), ["c", "b", "a"])
        self.assertEqual(measure.order(["a", "b", "c"], 3), ["a", "b", "c"])


class Interval(unittest.TestCase):
    def test_coverage_is_the_binomial_tail(self):
        # n = 5, min and max: 1 - 2 (1/32); n = 8, 2nd and 7th: 1 - 2 (1 + 8)/256.
        self.assertAlmostEqual(measure._coverage(5, 1), 30 / 32)
        self.assertAlmostEqual(measure._coverage(8, 2), 1 - 18 / 256)

    def test_five_rounds_give_min_and_max(self):
        self.assertEqual(measure.median_interval([1.0, 0.9, 1.2, 1.1, 1.05]), (0.9, 1.2, 30 / 32))

    def test_eight_rounds_drop_one_at_each_end(self):
        lo, hi, cov = measure.median_interval([8, 1, 7, 2, 6, 3, 5, 4])
        self.assertEqual((lo, hi), (2, 7))
        self.assertGreaterEqual(cov, 0.9)
        # k = 3 would cover only 1 - 2 (1 + 8 + 28)/256 = 71%.
        self.assertLess(measure._coverage(8, 3), 0.9)

    def test_few_rounds_say_their_coverage_and_one_round_has_none(self):
        lo, hi, cov = measure.median_interval([1.0, 1.1, 0.95])
        self.assertEqual((lo, hi, cov), (0.95, 1.1, 0.75))
        self.assertIsNone(measure.median_interval([1.0]))
        self.assertIn("75% coverage", measure.Ratio([1.0, 1.1, 0.95]).text())


class QuantileInterval(unittest.TestCase):
    def test_the_median_gives_median_intervals(self):
        for n in range(2, 40):
            v = [float((7 * i) % n) for i in range(n)] if n % 7 else [float(i) for i in range(n)]
            lo, hi, cov = measure.quantile_interval(v, 0.5)
            want = measure.median_interval(v)
            self.assertEqual((lo, hi), want[:2], n)
            self.assertAlmostEqual(cov, want[2], msg=n)

    def test_lower_quartile_of_eleven_is_min_to_6th(self):
        # B ~ Bin(11, 1/4) draws below the quartile; P(B = i) = C(11, i) 3^(11-i) / 4^11.
        # Lower tail P(B < 1) = 177147/4^11 = 4.2% <= 5%, P(B < 2) = 19.7%: j = 1. Upper tail
        # P(B >= 6) = 3.4%, P(B >= 5) = 11.5%: k = 6. Coverage P(1 <= B <= 5) = 3873177 / 4^11.
        lo, hi, cov = measure.quantile_interval([11, 3, 9, 1, 7, 5, 10, 2, 8, 4, 6], 0.25)
        self.assertEqual((lo, hi), (1, 6))
        self.assertAlmostEqual(cov, 3873177 / 4 ** 11)

    def test_short_of_coverage_gives_min_and_max_with_theirs(self):
        # n = 5: P(B = 0) = 243/1024 already exceeds a tail, so min and max: P(1 <= B <= 4) = 780/1024.
        self.assertEqual(measure.quantile_interval([5, 4, 3, 2, 1], 0.25), (1, 5, 780 / 1024))
        self.assertIsNone(measure.quantile_interval([1.0], 0.25))
        with self.assertRaises(ValueError):
            measure.quantile_interval([1.0, 2.0], 1.0)
        self.assertEqual(measure.Ratio([1.034]).text(), "1.034x (one round: no interval)")


class PairedRatio(unittest.TestCase):
    def test_rates_and_times_pair_by_round(self):
        # Round 2 ran on a machine twice as slow for both: its ratio is still 1.1.
        r = measure.paired_ratio([100, 50, 100], [110, 55, 121])
        self.assertEqual([round(x, 6) for x in r.per_round], [1.1, 1.1, 1.21])
        self.assertAlmostEqual(r.median, 1.1)
        t = measure.paired_ratio([10.0, 20.0], [8.0, 16.0], higher_is_better=False)
        self.assertEqual(t.per_round, [1.25, 1.25])
        with self.assertRaises(ValueError):
            measure.paired_ratio([1, 2], [1])

    def test_an_interval_holding_one_reads_same_within_noise(self):
        r = measure.Ratio([0.97, 1.01, 1.04, 1.00, 0.99])
        self.assertTrue(r.same_within_noise())
        self.assertEqual(r.text(), "1.000x, same within noise (0.97-1.04)")
        self.assertEqual(r.verdict("fused", "spmd"), "fused: same as spmd within noise (0.97-1.04, median 1.000x)")

    def test_a_difference_outside_the_interval_is_stated(self):
        r = measure.Ratio([1.05, 1.08, 1.11, 1.07, 1.09])
        self.assertFalse(r.same_within_noise())
        self.assertEqual(r.text(), "1.080x (1.05-1.11)")
        self.assertEqual(r.verdict("chained", "spmd"), "chained: faster than spmd, 1.080x (1.05-1.11)")
        self.assertIn("slower than spmd", measure.Ratio([0.9, 0.91, 0.92, 0.93, 0.94]).verdict("x", "spmd"))

    def test_command_line(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(measure.main(["ratio", "ours/peer", "100,50,100,80,90", "120,60,120,96,108"]), 0)
            self.assertEqual(measure.main(["order", "2", "a", "b"]), 0)
        self.assertEqual(out.getvalue().splitlines(), ["ours/peer: 1.200x (1.20-1.20)", "b a"])


class Attribution(unittest.TestCase):
    def trace(self, events):
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        self.addCleanup(os.unlink, f.name)
        json.dump({"traceEvents": events}, f)
        f.close()
        return f.name

    @staticmethod
    def x(pid, name, ts_ms, dur_ms, tid=0):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3}

    def test_breakdown_per_step_and_device(self):
        x = self.x
        # Two devices, three steps of 100 ms ending with an optimizer span; the first step is
        # start-up and left out. Device 1's forward is 10 ms longer; the allreduce thread (tid 1)
        # and the enclosing backward span are not counted; eval neither.
        ev = []
        for s in range(3):
            t = 100 * s
            for pid, fwd in ((0, 30), (1, 40)):
                ev += [x(pid, "forward", t, fwd), x(pid, "backward", t + 40, 50), x(pid, "block_bwd 0", t + 40, 50),
                       x(pid, "allreduce", t + 40, 55, tid=1), x(pid, "optimizer", t + 95, 5)]
        ev.append(x(0, "eval", 150, 10))
        bd = measure.step_breakdown(self.trace(ev))
        self.assertAlmostEqual(bd["step"], 100)
        self.assertAlmostEqual(bd["forward"], 35)
        self.assertAlmostEqual(bd["backward"], 50)
        self.assertAlmostEqual(bd["update"], 5)
        self.assertAlmostEqual(bd["rest"], 10)
        line = measure.attribution("fused", "spmd", dict(bd, forward=25, step=90, rest=10), bd)
        self.assertTrue(line.startswith("fused vs spmd, ms per step and device: step 90 vs 100; forward 25 vs 35 (-10)"), line)

    def test_kernel_variants_take_their_base_name(self):
        self.assertEqual(measure.category("block_bwd_acc 3"), "backward")
        self.assertEqual(measure.category("block_fwd_ep"), "forward")
        self.assertEqual(measure.category("head_acc"), "forward")
        self.assertEqual(measure.category("pipe_update"), "update")
        self.assertIsNone(measure.category("backward"))      # encloses the block_bwd spans
        self.assertIsNone(measure.category("fused_step"))
        self.assertIsNone(measure.category("island_loss"))

    def test_no_trace_says_so(self):
        self.assertIn("no trace", measure.attribution("a", "b", None, {"step": 1}))


if __name__ == "__main__":
    unittest.main()
