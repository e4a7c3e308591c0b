"""mpi_scripts/report_page.py: the outcome of a ratio, the first section's sentences, a study that
wrote nothing, the size study read from scale_report.py's scale.json (issue 60), compare's table of
peak memory (issue 58), and the docs/results pages that name their section. The page in a
browser: tests/report (label `report`)."""
import glob
import json
import os
import tempfile
import unittest

import compare_report
import report_page
import test_scale_report


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


class SizeStudy(unittest.TestCase):
    def test_tables_and_verdicts_are_scale_reports(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "size")
            os.makedirs(out)
            # DDP: paired ratios 1.5, 1.5, 1.1 (fp32, meets 1.2x) and 1.0, 1.0, 1.0 (bf16, misses it).
            test_scale_report.write_size(out, "4m", [150, 75, 110], [300, 300, 300], [100, 50, 100], [300, 300, 300])
            with open(os.path.join(out, "4m", "compare.json")) as f:
                cmp = json.load(f)
            cmp["workload"].update(batch=32, compute_ranks=2, steps=8, pipeline_microbatches=8)
            for r in cmp["runs"]:  # compare_report.py's ratio (measure.Ratio.as_dict), interval 0.9-1.1
                r["vs_spmd"].update(median=1.0, coverage=0.75)
            with open(os.path.join(out, "4m", "compare.json"), "w") as f:
                json.dump(cmp, f)
            code, _ = test_scale_report.report(out, "4m")
            self.assertEqual(code, 0)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"studies": ["size"]}, f)
            doc = report_page.build(d)
            (s,) = doc["studies"]
            trainers, ddp = s["tables"]
            self.assertEqual([r[2] for r in trainers["rows"]], ["spmd", "fused", "spmd_bf16"])
            self.assertEqual(ddp["rows"][0][:6], ["4m", "ddp_fp32", "100", "spmd", "110", "1.50x"])
            self.assertEqual(ddp["rows"][1][7], "no")
            got = {(v["candidate"], v["reference"]): v for v in s["verdicts"]}
            self.assertEqual(sorted(got), [("fused (4m)", "spmd"), ("spmd (4m)", "ddp_fp32"),
                                           ("spmd_bf16 (4m)", "ddp_bf16"), ("spmd_bf16 (4m)", "spmd")])
            self.assertEqual(got[("spmd (4m)", "ddp_fp32")]["median"], 1.5)
            self.assertEqual(got[("fused (4m)", "spmd")]["outcome"], "tied")  # the row's interval 0.9-1.1
            self.assertIn("spmd_train >= 1.2x DDP: not at 4m ddp_bf16 1.00x.", s["notes"])
            self.assertEqual(s["metrics"]["spmd_over_ddp"], {"4m ddp_fp32": 1.5, "4m ddp_bf16": 1.0})


class CompareMemory(unittest.TestCase):
    def run_compare(self, runs):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "compare"))
            workload = {"model": "m", "compute_ranks": 2, "steps": 5, "batch_per_rank": 8, "cluster": "one host"}
            with open(os.path.join(d, "compare", "compare.json"), "w") as f:
                json.dump({"workload": workload, "runs": runs}, f)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"studies": ["compare"]}, f)
            (s,) = report_page.build(d)["studies"]
            return s

    @staticmethod
    def make_run(name, peak, state=None, act=None, runtime=0):
        t = {"name": name, "tokens_per_s": 1000.0, "tokens_per_s_vs_spmd": 1.0, "step_ms_p50": 10.0, "mfu": 0.5,
             "final_loss": 5.0, "weights_identical": True, "rounds": 3, "peak_rss_bytes": peak * 2**20}
        if state is not None:  # compare_report.memory_breakdown of the final metrics
            t["memory"] = compare_report.memory_breakdown({
                "peak_rss_bytes": peak * 2**20, "state_bytes": state * 2**20,
                "memory_activations_bytes": act * 2**20, "memory_runtime_bytes": runtime * 2**20})
        return t

    def test_peak_rss_against_spmd_and_its_parts(self):
        s = self.run_compare([self.make_run("spmd", 336, 59, 120), self.make_run("fused", 370, 59, 120, 40),
                              self.make_run("pipeline", 300)])
        mem = s["tables"][-1]
        self.assertEqual(mem["columns"], ["run", "peak RSS", "vs spmd", "model state", "activations",
                                          "runtime intermediates", "unattributed"])
        self.assertEqual(mem["rows"][0], ["spmd", "336", "1.00x", "59", "120", "0", "157 (47%)"])
        self.assertEqual(mem["rows"][1], ["fused", "370", "1.10x", "59", "120", "40", "151 (41%)"])
        self.assertEqual(mem["rows"][2], ["pipeline", "300", "0.89x", "-", "-", "-", "-"])  # no breakdown
        self.assertAlmostEqual(s["metrics"]["peak_rss_vs_spmd"]["fused"], 370 / 336)

    def test_no_table_without_the_figure(self):
        runs = [self.make_run("spmd", 336), self.make_run("fused", 370)]
        for t in runs:
            del t["peak_rss_bytes"]
        s = self.run_compare(runs)
        self.assertEqual([t["columns"][0] for t in s["tables"]], ["run"])  # the speed table only
        self.assertNotIn("peak_rss_vs_spmd", s["metrics"])


class ResultsPages(unittest.TestCase):
    def test_every_page_names_its_section_or_says_none_has_it(self):
        """Each page REPRODUCES names says which section reproduces it; every other page says none does."""
        root = os.path.join(os.path.dirname(os.path.abspath(report_page.__file__)), "..")
        named = {p: name for name, pages in report_page.REPRODUCES.items() for p in pages}
        pages = sorted(glob.glob(os.path.join(root, "docs", "results", "*.md")))
        self.assertGreater(len(pages), 10)
        for path in pages:
            rel = os.path.relpath(path, root)
            with open(path) as f:
                head = "".join(f.readlines()[:6])
            if rel in named:
                self.assertIn(f'section "{report_page.TITLES[named[rel]].split(" (")[0]}', head, rel)
                self.assertIn(f"`index.html#{named[rel]}", head, rel)
            else:
                self.assertIn("No section of `mpi_scripts/report.sh` reproduces this page", head, rel)
        for rel in named:
            self.assertTrue(os.path.exists(os.path.join(root, rel)), rel)


if __name__ == "__main__":
    unittest.main()
