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


if __name__ == "__main__":
    unittest.main()
