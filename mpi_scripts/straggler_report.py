#!/usr/bin/env python3
"""The report of mpi_scripts/straggler_bench.sh: how each model's throughput and bubble respond to
one rank's extra time per step.

    straggler_report.py OUT.json DELAY_MS NAME/DELAY=METRICS.jsonl[,ROUND2.jsonl...]...

NAME is MODEL_LAYOUT (spmd_dp2, pathways_pipe2, ...), DELAY 0 or DELAY_MS; one metrics file per
round (the rounds interleaved). Per NAME: tokens/s (the median round's) without and with the
delay, their ratio (the median of the per-round paired ratios, mpi_scripts/measure.py) and the
ratio "added" a delay added to the step would give, p50 step / (p50 step + delay); a pipeline's
bubble both ways. Writes OUT.json. Unit-tested in tests/scripts/test_straggler_report.py.
"""
import json
import sys

import measure
from pipeline_report import last_final


def final(path):
    res = last_final(path)
    if res is None:
        raise ValueError(f"{path} has no final line")
    return res


def load(args):
    """{(NAME, DELAY): [final record per round]} from NAME/DELAY=PATH[,PATH...] arguments."""
    runs = {}
    for a in args:
        key, paths = a.split("=", 1)
        name, d = key.rsplit("/", 1)
        runs[(name, int(d))] = [final(p) for p in paths.split(",")]
    return runs


def rows(runs, delay):
    """One row per NAME that ran both ways, in argument order."""
    out = []
    for (name, d), finals in runs.items():
        if d != 0 or (name, delay) not in runs:
            continue
        slow = runs[(name, delay)]
        tps = lambda fs: [f["tokens_per_s"] for f in fs]  # noqa: E731
        ratio = measure.paired_ratio(tps(finals), tps(slow))
        med = lambda fs: measure.median(tps(fs))  # noqa: E731
        step = measure.median([f["step_ms_p50"] for f in finals])
        row = dict(name=name, tokens_per_s=med(finals), tokens_per_s_delayed=med(slow), ratio=ratio.median,
                   interval=ratio.interval_text(), per_round=ratio.per_round, added=step / (step + delay),
                   step_ms_p50=step)
        if "bubble" in finals[0]:
            row["bubble"] = measure.median([f["bubble"] for f in finals])
            row["bubble_delayed"] = measure.median([f["bubble"] for f in slow])
        out.append(row)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out, delay, args = argv[0], int(argv[1]), argv[2:]
    table = rows(load(args), delay)
    print(f"\none rank {delay} ms slower per step: tokens/s with the delay over without (paired by round)")
    print(f"{'run':<16}{'tokens/s':>10}{'delayed':>10}{'ratio':>8}{'interval':>24}{'added':>8}{'bubble':>9}{'delayed':>9}")
    for r in table:
        b = f"{100 * r['bubble']:>8.1f}%{100 * r['bubble_delayed']:>8.1f}%" if "bubble" in r else ""
        print(f"{r['name']:<16}{r['tokens_per_s']:>10.0f}{r['tokens_per_s_delayed']:>10.0f}{r['ratio']:>8.3f}"
              f"{r['interval']:>24}{r['added']:>8.3f}{b}")
    print("added: p50 step / (p50 step + delay), the ratio if the delay simply adds to every step")
    with open(out, "w") as f:
        json.dump({"delay_ms": delay, "rows": table}, f, indent=1)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
