"""mpi_scripts/loss_curve.py on hand-made curves: each of its three rules holding and failing, and
its exit codes (0 trains, 1 does not, 2 bad input)."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import loss_curve


def falling(n=50, start=5.0, end=2.5):
    return [start + (end - start) * i / (n - 1) for i in range(n)]


class Judge(unittest.TestCase):
    def test_a_clean_curve_holds_every_rule(self):
        r = loss_curve.judge(falling())
        self.assertEqual({k: v[0] for k, v in r.items()}, {"below_uniform": True, "keeps_falling": True, "no_spike": True})
        self.assertIn("below ln 256 = 5.545 from step 1", r["below_uniform"][1])

    def test_spike_needs_more_than_the_margin_above_the_lookback(self):
        c = falling()
        c[30] = 1.04 * max(c[25:30])  # 4% above the five before: batch noise
        self.assertTrue(loss_curve.judge(c)["no_spike"][0])
        c[30] = 1.06 * max(c[25:30])  # 6%: a spike, named with its step
        ok, text = loss_curve.judge(c)["no_spike"]
        self.assertFalse(ok)
        self.assertIn("step 31: ", text)
        self.assertIn("+6.0% above", text)

    def test_a_plateau_does_not_keep_falling(self):
        c = falling(30) + [2.5] * 20
        ok, text = loss_curve.judge(c)["keeps_falling"]
        self.assertFalse(ok)
        self.assertIn("window 5 does not fall", text)

    def test_never_below_uniform(self):
        ok, text = loss_curve.judge(falling(start=7.0, end=5.6))["below_uniform"]
        self.assertFalse(ok)
        self.assertEqual(text, "never below ln 256 = 5.545")

    def test_too_short(self):
        with self.assertRaises(ValueError):
            loss_curve.judge(falling(19))


class Main(unittest.TestCase):
    def run_on(self, curve):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.jsonl")
            with open(p, "w") as f:
                f.write(json.dumps({"trainer": "spmd", "config": {}}) + "\n")
                for i, l in enumerate(curve):
                    f.write(json.dumps({"step": i, "loss": l, "step_ms": 1.0}) + "\n")
                f.write(json.dumps({"final": True, "final_loss": curve[-1] if curve else 0, "step": len(curve) - 1}) + "\n")
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                return loss_curve.main([p])

    def test_exit_codes(self):
        self.assertEqual(self.run_on(falling()), 0)
        c = falling()
        c[10] = 9.0
        self.assertEqual(self.run_on(c), 1)
        self.assertEqual(self.run_on(falling(5)), 2)


if __name__ == "__main__":
    unittest.main()
