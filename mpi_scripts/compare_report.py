#!/usr/bin/env python3
"""Side-by-side report of training runs (mpi_scripts/compare.sh writes the runs, this reads them).

    compare_report.py RESULTS_DIR WORKLOAD_JSON NAME=METRICS.jsonl[,MORE.jsonl...][:TRACE.json[,MORE.json...]] ...

The first run is the reference (SPMD). Several metrics files for one run are rounds of it, given in
the same round order for every run: their step times are pooled (throughput and percentiles over
every step but the first WARMUP_STEPS of every round, whose time is printed apart), and the ratio
against the reference is paired by round with its interval (mpi_scripts/measure.py: the median of
the rounds' ratios, the order-statistic interval beside it, "same within noise" when it holds 1).
A ratio outside its interval's reach of 1 is attributed from the rounds' traces (forward, backward,
gradient reduction, update, rest: ms per step and device). Losses and weights come from the first
round. Prints the table, writes RESULTS_DIR/compare.json and the gnuplot PNGs (loss curves,
throughput bars, a timeline of one step per run, from its last round's trace).
"""
import json
import os
import re
import subprocess
import sys

import measure


# Timeline colours: the controller's waiting and dispatch always grey and black, every other
# activity its own colour (gnuplot's default cycle repeats after 8).
FIXED_COLORS = {"wait": "#c8c8c8", "dispatch": "#000000"}
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
           "#dbdb8d", "#9edae5", "#393b79", "#637939"]

# Steps of each run left out of the steady-state columns (fewer if a run is shorter): the first
# step lowers and allocates, the second still fills a Pathways run's buffer cache.
WARMUP_STEPS = 2


def load_metrics(path):
    steps, vals, final, head = [], [], None, None
    for line in open(path):
        j = json.loads(line)
        if "trainer" in j and "config" in j:
            head = j
        elif j.get("final"):
            final = j
        elif "val_loss" in j:
            vals.append(j)
        elif "loss" in j:
            steps.append(j)
    if final is None:
        raise SystemExit(f"compare: {path} has no final line (the run did not finish)")
    return head, steps, vals, final


# The span that ends a step in each trainer's trace (SPMD: the optimizer; Pathways: the update
# kernel of the fused step, of the chained step, or of the pipeline's stage 0).
STEP_END = ("optimizer", "fused_step", "update", "pipe_update")


def one_step_timeline(trace_path, step_index=-2):
    """Events of one step (the second-to-last full step) per process row, relative to its start."""
    doc = json.load(open(trace_path))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    marks = [e for e in ev if e["name"] in STEP_END]
    if not marks:
        return []
    pid = min(e["pid"] for e in marks)
    ends = sorted(e["ts"] + e["dur"] for e in marks if e["pid"] == pid)
    if len(ends) < 3:
        return []
    t0, t1 = ends[step_index - 1], ends[step_index]
    rows = []
    for e in ev:
        start, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if end > start:
            rows.append((e["pid"], e.get("tid", 0), e["name"], (start - t0) / 1e3, (end - start) / 1e3))
    return rows


percentile = measure.percentile


def gnuplot(script):
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"compare: gnuplot failed: {e}", file=sys.stderr)
        return False


def exchange_lines(table):
    """Replicas (--palm): bytes between the islands per step, the exchange time compute did not
    hide, and the share it hid. A run's exposed exchange is, per device and step, the time from
    the end of its backward pass to the start of its update not spent in kernels (waiting for the
    other island's gradients; pathways_train's xchg_exposed_ms), which includes waiting for a
    slower island's backward; its tail (xchg_tail_ms) starts only when the last island's backward
    has ended, so it is the transfer that compute did not hide. Fused exchanges only after its
    whole backward, so its tail is the exchange's whole duration; the hidden share of another
    run is 1 - its tail / fused's (same run of the script, same link)."""
    key = "xchg_tail_ms" if any("xchg_tail_ms" in t for t in table) else "xchg_exposed_ms"
    full = next((t[key] for t in table if "fused" in t["name"] and key in t), None)
    for t in table:
        parts = []
        if "dcn_bytes_per_step" in t:
            parts.append(f"between islands {t['dcn_bytes_per_step'] / 1e6:.2f} MB/step")
        if "xchg_exposed_ms" in t:
            share = f" ({100 * t['xchg_exposed_ms'] / t['step_ms_p50']:.1f}% of its p50 step)" if t.get("step_ms_p50") else ""
            parts.append(f"exchange exposed {t['xchg_exposed_ms']:.1f} ms/step{share}")
        if "xchg_tail_ms" in t:
            parts.append(f"after the last island's backward {t['xchg_tail_ms']:.1f} ms/step")
        if key in t and full:
            t["exchange_hidden_share"] = max(0.0, 1.0 - t[key] / full)
            parts.append(f"hidden {100 * t['exchange_hidden_share']:.0f}% (of fused's {full:.1f} ms)")
        if "memory" in t:
            parts.append(memory_text(t["memory"]))
        elif "peak_rss_bytes" in t:
            parts.append(f"peak RSS {t['peak_rss_bytes'] / 2**20:.0f} MiB/rank, model state {t['state_bytes'] / 2**20:.1f} MiB/device")
        if parts:
            print(f"{'':>12}  {t['name']}: " + ", ".join(parts))


MEMORY_PARTS = (("state", "state_bytes", "model state"), ("activations", "memory_activations_bytes", "activations"),
                ("in_flight", "memory_in_flight_bytes", "micro-batches in flight"), ("moe", "memory_moe_bytes", "MoE rows"),
                ("gathers", "memory_gathers_bytes", "FSDP gathers"),
                ("runtime", "memory_runtime_bytes", "runtime intermediates"))


def memory_breakdown(f):
    """The largest rank's peak RSS by part (bytes): the model state as measured (state_bytes), the
    other parts as the trainer's memory estimate counts them (train/memory.cc), and what neither
    accounts for: the process (MPI, libraries, data), the allocator's and the buffer cache's freed
    memory, and the estimate's error. None without the figures."""
    if "peak_rss_bytes" not in f or "memory_activations_bytes" not in f:
        return None
    parts = {k: f.get(key, 0.0) for k, key, _ in MEMORY_PARTS}
    parts["peak_rss"] = f["peak_rss_bytes"]
    parts["unattributed"] = f["peak_rss_bytes"] - sum(f.get(key, 0.0) for _, key, _ in MEMORY_PARTS)
    # Every rank's own peak beside the largest: spmd_train's per rank, the MPMD trainers' per
    # device, pathways_train's controller.
    for unit in ("rank", "device"):
        if f.get(f"peak_resident_bytes_per_{unit}"):
            parts[f"per_{unit}"] = f[f"peak_resident_bytes_per_{unit}"]
    if "controller_peak_rss_bytes" in f:
        parts["controller"] = f["controller_peak_rss_bytes"]
    return parts


def memory_text(m):
    mib = lambda b: f"{b / 2**20:.0f}"
    shown = [f"{label} {mib(m[k])}" for k, _, label in MEMORY_PARTS if m[k] > 0]
    ranks = "".join(f"; each {unit} " + " ".join(mib(x) for x in m[f"per_{unit}"])
                    for unit in ("rank", "device") if m.get(f"per_{unit}"))
    if "controller" in m:
        ranks += f", controller {mib(m['controller'])}"
    return (f"peak RSS {mib(m['peak_rss'])} MiB/rank = " + " + ".join(shown) +
            f" + unattributed {mib(m['unattributed'])} ({100 * m['unattributed'] / m['peak_rss']:.0f}%)" + ranks)


def verdict_lines(table, ref):
    """What the ratios support, a line per run, and where a difference outside the noise comes from."""
    n = ref["rounds"]
    if n > 1:
        cov = table[1]["vs_spmd"]["coverage"] if len(table) > 1 else 0
        print(f"{'':>12}  vs spmd: the median of the {n} rounds' paired ratios (each round ran every trainer back to "
              f"back, the order reversed every other round); interval: the rounds' order statistics covering the "
              f"median with {100 * cov:.0f}% confidence (mpi_scripts/measure.py); tokens/s and p50/p90 pool the rounds' steps")
    for t in table[1:]:
        print(f"{'':>12}  {t['verdict']}")
        if n > 1:
            print(f"{'':>14}per round: " + " ".join(f"{x:.3f}" for x in t["tokens_per_s_vs_spmd_per_round"]))
        if t["vs_spmd"]["same_within_noise"] is False:
            print(f"{'':>14}" + measure.attribution(t["name"], table[0]["name"], t["breakdown"], table[0]["breakdown"]))


def main():
    out_dir, workload = sys.argv[1], json.loads(open(sys.argv[2]).read())
    specs = []
    for arg in sys.argv[3:]:
        name, paths = arg.split("=", 1)
        metrics, _, traces = paths.partition(":")
        specs.append((name, metrics, [t for t in traces.split(",") if t]))
    runs = []
    for name, metrics, traces in specs:
        files = metrics.split(",")
        head, steps, vals, final = load_metrics(files[0])
        # Steady state: every step but each round's first WARMUP_STEPS (lowering, first
        # allocations: a Pathways run's buffer cache fills over its first steps); their time is
        # reported on a line of its own.
        loaded = [load_metrics(f) for f in files]
        all_ms = [[s["step_ms"] for s in m[1]] for m in loaded]
        # The peak each round's run ended with (its highest model-shape GEMM probe, or its fastest
        # step's rate if that was higher: docs/train.md, "MFU"); the report takes the rounds' highest.
        peaks = [(m[3].get("peak_gflops_per_rank", 0.0), m[3].get("peak_source", "")) for m in loaded]
        if min(len(r) for r in all_ms) == 0:
            sys.exit(f"compare_report: a metrics file of run '{name}' has no step lines ({metrics}); "
                     f"did the trainer fail? Its log is next to it")
        skip = min(WARMUP_STEPS, min(len(r) for r in all_ms) - 1)  # at least one step stays
        per_round = [r[skip:] for r in all_ms]
        pooled = [v for r in per_round for v in r]
        bds = [b for b in (measure.step_breakdown(t) for t in traces if os.path.exists(t)) if b]
        breakdown = {k: sum(b.get(k, 0.0) for b in bds) / len(bds) for k in bds[0]} if bds else None
        runs.append(dict(name=name, head=head, steps=steps, vals=vals, final=final, peak=max(peaks),
                         trace=traces[-1] if traces else "", breakdown=breakdown,
                         step_ms=pooled, round_p50=[percentile(r, 0.5) for r in per_round], rounds=len(files),
                         warmup_steps=skip, warmup_ms=percentile([sum(r[:skip]) for r in all_ms], 0.5)))
    # The trainers' MFU is against the peak measured before the runs; the report's is against
    # the higher of the peaks measured before and after them (workload.json).
    def mfu(r, tps):
        """The pooled median step's model FLOP rate over the run's highest peak per rank: at most 1,
        since every run's peak is at least its fastest step's rate."""
        peak, ranks = r["peak"][0], r["head"].get("ranks", 0)
        if peak <= 0 or not ranks:
            return r["final"]["mfu"] * tps / r["final"]["tokens_per_s"]  # (a run without the peak fields)
        return tps * r["head"]["flops_per_token"] / (ranks * peak * 1e9)
    ref = runs[0]
    ref_loss = {s["step"]: s["loss"] for s in ref["steps"]}
    table = []
    for r in runs:
        f = r["final"]
        diffs = [abs(s["loss"] - ref_loss[s["step"]]) for s in r["steps"] if s["step"] in ref_loss]
        share = f.get("comm_share", 0.0)
        p50, p90 = percentile(r["step_ms"], 0.5), percentile(r["step_ms"], 0.9)
        cfg = r["head"]["config"]
        tokens_per_step = cfg["batch"] * int(re.search(r"seq_len=(\d+)", cfg["model"]).group(1))
        tps = tokens_per_step / (p50 * 1e-3)  # over the pooled median step
        # Paired by round: step time of the reference over this run's, per round (same tokens per step).
        ratio = measure.paired_ratio(ref["round_p50"], r["round_p50"], higher_is_better=False)
        # The core's fp32 FMA peak (model/fma_probe.h), for fp32 runs that measured it: MFU against
        # the hardware, beside the GEMM probe's.
        fma = f.get("fma_peak_gflops_per_core", 0.0) if "mfu_fma" in f else 0.0
        ranks = r["head"].get("ranks", 0)
        row = dict(name=r["name"], tokens_per_s=tps, tokens_per_s_vs_spmd=ratio.median,
                   round_tokens_per_s=[tokens_per_step / (ms * 1e-3) for ms in r["round_p50"]],
                   params=r["head"].get("params"),
                   mfu_fma=tps * r["head"]["flops_per_token"] / (ranks * fma * 1e9) if fma and ranks else None,
                   fma_peak_gflops_per_core=fma or None,
                   tokens_per_s_vs_spmd_per_round=ratio.per_round, vs_spmd=ratio.as_dict(),
                   verdict=ratio.verdict(r["name"], ref["name"]), breakdown=r["breakdown"],
                   step_ms_p50=p50, step_ms_p90=p90,
                   mfu=mfu(r, tps), peak_gflops_per_rank=r["peak"][0], peak_source=r["peak"][1],
                   comm_or_dispatch_share=share,
                   rounds=r["rounds"], steps_pooled=len(r["step_ms"]),
                   warmup_steps=r["warmup_steps"], warmup_ms=r["warmup_ms"],
                   final_loss=f["final_loss"], val_loss=f["final_val_loss"],
                   max_abs_loss_diff_vs_spmd=max(diffs) if diffs else None,
                   weights_hash=f["weights_hash"],
                   weights_identical=f["weights_hash"] == ref["final"]["weights_hash"])
        for k in ("bubble", "bubble_bound", "dcn_bytes_per_step", "xchg_exposed_ms", "xchg_tail_ms", "peak_rss_bytes", "state_bytes",
                  "peak_resident_bytes_per_rank", "state_bytes_per_rank",
                  "stages", "stage_dp", "stage_tp", "stage_islands", "peak_intermediate_bytes", "peak_store_bytes"):
            if k in f:
                row[k] = f[k]
        if (m := memory_breakdown(f)) is not None:
            row["memory"] = m
        table.append(row)
    cols = ["run", "tokens/s", "vs spmd", "interval", "p50 ms", "p90 ms", "MFU", "comm|disp", "train loss", "val loss",
            "max|dloss|", "same weights"]
    if workload.get("cluster", "one host") != "one host":
        print(f"cluster: {workload['cluster']}")
    print("  ".join(f"{c:>12}" for c in cols))
    for t in table:
        d = t["max_abs_loss_diff_vs_spmd"]
        print("  ".join(f"{v:>12}" for v in [
            t["name"], f"{t['tokens_per_s']:.0f}", f"{t['tokens_per_s_vs_spmd']:.3f}x",
            "-" if t is table[0] or t["vs_spmd"]["lo"] is None else f"{t['vs_spmd']['lo']:.2f}-{t['vs_spmd']['hi']:.2f}",
            f"{t['step_ms_p50']:.1f}", f"{t['step_ms_p90']:.1f}", f"{100 * t['mfu']:.1f}%",
            f"{100 * t['comm_or_dispatch_share']:.1f}%", f"{t['final_loss']:.4f}", f"{t['val_loss']:.4f}",
            "-" if d is None else f"{d:.2e}", "yes" if t["weights_identical"] else ("no*" if "stages" in t else "no")]))
        if "stages" in t:
            print(f"{'':>12}  pipeline layout: {t['stages']:.0f} stages of dp={t['stage_dp']:.0f} x tp={t['stage_tp']:.0f} "
                  f"devices on islands {[int(i) for i in t['stage_islands']]}")
        if "stages" in t and not t["weights_identical"]:
            print(f"{'':>12}  *by design: the pipeline sums the tied embedding's gradient as (head parts) + (lookup "
                  f"parts), not per micro-batch (fp32: within 1e-5 relative of spmd, ctest pipeline_matches_spmd; "
                  f"bf16 rounds the products' operands, so the difference grows)")
        if "bubble" in t:
            print(f"{'':>12}  pipeline bubble {100 * t['bubble']:.1f}% (bound (S-1)/(M+S-1) = {100 * t['bubble_bound']:.1f}%)")
        if "peak_intermediate_bytes" in t and "stages" in t:
            print(f"{'':>12}  peak intermediates per stage (MiB): "
                  + " ".join(f"{b / 2**20:.1f}" for b in t["peak_intermediate_bytes"])
                  + "; object-store high-water per stage (MiB): " + " ".join(f"{b / 2**20:.1f}" for b in t["peak_store_bytes"]))
    exchange_lines(table)
    verdict_lines(table, ref)
    if any(t["warmup_steps"] for t in table):
        print(f"{'':>12}  warm-up, the first steps of a run (not in the columns above), ms: "
              + " ".join(f"{t['name']} {t['warmup_ms']:.0f} ({t['warmup_steps']} step{'s' if t['warmup_steps'] != 1 else ''})" for t in table)
              + (" (median over the rounds)" if ref["rounds"] > 1 else ""))
    if any(t["warmup_steps"] < WARMUP_STEPS for t in table):
        print(f"{'':>12}  note: runs this short keep (some of) their {WARMUP_STEPS} warm-up steps in the columns; "
              f"use --steps {WARMUP_STEPS + 5} or more for steady-state figures")
    if any(t["peak_gflops_per_rank"] for t in table):
        print(f"{'':>12}  MFU: the median step's model FLOPs against the run's own GEMM peak per rank, the highest of its "
              f"rounds (docs/train.md, \"MFU\"): " + "; ".join(
                  f"{t['name']} {t['peak_gflops_per_rank']:.1f} GFLOP/s ({t['peak_source']})" for t in table))
    doc = {"workload": workload, "runs": table}
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(doc, f, indent=1)

    # Plots.
    data = os.path.join(out_dir, "plot_data")
    os.makedirs(data, exist_ok=True)
    for r in runs:
        with open(os.path.join(data, f"loss_{r['name']}.dat"), "w") as f:
            for s in r["steps"]:
                f.write(f"{s['step'] + 1} {s['loss']}\n")
    with open(os.path.join(data, "throughput.dat"), "w") as f:
        for i, t in enumerate(table):
            f.write(f"{i} \"{t['name']}\" {t['tokens_per_s']}\n")
    plots = ", ".join(f"'{data}/loss_{r['name']}.dat' using 1:2 with linespoints title '{r['name']}'" for r in runs)
    gnuplot(f"""set terminal pngcairo size 900,500 noenhanced
set output '{out_dir}/loss.png'
set title 'Training loss'
set xlabel 'step'; set ylabel 'loss'; set grid
plot {plots}
""")
    gnuplot(f"""set terminal pngcairo size 900,500 noenhanced
set output '{out_dir}/throughput.png'
set title 'Throughput (tokens/s, median step)'
set style fill solid 0.6; set boxwidth 0.6; set grid ytics; set yrange [0:*]
plot '{data}/throughput.dat' using 1:3:xtic(2) with boxes notitle, '' using 1:3:(sprintf("%.0f",$3)) with labels offset 0,1 notitle
""")
    # Timeline of one step per run: one panel per run, a row per (process, thread).
    panels = [(r, one_step_timeline(r["trace"])) for r in runs if r["trace"] and os.path.exists(r["trace"])]
    panels = [(r, rows) for r, rows in panels if rows]
    if panels:
        script = [f"set terminal pngcairo size 1100,{260 * len(panels)}", f"set output '{out_dir}/timeline.png'",
                  f"set multiplot layout {len(panels)},1", "set style fill solid 0.8", "set termoption noenhanced",
                  "set xlabel 'ms since the step started'"]
        # One colour per activity across the panels (a block_fwd looks the same in every run).
        all_kinds = sorted({name.split()[0] for _, rows in panels for *_, name, _, _ in rows} - set(FIXED_COLORS))
        color_of = dict(FIXED_COLORS, **{k: PALETTE[i % len(PALETTE)] for i, k in enumerate(all_kinds)})
        for r, rows in panels:
            lanes = sorted({(p, t) for p, t, *_ in rows})
            lane_of = {l: i for i, l in enumerate(lanes)}
            kinds = {}
            for p, t, name, start, dur in rows:
                kinds.setdefault(name.split()[0], []).append((start, start + dur, lane_of[(p, t)]))
            plots = []
            for i, (kind, boxes) in enumerate(sorted(kinds.items())):
                color = color_of[kind]
                path = os.path.join(data, f"timeline_{r['name']}_{i}.dat")
                with open(path, "w") as f:
                    for a, b, y in boxes:
                        f.write(f"{a} {b} {y - 0.35} {y + 0.35}\n")
                plots.append(f"'{path}' using (($1+$2)/2):(($3+$4)/2):1:2:3:4 with boxxyerror lc rgb '{color}' title '{kind}'")
            ytics = ", ".join(f"'rank {p}{'' if t == 0 else ' / comm' if t == 1 else f' / {t}'}' {i}"
                              for (p, t), i in lane_of.items())
            script += [f"set title 'one step: {r['name']}'", f"set ytics ({ytics})",
                       f"set yrange [-0.6:{len(lanes) - 0.4}]", "set key outside right",
                       "plot " + ", ".join(plots)]
        script.append("unset multiplot")
        gnuplot("\n".join(script) + "\n")
    print(f"\nwrote {out_dir}/compare.json, loss.png, throughput.png" + (", timeline.png" if panels else ""))


if __name__ == "__main__":
    main()
