"""mpi_scripts/report_page.py: the outcome of a ratio, the first section's sentences, a study that
wrote nothing (issue 60). The page in a browser: tests/report (label `report`)."""
import json
import os
import tempfile
import unittest

import report_page


class Outcome(unittest.TestCase):
    def test_interval_above_below_holding_one(self):
        self.assertEqual(report_page.outcome(1.10, 1.02, 1.20), "won")
        self.assertEqual(report_page.outcome(0.90, 0.85, 0.97), "lost")
        self.assertEqual(report_page.outcome(1.01, 0.98, 1.04), "tied")
        # An interval ending exactly at 1 holds 1.
        self.assertEqual(report_page.outcome(1.05, 1.00, 1.10), "tied")
        self.assertEqual(report_page.outcome(0.95, 0.90, 1.00), "tied")

    def test_one_round_has_no_interval(self):
        self.assertEqual(report_page.outcome(1.3, None, None), "no interval")


class Headline(unittest.TestCase):
    def test_counts_per_study_from_the_verdicts(self):
        vs = [report_page.verdict_entry("compare", "fused", "spmd", 1.1, 1.05, 1.2, 0.9375, "t"),
              report_page.verdict_entry("compare", "chained", "spmd", 0.9, 0.8, 0.95, 0.9375, "t"),
              report_page.verdict_entry("compare", "static", "spmd", 1.0, 0.9, 1.1, 0.9375, "t")]
        lines = report_page.headline({"verdicts": vs, "studies": []})
        self.assertEqual(lines, ["compare: against spmd: won 1 (fused); tied 1 (static); lost 1 (chained) "
                                 "(intervals of 94% coverage)."])

    def test_projection_sentence_uses_its_numbers(self):
        st = [{"name": "sim", "metrics": {"projection": {"palm_weak_scaling": 1.93, "palm_band": [1.9, 1.96],
                                                         "palm_paper": 1.95, "table2": {"S=4 M=16": 1.04}}}}]
        (line,) = report_page.headline({"verdicts": [], "studies": st})
        self.assertIn("1.930x (band 1.900-1.960; the paper: 1.95x)", line)
        self.assertIn("S=4 M=16 1.040x", line)


class EmptyStudy(unittest.TestCase):
    def test_a_study_without_outputs_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "failure"))
            with open(os.path.join(d, "failure", "status.txt"), "w") as f:
                f.write("1 12\n")
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"studies": ["failure"]}, f)
            doc = report_page.build(d)
            (s,) = doc["studies"]
            self.assertEqual((s["exit_code"], s["tables"], s["verdicts"]), (1, [], []))
            with open(os.path.join(d, "index.html")) as f:
                page = f.read()
            self.assertIn("exited 1", page)
            self.assertIn("No table: the study wrote none of the outputs", page)


if __name__ == "__main__":
    unittest.main()
