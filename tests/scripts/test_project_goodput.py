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


if __name__ == "__main__":
    unittest.main()
