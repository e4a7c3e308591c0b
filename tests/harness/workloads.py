"""The workload every trainer case runs: the tiny model's flags (TINY; a case may change its
--steps in place) on the default corpus, and train(), one run of a trainer on it that returns its
metrics.
"""
import os

from harness import launch
from harness.launch import run
from harness.outputs import metrics

TINY = ["--d-model", "64", "--layers", "2", "--heads", "4", "--head-dim", "16", "--d-ff", "128",
        "--seq-len", "32", "--batch", "8", "--steps", "6", "--lr", "3e-3", "--peak-gflops", "50",
        "--eval-batches", "2", "--log-every", "3", "--coll-timeout", "60"]


def train(n, name, extra, exe="spmd"):
    """Runs `exe` on n ranks on TINY + `extra`, its metrics in TMP/NAME.jsonl; returns
    metrics(): (step lines by step, validation losses by step, the final line)."""
    path = os.path.join(launch.TMP, name + ".jsonl")
    run(n, TINY + ["--metrics", path] + extra, exe=exe)
    return metrics(path)
