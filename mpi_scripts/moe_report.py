#!/usr/bin/env python3
"""Table of mpi_scripts/moe_bench.sh: per candidate the median step tokens/s of each round over
the steps from WARM on, the MoE / dense ratio per round, its median over rounds and the rounds'
range, and the runs' routing figures over the same steps. Writes OUT/moe_bench.json.

    moe_report.py OUT ROUNDS WARM dense NAME...
"""
import json
import os
import statistics
import sys


def read_steps(path, warm, who="moe_report"):
    """A run's metrics: its step records from step `warm` on (skipped steps left out) and its final
    record; exits with one line naming the file when either is missing."""
    steps, final = [], None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if j.get("final"):
                final = j
            elif "tokens_per_s" in j and not j.get("skipped"):
                steps.append(j)
    body = [s for s in steps if s["step"] >= warm]
    if final is None or not body:
        sys.exit(f"{who}: {path} is incomplete (no final line, or no step from step {warm} on)")
    return body, final


def run_figures(path, warm):
    body, final = read_steps(path, warm)
    fig = {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in body), "final_loss": final["final_loss"]}
    if "moe" in body[0]:
        for k in ("dropped_share", "padding_share", "max_mean_tokens"):
            fig[k] = statistics.median(s["moe"][k] for s in body)
        fig["alltoall_ms"] = statistics.median(s["moe"]["alltoall_ms"]["median"] for s in body)
        fig["step_ms"] = statistics.median(s["step_ms"] for s in body)
    return fig


def main():
    out, rounds, warm, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    base = names[0]
    per = {n: [run_figures(os.path.join(out, f"moe_{r}_{n}.jsonl"), warm) for r in range(rounds)] for n in names}
    result = {"rounds": rounds, "warm_steps": warm, "candidates": {}}
    print(f"{'run':<10} {'tok/s (median of rounds)':>24} {'/ ' + base + ' (median, range)':>30}  routing")
    for n in names:
        tps = [f["tokens_per_s"] for f in per[n]]
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(per[n], per[base])]
        entry = {"tokens_per_s": tps, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                 "ratio_max": max(ratios)}
        routing = ""
        if "dropped_share" in per[n][0]:
            for k in ("dropped_share", "padding_share", "max_mean_tokens", "alltoall_ms", "step_ms"):
                entry[k] = statistics.median(f[k] for f in per[n])
            routing = (f"dropped {100 * entry['dropped_share']:.1f}%, padding {100 * entry['padding_share']:.1f}%, "
                       f"busiest/mean {entry['max_mean_tokens']:.2f}, AllToAll {entry['alltoall_ms']:.1f} of "
                       f"{entry['step_ms']:.0f} ms/step")
        result["candidates"][n] = entry
        ratio = "" if n == base else f"{entry['ratio_median']:.3f}x ({entry['ratio_min']:.3f}-{entry['ratio_max']:.3f})"
        print(f"{n:<10} {statistics.median(tps):>24.0f} {ratio:>30}  {routing}")
    with open(os.path.join(out, "moe_bench.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
