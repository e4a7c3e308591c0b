"""sim/project_goodput.py's model against a Monte Carlo run of the same failure process and against
the limits it must reach (no failures; Young's first-order interval)."""
import math
import random
import unittest

import project_goodput as pg


def simulate(tau, delta, restart, mtbf, segments, seed):
    """Wall time of `segments` segments of tau s of training plus a delta-s checkpoint, failures at
    exponential gaps (mean mtbf) at any time; each restarts the segment after `restart` s, which a
    failure also interrupts (the restart then begins again)."""
    rng = random.Random(seed)
    wall = 0.0
    for _ in range(segments):
        while True:
            gap = rng.expovariate(1.0 / mtbf)
            if gap >= tau + delta:
                wall += tau + delta
                break
            wall += gap
            while True:  # the restart
                gap = rng.expovariate(1.0 / mtbf)
                if gap >= restart:
                    wall += restart
                    break
                wall += gap
    return wall


class ModelTest(unittest.TestCase):
    def test_no_failures_costs_only_the_checkpoints(self):
        self.assertEqual(pg.wall_per_segment(10.0, 2.0, 5.0, math.inf), 12.0)
        self.assertAlmostEqual(pg.goodput_checkpoint(10.0, 2.0, 5.0, 1e12), 10.0 / 12.0, places=6)

    def test_formula_matches_a_simulation_of_the_failures(self):
        for tau, delta, restart, mtbf in ((10.0, 2.0, 3.0, 50.0), (30.0, 0.5, 10.0, 20.0), (1.0, 0.0, 4.0, 60.0)):
            n = 40000
            got = simulate(tau, delta, restart, mtbf, n, seed=7) / n
            want = pg.wall_per_segment(tau, delta, restart, mtbf)
            self.assertLess(abs(got - want) / want, 0.02, (tau, delta, restart, mtbf, got, want))

    def test_a_faults_cost_matches_a_simulation_and_is_half_a_segment_when_faults_are_rare(self):
        # Faults while training only (as failure_bench.sh's injector: no rank to kill in a
        # restart): each costs the restart and the training it cut.
        for tau, restart, mtbf in ((1.0, 2.0, 6.0), (10.0, 1.0, 5.0)):
            rng, lost, faults = random.Random(11), 0.0, 0
            for _ in range(40000):
                while (gap := rng.expovariate(1.0 / mtbf)) < tau:
                    lost, faults = lost + gap + restart, faults + 1
            self.assertLess(abs(lost / faults / pg.lost_per_fault(tau, restart, mtbf) - 1), 0.02, (tau, restart, mtbf))
        self.assertAlmostEqual(pg.lost_per_fault(2.0, 3.0, 1e9), 3.0 + 1.0, places=4)
        self.assertEqual(pg.goodput_at_faults(10.0, 0, 2.0, 3.0, 6.0), 1.0)

    def test_best_interval_is_youngs_when_checkpoints_are_cheap(self):
        delta, mtbf = 10.0, 36000.0
        self.assertLess(abs(pg.best_interval(delta, 60.0, mtbf) / math.sqrt(2 * delta * mtbf) - 1), 0.05)
        # and no interval nearby does better
        best = pg.best_interval(delta, 60.0, mtbf)
        for f in (0.8, 1.25):
            self.assertGreaterEqual(pg.goodput_checkpoint(best, delta, 60.0, mtbf),
                                    pg.goodput_checkpoint(best * f, delta, 60.0, mtbf))

    def test_in_job_recovery_beats_restarts_when_recovery_is_faster(self):
        g_ckpt = pg.goodput_checkpoint(pg.best_interval(60.0, 600.0, 3600.0), 60.0, 600.0, 3600.0)
        g_job = pg.goodput_in_job(10.0, 20.0, 3600.0, 3600.0 * 2048, 60.0, 600.0)
        self.assertGreater(g_job, g_ckpt)
        self.assertLess(g_job, 1.0)



class BandTest(unittest.TestCase):
    def test_goodput_band_is_the_errors_carried_and_capped_at_one(self):
        # Errors -20% and +25%: a goodput predicted 0.8 measures 0.8 / 1.25 = 0.64 to 0.8 / 0.8 = 1.0;
        # 0.9 would reach 1.125, capped at 1.
        band = {"lo": -0.2, "hi": 0.25}
        lo, hi = pg.goodput_range(0.8, band)
        self.assertAlmostEqual(lo, 0.64)
        self.assertAlmostEqual(hi, 1.0)
        self.assertEqual(pg.goodput_range(0.9, band)[1], 1.0)

    def test_check_band_from_measured_and_predicted(self):
        # Predicted 0.55 against 0.5 (+10%) and 0.45 against 0.5 (-10%); a row measuring 0 is left out.
        b = pg.check_band([{"predicted": 0.55, "measured": 0.5}, {"predicted": 0.45, "measured": 0.5},
                           {"predicted": 0.3, "measured": 0.0}])
        self.assertAlmostEqual(b["lo"], -0.1)
        self.assertAlmostEqual(b["hi"], 0.1)
        self.assertEqual(b["rows"], 2)
        self.assertIsNone(pg.check_band([]))


if __name__ == "__main__":
    unittest.main()
