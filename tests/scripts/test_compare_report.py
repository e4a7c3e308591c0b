"""mpi_scripts/compare_report.py on hand-made rounds: the ratio to SPMD paired by round with its
interval, "same within noise" when the interval holds 1, the attribution of a difference from the
traces, and compare.json."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

import compare_report

HEAD = {"trainer": "t", "config": {"batch": 4, "model": "d_model=8 seq_len=16"}, "peak_gflops_per_rank": 10.0,
        "ranks": 1, "flops_per_token": 1e6}


def write_run(path, step_ms, weights="aa", peak=1.28):
    with open(path, "w") as f:
        f.write(json.dumps(HEAD) + "\n")
        for i, ms in enumerate(step_ms):
            f.write(json.dumps({"step": i, "loss": 5.0 - i, "step_ms": ms}) + "\n")
        f.write(json.dumps({"final": True, "mfu": 0.5, "tokens_per_s": 64 / (step_ms[-1] / 1e3), "final_loss": 1.0,
                            "final_val_loss": 1.5, "weights_hash": weights, "comm_share": 0.1,
                            "peak_gflops_per_rank": peak, "peak_source": f"probe {peak}"}) + "\n")


def write_trace(path, fwd_ms):
    ev = []
    for s in range(4):  # 100 ms steps ending with the optimizer
        t = 100.0 * s
        ev += [{"ph": "X", "pid": 0, "tid": 0, "name": "forward", "ts": t * 1e3, "dur": fwd_ms * 1e3},
               {"ph": "X", "pid": 0, "tid": 0, "name": "optimizer", "ts": (t + 95) * 1e3, "dur": 5e3}]
    with open(path, "w") as f:
        json.dump({"traceEvents": ev}, f)


class CompareReport(unittest.TestCase):
    def run_report(self, d, fused_ms, chained_ms):
        """Three rounds; spmd's steps take 100 ms in rounds 1 and 3 and 200 ms in round 2 (a slow
        machine: the paired ratios do not move)."""
        args = []
        spmd_ms = [100.0, 200.0, 100.0]
        for name, per_round in (("spmd", spmd_ms), ("fused", fused_ms), ("chained", chained_ms)):
            files, traces = [], []
            for k, ms in enumerate(per_round, start=1):
                files.append(os.path.join(d, f"{name}.r{k}.jsonl"))
                write_run(files[-1], [3 * ms] + [ms] * 5, weights="aa" if name != "chained" else "bb",
                          peak=2.56 if k == 2 else 1.28)
                traces.append(os.path.join(d, f"{name}.r{k}.trace.json"))
                write_trace(traces[-1], 60.0 if name == "chained" else 30.0)
            args.append(f"{name}={','.join(files)}:{','.join(traces)}")
        wl = os.path.join(d, "workload.json")
        with open(wl, "w") as f:
            json.dump({"gemm_peak_gflops_per_core": {"before": 10.0, "after": 10.0, "used_for_mfu": 10.0}}, f)
        out = io.StringIO()
        argv = sys.argv
        try:
            sys.argv = ["compare_report.py", d, wl] + args
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                compare_report.main()
        finally:
            sys.argv = argv
        with open(os.path.join(d, "compare.json")) as f:
            return out.getvalue(), json.load(f)

    def test_memory_breakdown_adds_up_to_the_peak(self):
        # Issue 58: the peak RSS by part: the state measured, the estimate's parts, the rest
        # unattributed (negative when the estimate over-counts).
        mib = 2 ** 20
        f = {"peak_rss_bytes": 300 * mib, "state_bytes": 60 * mib, "memory_activations_bytes": 150 * mib,
             "memory_in_flight_bytes": 0.0, "memory_moe_bytes": 0.0, "memory_gathers_bytes": 0.0,
             "memory_runtime_bytes": 40 * mib}
        m = compare_report.memory_breakdown(f)
        self.assertEqual(m["unattributed"], 50 * mib)
        self.assertEqual(sum(m[k] for k, _, _ in compare_report.MEMORY_PARTS) + m["unattributed"], m["peak_rss"])
        self.assertEqual(compare_report.memory_text(m), "peak RSS 300 MiB/rank = model state 60 + activations 150 + "
                         "runtime intermediates 40 + unattributed 50 (17%)")
        self.assertIsNone(compare_report.memory_breakdown({"peak_rss_bytes": 1.0, "state_bytes": 1.0}))
        # Each rank's own peak beside the largest (the MPMD trainers': per device, and the controller's).
        f.update(peak_resident_bytes_per_device=[300 * mib, 280 * mib], controller_peak_rss_bytes=90 * mib)
        self.assertTrue(compare_report.memory_text(compare_report.memory_breakdown(f)).endswith(
            "unattributed 50 (17%); each device 300 280, controller 90"))
        f = {k: v for k, v in f.items() if k not in ("peak_resident_bytes_per_device", "controller_peak_rss_bytes")}
        f["peak_resident_bytes_per_rank"] = [300 * mib, 299 * mib]
        self.assertTrue(compare_report.memory_text(compare_report.memory_breakdown(f)).endswith("; each rank 300 299"))

    def test_paired_interval_and_verdicts(self):
        with tempfile.TemporaryDirectory() as d:
            # fused: 0.98, 1.02 and 1.0 of spmd's speed per round; chained 0.8 in every round.
            text, doc = self.run_report(d, [102.04, 196.08, 100.0], [125.0, 250.0, 125.0])
        rows = {r["name"]: r for r in doc["runs"]}
        self.assertAlmostEqual(rows["fused"]["vs_spmd"]["median"], 1.0, places=3)
        self.assertAlmostEqual(rows["fused"]["vs_spmd"]["lo"], 0.98, places=3)
        self.assertAlmostEqual(rows["fused"]["vs_spmd"]["hi"], 1.02, places=3)
        self.assertTrue(rows["fused"]["vs_spmd"]["same_within_noise"])
        self.assertIn("fused: same as spmd within noise (0.98-1.02, 75% coverage", text)
        self.assertEqual([round(x, 3) for x in rows["chained"]["vs_spmd"]["per_round"]], [0.8, 0.8, 0.8])
        self.assertIn("chained: slower than spmd, 0.800x (0.80-0.80, 75% coverage)", text)
        # The attribution: chained's forward is 30 ms longer in its traces.
        self.assertIn("chained vs spmd, ms per step and device: step 100 vs 100; forward 60 vs 30 (+30)", text)
        # MFU: spmd's pooled median step (100 ms: 640 tokens/s of 1 MFLOP) over the rounds' highest
        # peak, 2.56 GFLOP/s, which the report names.
        self.assertAlmostEqual(rows["spmd"]["mfu"], 0.25)
        self.assertIn("spmd 2.6 GFLOP/s (probe 2.56)", text)
        self.assertFalse(rows["chained"]["weights_identical"])
        self.assertTrue(rows["fused"]["weights_identical"])

    def test_exchange_lines(self):
        # --palm's rows: fused exposes its whole exchange (tail 800 ms), chained 20 ms of it.
        table = [{"name": "spmd_1host"},
                 {"name": "pw_fused", "dcn_bytes_per_step": 30.94e6, "xchg_exposed_ms": 1600.0, "xchg_tail_ms": 800.0,
                  "step_ms_p50": 3200.0},
                 {"name": "pw_chained", "dcn_bytes_per_step": 30.94e6, "xchg_exposed_ms": 64.0, "xchg_tail_ms": 20.0,
                  "step_ms_p50": 2000.0}]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            compare_report.exchange_lines(table)
        text = out.getvalue()
        self.assertIn("pw_chained: between islands 30.94 MB/step, exchange exposed 64.0 ms/step (3.2% of its p50 step), "
                      "after the last island's backward 20.0 ms/step, hidden 98% (of fused's 800.0 ms)", text)
        self.assertIn("exchange exposed 1600.0 ms/step (50.0% of its p50 step)", text)
        self.assertAlmostEqual(table[2]["exchange_hidden_share"], 0.975)
        self.assertAlmostEqual(table[1]["exchange_hidden_share"], 0.0)


if __name__ == "__main__":
    unittest.main()
