#!/usr/bin/env python3
"""Table of `mpi_scripts/compare.sh --moe`: the Mixture-of-Experts model under SPMD (capacity,
dropless) and under Pathways' three routings, and with the experts on an island of their own (isl_* rows), from interleaved rounds at one routing
skew.

    moe_compare_report.py DIR SKEW WARM ROUNDS ROW=REFERENCE ...

Each ROW's metrics are DIR/ROW.r<k>.jsonl (k = 1..ROUNDS); REFERENCE is the SPMD row with the
same semantics (itself for the SPMD rows). Per row: tokens/s, the median over rounds of each
round's median step tokens/s from step WARM on, with the rounds' range; the ratio to the
reference, the median of the per-round paired ratios with its interval (mpi_scripts/measure.py:
"same within noise" when the interval holds 1); the routing figures over the same steps (tokens dropped per step, the padding
share of the rows the experts computed, the busiest expert's tokens over the mean's, the AllToAll's
share of the step, the controller's round trips per step as the runtime counted them); the final
loss; whether the final weights equal the reference's. Writes DIR/moe_compare.json.
"""
import json
import os
import statistics
import sys

import measure
from compare_report import memory_breakdown, memory_text

from moe_report import read_steps


def read_run(path, warm, choices):
    body, final = read_steps(path, warm, "moe_compare_report")
    if "moe" not in body[0]:
        sys.exit(f"moe_compare_report: {path} is not an MoE run (its steps have no moe record)")
    med = lambda f: statistics.median(f(s) for s in body)  # noqa: E731
    return {
        "tokens_per_s": med(lambda s: s["tokens_per_s"]),
        "dropped_per_step": med(lambda s: s["moe"]["dropped_share"]) * choices,
        "dropped_share": med(lambda s: s["moe"]["dropped_share"]),
        "padding_share": med(lambda s: s["moe"]["padding_share"]),
        "max_mean_tokens": med(lambda s: s["moe"]["max_mean_tokens"]),
        "alltoall_share": med(lambda s: s["moe"]["alltoall_ms"]["median"] / s["step_ms"]),
        "round_trips": med(lambda s: s["moe"].get("round_trips", 0)),
        "step_ms": med(lambda s: s["step_ms"]),
        "alltoall_ms": med(lambda s: s["moe"]["alltoall_ms"]["median"]),
        "route_wait_ms": med(lambda s: s["moe"]["route_wait_ms"]["median"] if "route_wait_ms" in s["moe"] else 0.0),
        "final_loss": final["final_loss"],
        "weights": final["weights_hash"],
        "memory": memory_breakdown(final),
    }


def moe_layers(path):
    """MoE layers x micro-batches of a run, from its config line."""
    with open(path) as f:
        cfg = json.loads(f.readline())["config"]
    m = dict(kv.split("=", 1) for kv in cfg["model"].split())
    return (int(m["n_layers"]) // int(m["moe_every"])) * int(cfg.get("microbatches", 1))


def layer_costs(runs, groups):
    """What the controller's routing costs per MoE layer and micro-batch against SPMD's AllToAll:
    the devices' measured idle time before each routed block forward (median device, per round
    trip); the step time pw_controller adds over pw_worker (the same dropless work without the
    round trips), per round trip, paired by round; and SPMD dropless's AllToAll time per group.
    Empty without those rows."""
    if not {"pw_controller", "pw_worker", "spmd_dropless"} <= runs.keys():
        return {}
    extra = [(c["step_ms"] - w["step_ms"]) / max(c["round_trips"], 1)
             for c, w in zip(runs["pw_controller"], runs["pw_worker"])]
    a2a = statistics.median(x["alltoall_ms"] for x in runs["spmd_dropless"]) / groups
    wait = [c["route_wait_ms"] / max(c["round_trips"], 1) for c in runs["pw_controller"]]
    return {"round_trip_ms": statistics.median(extra), "round_trip_ms_min": min(extra),
            "round_trip_ms_max": max(extra), "spmd_alltoall_ms": a2a, "route_wait_ms": statistics.median(wait),
            "route_wait_ms_min": min(wait), "route_wait_ms_max": max(wait)}


def choices_per_step(path):
    """Token-expert choices per step, from a run's config line: the global batch's tokens x top-k x
    the MoE layers."""
    with open(path) as f:
        cfg = json.loads(f.readline())["config"]
    m = dict(kv.split("=", 1) for kv in cfg["model"].split())
    return int(cfg["batch"]) * int(m["seq_len"]) * int(m["top_k"]) * (int(m["n_layers"]) // int(m["moe_every"]))


def verdict(row, ref, ratios):
    """The row's ratio to its reference as the rounds support it (measure.Ratio's words: the median,
    "same within noise" when the interval holds 1, the interval and its coverage)."""
    if row == ref:
        return "(reference)"
    return measure.Ratio(ratios).text()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out, skew, warm, rounds = argv[0], argv[1], int(argv[2]), int(argv[3])
    pairs = [a.split("=", 1) for a in argv[4:]]
    choices = choices_per_step(os.path.join(out, f"{pairs[0][0]}.r1.jsonl"))
    runs = {row: [read_run(os.path.join(out, f"{row}.r{k}.jsonl"), warm, choices) for k in range(1, rounds + 1)]
            for row, _ in pairs}
    table = {}
    print(f"MoE, router skew {skew}: {rounds} rounds (order alternating), medians over steps >= {warm}")
    print(f"{'row':<14} {'tok/s (range)':>22} {'vs reference (interval)':>44} {'dropped/step':>14} {'padding':>8} "
          f"{'max/mean':>8} {'a2a':>6} {'trips':>6} {'loss':>8} {'weights':>8}")
    for row, ref in pairs:
        r, b = runs[row], runs[ref]
        tps = [x["tokens_per_s"] for x in r]
        ratios = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(r, b)]
        med_ratio, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
        said = verdict(row, ref, ratios)
        same = "ref" if row == ref else ("equal" if all(x["weights"] == y["weights"] for x, y in zip(r, b)) else "differ")
        entry = {"reference": ref, "tokens_per_s": tps, "ratio_median": med_ratio, "ratio_min": lo, "ratio_max": hi,
                 "verdict": said, "weights": same}
        for k in ("step_ms", "alltoall_ms", "dropped_per_step", "dropped_share", "padding_share", "max_mean_tokens", "alltoall_share", "round_trips", "final_loss"):
            entry[k] = statistics.median(x[k] for x in r)
        if r[0]["memory"] is not None:  # (round 1's: the peak does not depend on the round)
            entry["memory"] = r[0]["memory"]
        table[row] = entry
        print(f"{row:<14} {statistics.median(tps):>9.0f} ({min(tps):.0f}-{max(tps):.0f}) {said:>44} "
              f"{entry['dropped_per_step']:>6.0f} ({100 * entry['dropped_share']:4.1f}%) {100 * entry['padding_share']:>7.1f}% "
              f"{entry['max_mean_tokens']:>8.2f} {100 * entry['alltoall_share']:>5.1f}% {entry['round_trips']:>6.0f} "
              f"{entry['final_loss']:>8.4f} {same:>8}")
    print(f"  dropped/step: token-expert choices over capacity per step (of {choices}); padding: share of expert rows")
    print("  that are padding;")
    for row, entry in table.items():
        if "memory" in entry:
            print(f"  {row}: {memory_text(entry['memory'])}")
    print("  a2a: the expert AllToAlls' share of the step (median device); trips: the controller's round trips per")
    print("  step (runtime-counted); weights: final weights against the reference row (SPMD with the same semantics)")
    if any(row.startswith("isl_") for row, _ in pairs):
        print("  isl_*: the experts on devices of their own, another island (--expert-island); their a2a is the dense")
        print("  devices' wait for the experts' results (the rows' transfers both ways and the experts' compute);")
        print("  the controller's trips there are one per MoE layer, micro-batch and experts' device")
        isl = {"isl_controller", "isl_worker"} <= runs.keys()
        if isl:
            extra = [(c["step_ms"] - w["step_ms"]) / max(c["round_trips"], 1)
                     for c, w in zip(runs["isl_controller"], runs["isl_worker"])]
            table["isl_round_trip_ms"] = statistics.median(extra)
            print(f"  isl_controller - isl_worker: {statistics.median(extra):.2f} ms ({min(extra):.2f}-{max(extra):.2f}) "
                  "per round trip (step times paired by round, / trips)")
    per_layer = layer_costs(runs, moe_layers(os.path.join(out, f"{pairs[0][0]}.r1.jsonl")))
    if per_layer:
        table["per_moe_layer"] = per_layer
        print(f"  per MoE layer and micro-batch: the devices wait {per_layer['route_wait_ms']:.2f} ms "
              f"({per_layer['route_wait_ms_min']:.2f}-{per_layer['route_wait_ms_max']:.2f}) for the controller's round "
              f"trip (measured on the devices); pw_controller - pw_worker: {per_layer['round_trip_ms']:.2f} ms "
              f"({per_layer['round_trip_ms_min']:.2f}-{per_layer['round_trip_ms_max']:.2f}, step times paired by round, "
              f"/ trips); SPMD dropless: {per_layer['spmd_alltoall_ms']:.2f} ms in its four AllToAlls")
    with open(os.path.join(out, "moe_compare.json"), "w") as f:
        json.dump({"router_skew": float(skew), "rounds": rounds, "warm_steps": warm, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
