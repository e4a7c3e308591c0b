"""failure_report.py against a hand-written timestamped log (the events failure_bench.sh logs)."""
import json
import os
import tempfile
import unittest

import failure_report as fr

# A run: steps 1..5 (a checkpoint at 4), a kill at 105.0 during step 6, the supervisor's line at
# 106.5, the restart resumes at step 4 and logs step 4 at 110.0; then a kill between attempts
# ("no rank running", not a fault); the end.
FAULTY = """100.0 [spmd] step     1/8 | loss 5.0
101.0 [spmd] step     2/8 | loss 4.0
102.0 [spmd] step     3/8 | loss 3.0
103.0 [spmd] step     4/8 | loss 2.0
104.0 [spmd] step     5/8 | loss 1.0
105.0 failure_bench: inject: SIGKILL pid 4242 of 2 ranks
106.5 supervise.sh: attempt 1 ended with exit 137 after 6.5 s; restart 1 of at most 1000, from /tmp/x.ckpt
109.0 [spmd] resumed from /tmp/x.ckpt at step 4
110.0 [spmd] step     4/8 | loss 2.0
111.0 [spmd] step     5/8 | loss 1.0
111.5 failure_bench: inject: no rank running
112.0 [spmd] step     6/8 | loss 0.5
113.0 [spmd] step     7/8 | loss 0.4
114.0 failure_bench: exit 0
"""
FREE = """200.0 [spmd] step     1/8 | loss 5.0
207.0 failure_bench: exit 0
"""


class FailureReportTest(unittest.TestCase):
    def test_parse_and_recoveries(self):
        ev = fr.parse(FAULTY.splitlines())
        self.assertEqual([e[1] for e in ev].count("kill"), 1)
        rec = fr.recoveries(ev)
        self.assertEqual(len(rec), 1)
        self.assertAlmostEqual(rec[0]["detect_s"], 1.5)
        self.assertAlmostEqual(rec[0]["restart_s"], 3.5)
        self.assertEqual(rec[0]["replayed"], 2)  # steps 4 and 5 ran twice

    def test_a_stop_is_a_fault(self):
        # --faults stop: the injector's SIGSTOP line is a fault as its SIGKILL is (the job's
        # watchdog ends the attempt, the supervisor restarts it), counted apart in the summary.
        stopped = FAULTY.replace("inject: SIGKILL pid 4242", "inject: SIGSTOP pid 4242")
        ev = fr.parse(stopped.splitlines())
        rec = fr.recoveries(ev)
        self.assertEqual(len(rec), 1)
        self.assertAlmostEqual(rec[0]["detect_s"], 1.5)
        with tempfile.TemporaryDirectory() as d:
            for name, log in (("faulty", stopped), ("free", FREE)):
                with open(os.path.join(d, name + ".log"), "w") as f:
                    f.write(log)
                with open(os.path.join(d, name + ".jsonl"), "w") as f:
                    f.write(json.dumps({"final": True, "weights_hash": "ab"}) + "\n")
            faulty, free = fr.run_summary(os.path.join(d, "faulty")), fr.run_summary(os.path.join(d, "free"))
        self.assertEqual((faulty["faults"], faulty["stops"], free["stops"]), (1, 1, 0))
        _, text = fr.report([("spmd", free, faulty)], 60, 8, 4)
        self.assertTrue(any("1 of the 1 faults were SIGSTOP" in t for t in text), text)

    def test_report_goodput_and_weights(self):
        with tempfile.TemporaryDirectory() as d:
            # The injector's lines in a file of their own, merged by time.
            inject = "".join(l + "\n" for l in FAULTY.splitlines() if "inject" in l)
            job = "".join(l + "\n" for l in FAULTY.splitlines() if "inject" not in l)
            with open(os.path.join(d, "faulty.inject.log"), "w") as f:
                f.write(inject)
            for name, log, h in (("free", FREE, "ab"), ("faulty", job, "ab")):
                with open(os.path.join(d, name + ".log"), "w") as f:
                    f.write(log)
                with open(os.path.join(d, name + ".jsonl"), "w") as f:
                    f.write(json.dumps({"step": 7, "loss": 0.4}) + "\n" + json.dumps({"final": True, "weights_hash": h}) + "\n")
            free, faulty = fr.run_summary(os.path.join(d, "free")), fr.run_summary(os.path.join(d, "faulty"))
        self.assertAlmostEqual(free["wall_s"], 7.0)
        self.assertAlmostEqual(faulty["wall_s"], 14.0)
        self.assertEqual((faulty["faults"], faulty["restarts"]), (1, 1))
        self.assertAlmostEqual(faulty["recoveries"][0]["detect_s"], 1.5)
        doc, text = fr.report([("spmd", free, faulty)], 60, 8, 4)
        row = doc["rows"][0]
        self.assertAlmostEqual(row["goodput"], 0.5)
        self.assertTrue(row["same_weights"])
        self.assertIn("0.500", text[2])
        faulty["weights_hash"] = "cd"
        doc, text = fr.report([("spmd", free, faulty)], 60, 8, 4)
        self.assertFalse(doc["rows"][0]["same_weights"])
        self.assertIn("NO", text[2])


# pathways_train --spare-workers: a worker killed at 205.0, the controller's line at 208.0, the
# trainer's recovery at 208.5 (2 steps replayed from the checkpoint, steps 5..6 in flight run
# again), the next step at 209.0; a spare killed at 210.0 (lost at 213.0, nothing to recover);
# then the controller killed at 215.0: no spare role, the supervisor restarts at 218.0.
IN_JOB = """200.0 [p] step     5/9 | loss 1.0
205.0 failure_bench: inject: SIGKILL pid 1 of 5 ranks
208.0 pathways liveness: the controller lost device 1 (world rank 2) (silent for 3.0 s); remapped slice 2 device 1 -> 3; its runs are cancelled and its objects lost
208.5 [p] recovered at step 5: fetch: lost; slice 1 from device(s) 1 to 3; state restored from the checkpoint of step 3 (c) in 0.10 s, 2 step(s) replayed in 0.30 s; step(s) 5..6 run again
209.0 [p] step     6/9 | loss 0.9
210.0 failure_bench: inject: SIGKILL pid 2 of 5 ranks
213.0 pathways liveness: the controller lost device 3 (world rank 4) (silent for 3.0 s); it held no slice; its runs are cancelled and its objects lost
214.0 [p] step     7/9 | loss 0.8
215.0 failure_bench: inject: SIGKILL pid 3 of 5 ranks
218.0 supervise.sh: attempt 1 ended with exit 0 but without writing m.jsonl (it did not finish) after 18.0 s; restart 1 of at most 1000, from c
220.0 [p] resumed from c at step 5
221.0 [p] step     6/9 | loss 0.9
"""


# A kill during a restart's start-up (before its first step): two restarts, the first without
# a restart time, the second timed from its own supervisor line.
TWICE = """100.0 [s] step     3/8 | loss 1.0
101.0 failure_bench: inject: SIGKILL pid 1 of 2 ranks
102.0 supervise.sh: attempt 1 ended with exit 137 after 5.0 s; restart 1 of at most 9, from c
102.5 failure_bench: inject: SIGKILL pid 2 of 2 ranks
104.0 supervise.sh: attempt 2 ended with exit 137 after 1.5 s; restart 2 of at most 9, from c
106.0 [s] resumed from c at step 2
107.0 [s] step     3/8 | loss 1.0
"""


class InJobRecoveryTest(unittest.TestCase):
    def test_kill_during_a_restart(self):
        rec = fr.recoveries(fr.parse(TWICE.splitlines()))
        self.assertEqual([r["how"] for r in rec], ["restart", "restart"])
        self.assertNotIn("restart_s", rec[0])
        self.assertAlmostEqual(rec[1]["detect_s"], 1.5)
        self.assertAlmostEqual(rec[1]["restart_s"], 3.0)

    def test_in_job_spare_and_restart(self):
        rec = fr.recoveries(fr.parse(IN_JOB.splitlines()))
        self.assertEqual([r["how"] for r in rec], ["in-job", "spare", "restart"])
        self.assertAlmostEqual(rec[0]["detect_s"], 3.0)
        self.assertAlmostEqual(rec[0]["restore_s"], 0.5)
        self.assertAlmostEqual(rec[0]["back_s"], 0.5)
        self.assertEqual(rec[0]["replayed"], 4)  # 2 from the checkpoint, steps 5 and 6 in flight
        self.assertAlmostEqual(rec[1]["detect_s"], 3.0)
        self.assertAlmostEqual(rec[2]["detect_s"], 3.0)
        self.assertAlmostEqual(rec[2]["restart_s"], 3.0)
        self.assertEqual(rec[2]["replayed"], 3)  # steps 5..7 logged, resumed at 5


if __name__ == "__main__":
    unittest.main()
