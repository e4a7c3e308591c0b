"""mpi_scripts/dispatch_plot.py against a hand-made dispatch_bench JSON: which SPMD row each
Pathways row pairs with, the median of the rounds' paired ratios with its interval and verdict,
and runs written before the per-round rates."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import dispatch_plot


def row(fig, mode, t, rounds, **extra):
    # computations_per_s: the best round, as dispatch_bench writes it.
    r = {"fig": fig, "mode": mode, "workers": 2, "compute_us": t, "computations_per_s": max(rounds),
         "round_computations_per_s": rounds}
    r.update(extra)
    return r


def doc():
    return {"workers": 2, "breakeven_us": {"opbyop": None, "chained": 100}, "rows": [
        # T = 0, three rounds: opbyop/spmd = 0.5, 0.55, 0.45.
        row("5", "spmd", 0, [100.0, 200.0, 400.0]),
        row("5", "opbyop", 0, [50.0, 110.0, 180.0]),
        # T = 100 us, five rounds: chained/spmd = 0.9, 1.1, 1.0, 1.05, 0.95.
        row("6", "spmd", 100, [10.0, 10.0, 10.0, 10.0, 10.0]),
        row("6", "chained", 100, [9.0, 11.0, 10.0, 10.5, 9.5]),
        # Fig. 6 at T = 40 too: Fig. 8's rows at 40 must pair with Fig. 8's own SPMD row.
        row("6", "spmd", 40, [1000.0, 1000.0]),
        # Fig. 8, T = 40 us, two rounds: 4 clients / spmd = 0.5, 0.75.
        row("8", "spmd", 40, [20.0, 40.0]),
        row("8", "clients", 40, [10.0, 30.0], clients=4, utilization_vs_spmd=0.75),
        # Fig. 7 has no SPMD row: no ratio.
        row("7", "parallel", 0, [5.0, 6.0], stages=2),
    ]}


class PairedRatios(unittest.TestCase):
    def test_each_row_over_the_spmd_row_of_its_rounds(self):
        got = [(r["fig"], r["mode"], r["compute_us"], ratio.per_round) for r, ratio in dispatch_plot.paired_ratios(doc())]
        self.assertEqual([g[:3] for g in got], [("5", "opbyop", 0), ("6", "chained", 100), ("8", "clients", 40)])
        for (_, _, _, per), want in zip(got, ([0.5, 0.55, 0.45], [0.9, 1.1, 1.0, 1.05, 0.95], [0.5, 0.75])):
            self.assertEqual(len(per), len(want))
            for a, b in zip(per, want):
                self.assertAlmostEqual(a, b)

    def test_median_interval_and_coverage(self):
        (_, opbyop), (_, chained), (_, clients) = dispatch_plot.paired_ratios(doc())
        # Three rounds: median 0.5, min and max with 1 - 2/8 = 75% coverage.
        self.assertAlmostEqual(opbyop.median, 0.5)
        self.assertEqual((opbyop.lo, opbyop.hi, opbyop.coverage), (0.45, 0.55, 0.75))
        self.assertFalse(opbyop.same_within_noise())
        # Five rounds: median 1.0, min and max with 1 - 2/32 coverage, 1 inside.
        self.assertAlmostEqual(chained.median, 1.0)
        self.assertEqual((chained.lo, chained.hi, chained.coverage), (0.9, 1.1, 30 / 32))
        self.assertTrue(chained.same_within_noise())
        # Two rounds: the mean of the two, 50% coverage.
        self.assertAlmostEqual(clients.median, 0.625)
        self.assertEqual((clients.lo, clients.hi, clients.coverage), (0.5, 0.75, 0.5))

    def test_unequal_rounds_are_an_error_not_a_ratio(self):
        d = doc()
        d["rows"][1]["round_computations_per_s"] = [50.0, 110.0]
        with self.assertRaises(ValueError):
            dispatch_plot.paired_ratios(d)


class Lines(unittest.TestCase):
    def test_a_verdict_per_ratio(self):
        self.assertEqual(dispatch_plot.ratio_lines("2 workers, one host", doc()), [
            "2 workers, one host: Pathways / SPMD computations per second, median of the rounds' paired ratios (interval):",
            "  fig 5, T = 0 us, opbyop: slower than spmd, 0.500x (0.45-0.55, 75% coverage)",
            "  fig 6, T = 100 us, chained: same as spmd within noise (0.90-1.10, median 1.000x)",
            "  fig 8, T = 40 us, 4 clients: slower than spmd, 0.625x (0.50-0.75, 50% coverage)",
        ])

    def test_an_older_run_says_it_has_no_rounds(self):
        d = doc()
        for r in d["rows"]:
            del r["round_computations_per_s"]
        self.assertEqual(dispatch_plot.paired_ratios(d), [])
        self.assertEqual(dispatch_plot.ratio_lines("x", d), ["x: no per-round rates (an older dispatch_bench): no paired ratios"])

    def test_a_pipeline_only_run_has_no_lines(self):
        d = doc()
        d["rows"] = [r for r in d["rows"] if r["fig"] == "7"]
        self.assertEqual(dispatch_plot.ratio_lines("x", d), [])

    def test_main_prints_them_after_the_break_even_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dispatch_hosts2_w1.json")
            with open(path, "w") as f:
                json.dump(doc(), f)
            out = io.StringIO()
            # gnuplot, present or not, only writes PNGs or one line on stderr.
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                dispatch_plot.main([tmp, path])
        lines = [l for l in out.getvalue().splitlines() if not l.startswith("wrote ")]
        self.assertEqual(lines[2].split(), ["2", "hosts,", "1/host", "2", "not", "reached", "100", "us"])
        self.assertEqual(lines[3], "2 hosts, 1/host: Pathways / SPMD computations per second, median of the rounds' "
                                   "paired ratios (interval):")
        self.assertEqual(len(lines), 7)


if __name__ == "__main__":
    unittest.main()
