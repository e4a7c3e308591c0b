"""Checks that more than one trainer's cases run, each on the trainer and mesh it is given:
the first gradient bucket's AllReduce overlaps the backward (issue 18), non-finite training ends
the run or is skipped (issue 42), and no MFU over 1 (issue 39).
"""
import json
import math
import os

from harness import launch
from harness.errors import one_error_line
from harness.launch import run
from harness.outputs import finite_checkpoint, late_first_buckets, metrics_lines, temp_leftovers
from harness.workloads import TINY, train


# ---- Issue 18: real overlap by default ------------------------------------------------------------

def check_overlap(run_traced, pids, what):
    """run_traced(name, extra args) -> trace path. By default the first bucket starts during the
    backward on every rank and step; with one bucket as large as DDP's 25 MiB (the old default)
    it starts after it on every one (the check can fail)."""
    late = late_first_buckets(run_traced("default", []), pids, 6)
    assert not late, f"{what}: first bucket started after the last backward unit began (rank row, step, buckets): {late}"
    late = late_first_buckets(run_traced("one_bucket", ["--bucket-bytes", str(25 << 20)]), pids, 6)
    assert len(late) == 6 * len(pids), f"{what} with one 25 MiB bucket: expected every step late, got {late}"
    print(f"{what}: the first bucket's AllReduce starts before the last backward unit on every rank and step "
          f"(and after it with one 25 MiB bucket)")


# ---- issue 42: nothing silent - non-finite training ends the run ---------------------------------

def check_nonfinite_stop(n, mesh, exe, label):
    """--lr 1e6 without clipping diverges within a few steps: the run ends at the first non-finite
    step with one line naming it, every rank non-zero; the metrics end at the step before with the
    stopped line; the checkpoint of the step before (--ckpt-every 1) is intact and finite. The old
    code trained every step at loss nan, exited 0 and wrote a NaN checkpoint."""
    prefix = f"{'spmd' if exe == 'spmd' else 'pathways'}_train: error:"
    ck, m = os.path.join(launch.TMP, label + ".ckpt"), os.path.join(launch.TMP, label + ".jsonl")
    args = [a for a in TINY] + mesh + ["--lr", "1e6", "--max-grad-norm", "0", "--ckpt", ck, "--ckpt-every", "1",
                                       "--metrics", m]
    p = run(n, args, expect_ok=False, exe=exe)
    line = one_error_line(p, "the training loss is nan", prefix)
    bad = int(line.split("error: step ")[1].split(":")[0])
    assert 0 < bad < 6, f"{label}: stopped at step {bad}"
    for what in ("lower --lr (now 1e+06)", "enable --max-grad-norm", "--skip-nonfinite"):
        assert what in line, f"{label}: the line does not say {what!r}: {line}"
    lines = metrics_lines(m)
    steps = [j["step"] for j in lines if "loss" in j]
    assert steps == list(range(bad)), f"{label}: step lines {steps}, expected 0..{bad - 1}"
    assert all(math.isfinite(j["loss"]) and math.isfinite(j["grad_norm"]) for j in lines if "loss" in j)
    last = lines[-1]
    assert last.get("stopped") and last["step"] == bad and last["error"] in line, f"{label}: last line {last}"
    assert not any(j.get("final") for j in lines), f"{label}: a stopped run wrote a final line"
    assert finite_checkpoint(ck) == bad, f"{label}: the checkpoint is not the one after step {bad - 1}"
    assert not temp_leftovers(launch.TMP), f"{label}: temporary files left: {temp_leftovers(launch.TMP)}"
    print(f"{label}: stopped at step {bad}; metrics and the step-{bad} checkpoint intact")


def nan_step_runs(n, mesh, exe, label):
    """--nan-step 2: stops the run at step 2 by default; with --skip-nonfinite 1 the step is
    skipped, counted and the run finishes. Returns the finished run's metrics."""
    prefix = f"{'spmd' if exe == 'spmd' else 'pathways'}_train: error:"
    m = os.path.join(launch.TMP, label + "_stop.jsonl")
    p = run(n, TINY + mesh + ["--nan-step", "2", "--metrics", m], expect_ok=False, exe=exe)
    line = one_error_line(p, "step 2: the training loss is nan (gradient norm nan)", prefix)
    assert "--nan-step 2" in line, line
    assert [j["step"] for j in metrics_lines(m) if "loss" in j] == [0, 1]
    # One allowed, one happens: the run goes on; the step's line is marked and its loss is null.
    got = train(n, label + "_skip", mesh + ["--nan-step", "2", "--skip-nonfinite", "1"], exe=exe)
    steps, _, final = got
    assert sorted(steps) == list(range(6)), sorted(steps)
    assert steps[2]["skipped"] and steps[2]["loss"] is None and steps[2]["grad_norm"] is None, steps[2]
    assert not any(steps[s]["skipped"] for s in steps if s != 2)
    assert final["skipped_nonfinite"] == 1 and math.isfinite(final["final_loss"]), final
    # One allowed, two happen: diverged weights stay diverged, so the step after the skipped one
    # is non-finite too, and the run stops there.
    p = run(n, TINY + mesh + ["--lr", "1e6", "--max-grad-norm", "0", "--skip-nonfinite", "1"], expect_ok=False, exe=exe)
    one_error_line(p, "after 1 skipped non-finite step (--skip-nonfinite 1)", prefix)
    return got


# ---- Issue 39: MFU against a peak that is a peak ----------------------------------------------


def assert_peak_is_a_peak(path, what):
    """No MFU over 1 in the metrics at `path`, and the final line's peak at least every step's
    achieved model FLOP rate per rank (tokens/s x flops per token / ranks). Returns (final, the
    steps, their achieved rates)."""
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    head, final = lines[0], lines[-1]
    steps = [j for j in lines if "step_ms" in j]
    achieved = [s["tokens_per_s"] * head["flops_per_token"] / head["ranks"] / 1e9 for s in steps]
    assert steps and final.get("final"), f"{what}: no steps or no final line"
    assert all(s["mfu"] <= 1.0 for s in steps), f"{what}: a step's MFU over 1: {[s['mfu'] for s in steps]}"
    assert 0 < final["mfu"] <= 1.0, f"{what}: final MFU {final['mfu']}"
    if head.get("fma_peak_gflops_per_core", 0) > 0 and head["config"].get("precision", "fp32") == "fp32":
        # The hardware's MFU: the median's achieved rate over the core's FMA peak (not bounded
        # here: a probe on a core another test shares reads low, docs/train.md "MFU").
        want = final["tokens_per_s"] * head["flops_per_token"] / head["ranks"] / 1e9 / head["fma_peak_gflops_per_core"]
        assert abs(final["mfu_fma"] - want) <= 1e-9 * want, f"{what}: mfu_fma {final['mfu_fma']} vs {want}"
    peak = final["peak_gflops_per_rank"]
    assert peak >= max(achieved) * (1 - 1e-12), f"{what}: peak {peak} below an achieved rate {max(achieved)}"
    assert peak >= head["peak_gflops_per_rank"], f"{what}: the peak fell below the start-up one"
    print(f"{what}: MFU {final['mfu']:.3f} against {peak:.2f} GFLOP/s per rank ({final['peak_source']}); "
          f"fastest step {max(achieved):.2f}")
    return final, steps, achieved


def check_mfu_never_over_one(n, mesh, exe, name):
    """Issue 39 for one trainer: the model-shape probes (start-up, the evaluation pause after step
    3, after the last step: 3 probes), then a --peak-gflops below every step's rate, which the
    first step raises to its own rate (and says so)."""
    i = TINY.index("--peak-gflops")
    probed = TINY[:i] + TINY[i + 2:]
    path = os.path.join(launch.TMP, name + "_probed.jsonl")
    run(n, probed + mesh + ["--eval-every", "3", "--metrics", path], exe=exe)
    final, _, _ = assert_peak_is_a_peak(path, f"{name}, probed")
    assert final["peak_probes"] == 3 and final["peak_probe_gflops_per_rank"] > 0, final
    assert final["peak_source"] in ("model-shape GEMM, highest of 3 probes",) or final["peak_source"].startswith(
        "achieved step rate, above the model-shape GEMM's highest of 3 probes"), final["peak_source"]
    path = os.path.join(launch.TMP, name + "_given.jsonl")
    p = run(n, probed + mesh + ["--peak-gflops", "0.001", "--metrics", path], exe=exe)
    final, steps, achieved = assert_peak_is_a_peak(path, f"{name}, --peak-gflops 0.001")
    assert final["peak_source"] == "achieved step rate, above --peak-gflops 0.001", final["peak_source"]
    assert final["peak_probes"] == 0 and final["peak_probe_gflops_per_rank"] == 0, final
    assert abs(final["peak_gflops_per_rank"] - max(achieved)) <= 1e-12 * max(achieved), final
    assert max(s["mfu"] for s in steps) == 1.0, "no step set the peak"
    assert "is above the GEMM peak of 0.0 GFLOP/s (--peak-gflops)" in p.stdout, p.stdout
