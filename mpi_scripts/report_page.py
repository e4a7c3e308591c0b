#!/usr/bin/env python3
"""Builds the report's page and JSON from the studies' own outputs (issue 60; docs/report.md).

    report_page.py DIR                          DIR/report.json and DIR/index.html
    report_page.py --validate REPORT.json SCHEMA.json   report.json against the schema (jsonschema)

DIR is mpi_scripts/report.sh's folder: meta.json (machine, commit, command), commands.txt and one
folder per study, each holding what its script wrote (compare.json, moe-skew*/moe_compare.json,
pipeline_bench.json, failure_bench.json, dispatch_*.json, validation.json and projection.json), its
log.txt, command.txt and status.txt ("EXIT_CODE SECONDS"). Nothing is measured or recomputed here
beyond reading those files: the ratios, intervals and verdicts are the scripts' own
(mpi_scripts/measure.py's Ratio dicts; dispatch_plot.paired_ratios for dispatch_bench's rounds).

The first section is written from the numbers: every ratio against a reference that has an
interval becomes "won" (its interval above 1), "lost" (below 1) or "tied" (the interval holds 1);
one without an interval (one round) says so. The simulator's projection at the paper's scale is
read from projection.json with its band. The page is self-contained: inline CSS, the scripts' PNG
plots as data URIs, an inline SVG of the ratios, no script; links point to the raw files beside it.
"""
import base64
import glob
import html
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_report  # noqa: E402
import dispatch_plot  # noqa: E402
import measure  # noqa: E402
import scale_report  # noqa: E402

TITLES = {
    "compare": "The three execution models on the dense model (compare.sh)",
    "moe": "Mixture of Experts (compare.sh --moe)",
    "pipeline": "The MPMD pipeline (pipeline_bench.sh)",
    "failure": "Goodput under failures (failure_bench.sh)",
    "dispatch": "Pathways dispatch, paper Fig. 5-8 (dispatch_bench.sh)",
    "sim": "The simulator: validation and projection (sim_validate.sh, sim/project.py)",
    "size": "The execution models across model sizes, and PyTorch DDP (scale_bench.sh)",
}
# The dated pages of docs/results/ that each section reproduces (each page names its section).
REPRODUCES = {
    "compare": ["docs/results/compare.md", "docs/results/memory.md", "docs/results/mpmd.md", "docs/results/static_mpmd.md"],
    "moe": ["docs/results/moe.md"],
    "pipeline": ["docs/results/pipeline.md"],
    "failure": ["docs/results/failures.md"],
    "dispatch": ["docs/results/dispatch.md"],
    "sim": ["docs/results/simulator.md"],
    "size": ["docs/results/scale.md"],
}


def read_text(path):
    """The file's text, or "" when it is not there."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def outcome(median, lo, hi):
    """won | lost | tied | no interval, from a ratio (> 1: the candidate is faster) and its interval."""
    if lo is None or hi is None:
        return "no interval"
    if lo > 1.0:
        return "won"
    if hi < 1.0:
        return "lost"
    return "tied"


def fmt(v, p=3):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{p}f}"
    return str(v)


def verdict_entry(study, cand, ref, median, lo, hi, coverage, what, group=""):
    """One ratio of a study; `group` gathers many rows of one kind in the first section (dispatch's
    rows by mode)."""
    return {"study": study, "candidate": cand, "reference": ref, "median": median, "lo": lo, "hi": hi,
            "coverage": coverage, "outcome": outcome(median, lo, hi), "what": what, "group": group}


def ratio_text(v):
    iv = "no interval" if v["lo"] is None else f"{v['lo']:.3f}-{v['hi']:.3f}"
    return f"{v['median']:.3f}x ({iv})"


# --- per study: tables, verdicts and notes from its outputs ---

def study_compare(d, s):
    doc = read_json(os.path.join(d, "compare.json"))
    if not doc:
        return
    w = doc["workload"]
    s["metrics"]["where"] = w["cluster"]
    s["notes"].append(f"Model: {w['model']}; {w['compute_ranks']} compute ranks, {w['steps']} steps a run, "
                      f"{w['batch_per_rank']} sequences per rank, precision {w.get('precision', 'fp32')}; "
                      f"where: {w['cluster']}."
                      + (f" Trainer flags added: {' '.join(w['extra_flags'])}." if w.get("extra_flags") else ""))
    rows = []
    ref = doc["runs"][0]["name"]
    for t in doc["runs"]:
        v = t.get("vs_spmd", {})
        rows.append([t["name"], fmt(t["tokens_per_s"], 0), fmt(t["tokens_per_s_vs_spmd"]),
                     "-" if t is doc["runs"][0] or v.get("lo") is None else f"{v['lo']:.3f}-{v['hi']:.3f}",
                     t.get("verdict", "reference") if t is not doc["runs"][0] else "reference",
                     fmt(t["step_ms_p50"], 1), f"{100 * t['mfu']:.1f}%", fmt(t["final_loss"], 4),
                     fmt(t.get("max_abs_loss_diff_vs_spmd"), 6), fmt(t["weights_identical"]), str(t["rounds"])])
        if t is not doc["runs"][0] and v:
            s["verdicts"].append(verdict_entry("compare", t["name"], ref, v["median"], v.get("lo"), v.get("hi"),
                                               v.get("coverage"), "tokens/s, paired by round"))
    s["tables"].append({"caption": "Tokens/s against spmd: the median of the rounds' paired ratios, its interval "
                                   "and the script's verdict (mpi_scripts/measure.py)",
                        "columns": ["run", "tokens/s", "vs spmd", "interval", "verdict", "p50 step ms", "MFU",
                                    "final loss", "max |dloss|", "same weights", "rounds"],
                        "rows": rows})
    for t in doc["runs"]:
        if t.get("bubble") is not None:
            s["notes"].append(f"{t['name']}: bubble {100 * t['bubble']:.1f}% against the bound (S-1)/(M+S-1) = "
                              f"{100 * t['bubble_bound']:.1f}%.")
        if t.get("vs_spmd", {}).get("same_within_noise") is False and t.get("breakdown") and doc["runs"][0].get("breakdown"):
            s["notes"].append(measure.attribution(t["name"], ref, t["breakdown"], doc["runs"][0]["breakdown"]))
    memory_table(doc["runs"], s)
    s["traces"] += sorted(glob.glob(os.path.join(d, "*.trace.json")))


def memory_table(runs, s):
    """The largest rank's peak RSS of each run against the first's (spmd), and its parts as
    compare_report.py splits it (its `memory` dict: the measured model state, the trainer's
    estimate of the rest, and what neither accounts for). Nothing when no run has the figure."""
    if not any("peak_rss_bytes" in t for t in runs):
        return
    parts = compare_report.MEMORY_PARTS
    shown = [p for p in parts if any(t.get("memory", {}).get(p[0], 0) > 0 for t in runs)]
    mib = lambda b: f"{b / 2**20:.0f}"
    ref = runs[0].get("peak_rss_bytes")
    rows, ratios = [], {}
    for t in runs:
        peak, m = t.get("peak_rss_bytes"), t.get("memory")
        if peak is None:
            rows.append([t["name"]] + ["-"] * (len(shown) + 3))
            continue
        if ref:
            ratios[t["name"]] = peak / ref
        row = [t["name"], mib(peak), f"{peak / ref:.2f}x" if ref else "-"]
        row += [mib(m[k]) if m else "-" for k, _, _ in shown]
        row.append(f"{mib(m['unattributed'])} ({100 * m['unattributed'] / peak:.0f}%)" if m else "-")
        rows.append(row)
    s["tables"].append({"caption": "Peak RSS per rank (the largest rank's, MiB) against spmd's, and its parts: the "
                                   "model state as measured, the rest as the trainer's memory estimate counts "
                                   "it (train/memory.cc); unattributed: the process (MPI, libraries), freed "
                                   "memory the allocator and buffer cache keep, and the estimate's error",
                        "columns": ["run", "peak RSS", "vs spmd"] + [label for _, _, label in shown] + ["unattributed"],
                        "rows": rows})
    s["metrics"]["peak_rss_vs_spmd"] = ratios


def study_moe(d, s):
    for sub in sorted(glob.glob(os.path.join(d, "moe-skew*"))):
        doc = read_json(os.path.join(sub, "moe_compare.json"))
        if not doc:
            continue
        rows = []
        for name, e in doc["rows"].items():
            if not isinstance(e, dict) or "ratio_median" not in e:
                continue
            tps = sorted(e["tokens_per_s"])
            rows.append([name, e["reference"], fmt(tps[len(tps) // 2], 0), fmt(e["ratio_median"]),
                         f"{e['ratio_min']:.3f}-{e['ratio_max']:.3f}", e["verdict"], fmt(e["dropped_share"] * 100, 1) + "%",
                         fmt(e["alltoall_share"] * 100, 1) + "%", fmt(e["round_trips"], 0), fmt(e["final_loss"], 4), e["weights"]])
            if name != e["reference"]:
                lo, hi = (e["ratio_min"], e["ratio_max"]) if doc["rounds"] > 1 else (None, None)
                s["verdicts"].append(verdict_entry("moe", f"{name} (skew {doc['router_skew']:g})", e["reference"],
                                                   e["ratio_median"], lo, hi,
                                                   measure.median_interval(e["tokens_per_s"])[2]
                                                   if measure.median_interval(e["tokens_per_s"]) else None,
                                                   "tokens/s, paired by round (the rounds' range)"))
        s["tables"].append({"caption": f"Router skew {doc['router_skew']:g}: {doc['rounds']} rounds, medians over the "
                                       f"steps from {doc['warm_steps']} on; each row against the SPMD row of the same "
                                       "semantics",
                            "columns": ["row", "reference", "tokens/s", "vs reference", "rounds' range", "verdict",
                                        "dropped", "AllToAll share", "round trips", "final loss", "weights"],
                            "rows": rows})


def study_pipeline(d, s):
    doc = read_json(os.path.join(d, "pipeline_bench.json"))
    if not doc:
        return
    rows = []
    for key, j in doc["runs"].items():
        where, name = key.split("/", 1)
        v = j.get("vs_spmd")
        rows.append([where, name, fmt(j["tokens_per_s"], 0), fmt(v["median"]) if v else "reference",
                     "-" if not v or v.get("lo") is None else f"{v['lo']:.3f}-{v['hi']:.3f}",
                     "-" if "bubble" not in j else f"{100 * j['bubble']:.1f}%",
                     "-" if "bubble_bound" not in j else f"{100 * j['bubble_bound']:.1f}%",
                     " ".join(f"{x / 2**20:.1f}" for x in j.get("peak_intermediate_bytes", [])) or "-"])
        if v:
            s["verdicts"].append(verdict_entry("pipeline", f"{name} ({where})", "spmd_train on its devices",
                                               v["median"], v.get("lo"), v.get("hi"), v.get("coverage"),
                                               "tokens/s, paired by round"))
    s["tables"].append({"caption": "Each pipeline against spmd_train on the same devices (the median of the rounds' "
                                   "paired ratios, its interval), the measured bubble against its bound",
                        "columns": ["where", "run", "tokens/s", "vs spmd", "interval", "bubble", "bound",
                                    "peak intermediates per stage (MiB)"],
                        "rows": rows})
    # An inline SVG of the bubble against the bound (the pipeline rows).
    bars = [(f"{k.split('/', 1)[1]}", j["bubble"], j["bubble_bound"]) for k, j in doc["runs"].items() if "bubble" in j]
    if bars:
        s["svgs"].append(("Measured bubble (bar) against the bound (S-1)/(M+S-1) (line)", bubble_svg(bars)))


def study_failure(d, s):
    doc = read_json(os.path.join(d, "failure_bench.json"))
    if not doc:
        return
    rows = []
    for r in doc["rows"]:
        m = r.get("median_recovery") or {}
        rows.append([r["trainer"], fmt(r["free"]["wall_s"], 1), fmt(r["faulty"]["wall_s"], 1), fmt(r["goodput"]),
                     str(r["faulty"]["faults"]), str(r["faulty"]["restarts"]), fmt(m.get("detect_s"), 1),
                     fmt(m.get("restart_s"), 1), fmt(m.get("replayed"), 0), fmt(r["same_weights"])])
    s["notes"].append(f"Mean time between faults {doc['mtbf_s']:g} s, {doc['steps']} steps, a checkpoint every "
                      f"{doc['ckpt_every']} steps. Goodput: the fault-free run's wall time over the faulty run's; one "
                      "faulty run per trainer (the faults are random: no interval).")
    s["tables"].append({"caption": "Goodput under random rank kills, restarted from the newest checkpoint",
                        "columns": ["trainer", "fault-free s", "faulty s", "goodput", "faults", "restarts",
                                    "detect s", "restart s", "steps replayed", "same weights"],
                        "rows": rows})
    pts = [(r["trainer"], r["goodput"]) for r in doc["rows"] if r.get("goodput") is not None]
    if pts:
        s["svgs"].append((f"Goodput at MTBF {doc['mtbf_s']:g} s", bars_svg(pts, 1.0, "goodput")))
    s["metrics"]["goodput"] = {r["trainer"]: r["goodput"] for r in doc["rows"]}


def study_dispatch(d, s):
    for p in sorted(glob.glob(os.path.join(d, "dispatch_*.json"))):
        doc = read_json(p)
        if not doc or "rows" not in doc:
            continue
        label, _ = dispatch_plot.label_of(p, doc)
        rows = []
        for r, ratio in dispatch_plot.paired_ratios(doc):
            v = ratio.as_dict()
            name = dispatch_plot.row_name(r)
            rows.append([name, fmt(r.get("computations_per_s"), 0), fmt(v["median"]),
                         "-" if v["lo"] is None else f"{v['lo']:.3f}-{v['hi']:.3f}",
                         ratio.verdict(name, "spmd")])
            group = f"Fig. 8 (multi-tenancy)" if str(r.get("fig")) == "8" else f"Fig. 5/6 {r.get('mode')}"
            s["verdicts"].append(verdict_entry("dispatch", f"{name} [{label}]", "spmd", v["median"], v["lo"], v["hi"],
                                               v["coverage"], "computations/s, paired by round", group))
        if rows:
            s["tables"].append({"caption": f"{label} ({os.path.basename(p)}): every Pathways row against SPMD at the "
                                           "same T, the median of the rounds' paired ratios",
                                "columns": ["row", "computations/s", "vs spmd", "interval", "verdict"], "rows": rows})


def study_sim(d, s):
    val = read_json(os.path.join(d, "validation.json"))
    if val:
        rows = [[r["config"], fmt(r["measured"], 3), fmt(r["predicted"], 3), r["unit"],
                 "-" if r.get("error") is None else f"{100 * r['error']:+.1f}%",
                 "-" if not r.get("interval") else f"{r['interval'][0]:.3f}-{r['interval'][1]:.3f}",
                 fmt(r.get("inside"))] for r in val["rows"]]
        s["tables"].append({"caption": "Predicted against measured on this machine (sim_validate.sh): signed error, "
                                       "the measured interval over the launches and whether the prediction is inside",
                            "columns": ["configuration", "measured", "predicted", "unit", "error", "interval", "inside"],
                            "rows": rows})
        s["metrics"]["validation_rows"] = len(val["rows"])
    proj = read_json(os.path.join(d, "projection.json"))
    if proj:
        rows = [[t["config"], fmt(t["tokens_per_s"], 0), fmt(t["relative_to_spmd"]),
                 f"{t['relative_band'][0]:.3f}-{t['relative_band'][1]:.3f}", fmt(t.get("paper_relative"))]
                for t in proj["table2"]]
        s["tables"].append({"caption": "Projection at the paper's scale, Table 2 (a 3B LM on 128 TPU v3 cores): "
                                       "tokens/s relative to SPMD with the validation's band, beside the paper's",
                            "columns": ["configuration", "tokens/s", "vs SPMD", "band", "paper"], "rows": rows})
        f6 = [[str(r.get("hosts")), fmt(r.get("opbyop_break_even_us"), 1), fmt(r.get("chained_break_even_us"), 1),
               fmt(r.get("fused_break_even_us"), 1),
               "-" if not r.get("chained_break_even_band_us") else
               f"{r['chained_break_even_band_us'][0]:.1f}-{r['chained_break_even_band_us'][1]:.1f}"]
              for r in proj["fig6"]]
        s["tables"].append({"caption": "Fig. 6 projected: the break-even compute time T (us) against the hosts",
                            "columns": ["hosts", "opbyop", "chained", "fused", "chained band"], "rows": f6})
        p = proj["palm"]
        s["metrics"]["projection"] = {"palm_weak_scaling": p["weak_scaling"], "palm_band": p["weak_scaling_band"],
                                      "palm_paper": p["paper"],
                                      "table2": {t["config"]: t["relative_to_spmd"] for t in proj["table2"]}}


def study_size(d, s):
    doc = read_json(os.path.join(d, "scale.json"))
    if not doc:
        return
    # scale_report.py's own tables (the same cells as its scale.md).
    sizes = [{"size": z["size"], "rows": {r["name"]: r for r in z["runs"]}, "ddp_rows": z["ddp"]} for z in doc["sizes"]]
    s["notes"].append(f"CPU: {doc['cpu']}. Per size: " + "; ".join(
        f"{z['size']}: batch {z['workload']['batch']} on {z['workload']['compute_ranks']} ranks, "
        f"{z['workload']['steps']} steps a run (the first 2 are warm-up), the pipeline at "
        f"{z['workload']['pipeline_microbatches']} micro-batches" for z in doc["sizes"]) + ".")
    s["tables"].append({"caption": "Each trainer at each size against spmd at that size (the median of the rounds' "
                                   "paired ratios, its interval); MFU against the run's GEMM peak and the core's fp32 "
                                   "FMA peak; ms columns: per step and device, from the traces",
                        "columns": scale_report.TRAINER_HEAD, "rows": scale_report.trainer_rows(sizes)})
    for z in doc["sizes"]:
        for r in z["runs"]:
            v = r.get("vs_spmd") or {}
            if r["name"] != "spmd" and v.get("median") is not None:
                s["verdicts"].append(verdict_entry("size", f"{r['name']} ({z['size']})", "spmd", v["median"], v.get("lo"),
                                                   v.get("hi"), v.get("coverage"), "tokens/s, paired by round",
                                                   f"size {z['size']}"))
    ddp = scale_report.ddp_cells(sizes, strong="no")
    if ddp:
        s["tables"].append({"caption": f"spmd_train against PyTorch DDP (gloo, one thread a rank; bf16: autocast "
                                       f"against --precision bf16), paired by round; the issue's target is "
                                       f"{scale_report.TARGET}x", "columns": scale_report.DDP_HEAD, "rows": ddp})
    for z in doc["sizes"]:
        for r in z["ddp"]:
            v = r["ratio"]
            s["verdicts"].append(verdict_entry("size", f"{r['ours']} ({z['size']})", r["name"], v["median"], v.get("lo"),
                                               v.get("hi"), v.get("coverage"), "tokens/s against DDP, paired by round",
                                               "against DDP"))
    s["metrics"]["spmd_over_ddp"] = {f"{z['size']} {r['name']}": r["ratio"]["median"] for z in doc["sizes"] for r in z["ddp"]}
    misses = [f"{z['size']} {r['name']} {r['ratio']['median']:.2f}x" for z in doc["sizes"] for r in z["ddp"]
              if not r["meets_target"]]
    if not any(z["ddp"] for z in doc["sizes"]):
        s["notes"].append("No DDP rows: the sweep ran without the PyTorch peer (scale_bench.sh --no-ddp; report.sh "
                          "passes it when ../shared/peers/torch_ddp_bench.py or PWM_TORCH_DDP_PEER is missing).")
    else:
        s["notes"].append(f"spmd_train >= {scale_report.TARGET}x DDP: " +
                          ("at every size and precision." if not misses else "not at " + ", ".join(misses) + "."))
    s["traces"] += sorted(glob.glob(os.path.join(d, "*", "*.trace.json")))


EXTRACT = {"compare": study_compare, "moe": study_moe, "pipeline": study_pipeline, "failure": study_failure,
           "dispatch": study_dispatch, "sim": study_sim, "size": study_size}


# --- inline SVG (drawn here from the report's numbers) ---

def esc(x):
    return html.escape(str(x), quote=True)


def ratio_svg(verdicts):
    """Each ratio with its interval, on a log-free linear axis around 1."""
    vs = [v for v in verdicts if v["median"] is not None]
    lo = min([v["lo"] if v["lo"] is not None else v["median"] for v in vs] + [0.9])
    hi = max([v["hi"] if v["hi"] is not None else v["median"] for v in vs] + [1.1])
    W, left, rowh = 900, 330, 18
    H = 30 + rowh * len(vs)
    x = lambda r: left + (W - left - 20) * (r - lo) / (hi - lo)  # noqa: E731
    colour = {"won": "#2ca02c", "lost": "#d62728", "tied": "#7f7f7f", "no interval": "#1f77b4"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'aria-label="ratios against each reference">',
           f'<line x1="{x(1):.1f}" y1="10" x2="{x(1):.1f}" y2="{H - 15}" stroke="#000" stroke-dasharray="4 3"/>',
           f'<text x="{x(1):.1f}" y="{H - 2}" font-size="11" text-anchor="middle">1.0</text>',
           f'<text x="{x(lo):.1f}" y="{H - 2}" font-size="11">{lo:.2f}</text>',
           f'<text x="{x(hi):.1f}" y="{H - 2}" font-size="11" text-anchor="end">{hi:.2f}</text>']
    for i, v in enumerate(vs):
        y = 20 + i * rowh
        c = colour[v["outcome"]]
        out.append(f'<text x="{left - 8}" y="{y + 4}" font-size="11" text-anchor="end">{esc(v["study"])}: '
                   f'{esc(v["candidate"])}</text>')
        if v["lo"] is not None:
            out.append(f'<line x1="{x(v["lo"]):.1f}" y1="{y}" x2="{x(v["hi"]):.1f}" y2="{y}" stroke="{c}" stroke-width="3"/>')
        out.append(f'<circle cx="{x(v["median"]):.1f}" cy="{y}" r="4" fill="{c}"><title>{esc(ratio_text(v))} '
                   f'{esc(v["outcome"])}</title></circle>')
    out.append("</svg>")
    return "\n".join(out)


def bars_svg(pts, top, what):
    W, left, rowh = 700, 200, 22
    H = 20 + rowh * len(pts)
    top = max([top] + [p for _, p in pts])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" aria-label="{esc(what)}">']
    for i, (name, v) in enumerate(pts):
        y = 8 + i * rowh
        w = (W - left - 60) * v / top
        out.append(f'<text x="{left - 8}" y="{y + 12}" font-size="12" text-anchor="end">{esc(name)}</text>'
                   f'<rect x="{left}" y="{y}" width="{w:.1f}" height="15" fill="#1f77b4"/>'
                   f'<text x="{left + w + 4:.1f}" y="{y + 12}" font-size="12">{v:.3f}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bubble_svg(bars):
    W, left, rowh = 700, 200, 22
    H = 20 + rowh * len(bars)
    top = max(max(b, bb) for _, b, bb in bars) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" aria-label="pipeline bubble">']
    for i, (name, b, bb) in enumerate(bars):
        y = 8 + i * rowh
        sc = (W - left - 60) / top
        out.append(f'<text x="{left - 8}" y="{y + 12}" font-size="12" text-anchor="end">{esc(name)}</text>'
                   f'<rect x="{left}" y="{y}" width="{b * sc:.1f}" height="15" fill="#ff7f0e"/>'
                   f'<line x1="{left + bb * sc:.1f}" y1="{y - 2}" x2="{left + bb * sc:.1f}" y2="{y + 17}" stroke="#000" stroke-width="2"/>'
                   f'<text x="{left + max(b, bb) * sc + 4:.1f}" y="{y + 12}" font-size="12">{100 * b:.1f}% / {100 * bb:.1f}%</text>')
    out.append("</svg>")
    return "\n".join(out)


# --- the page ---

CSS = """body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}caption{text-align:left;font-style:italic;padding:4px 0}
.won{color:#2ca02c;font-weight:bold}.lost{color:#d62728;font-weight:bold}.tied{color:#555;font-weight:bold}
img{max-width:100%;border:1px solid #ddd;margin:4px 0}pre{background:#f4f4f4;padding:6px;overflow-x:auto;font-size:12px}
section{border-top:2px solid #444;margin-top:1.5em}.fail{color:#d62728}"""


def table_html(t):
    head = "".join(f"<th>{esc(c)}</th>" for c in t["columns"])
    body = "".join("<tr>" + "".join(f'<td class="{esc(c) if c in ("won", "lost", "tied") else ""}">{esc(c)}</td>'
                                    for c in r) + "</tr>" for r in t["rows"])
    return f"<table><caption>{esc(t['caption'])}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def img_html(path, title):
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f'<figure><img alt="{esc(title)}" src="data:image/png;base64,{data}"><figcaption>{esc(title)}</figcaption></figure>'


def rel(path, root):
    return os.path.relpath(path, root)


OUTCOMES = ("won", "tied", "lost", "no interval")


def groups(verdicts):
    """(study, group) -> its verdicts, in the order met."""
    by = {}
    for v in verdicts:
        by.setdefault((v["study"], v.get("group", "")), []).append(v)
    return by


def headline(doc):
    """The first section's sentences, from the verdicts and the projection only. A group of more
    than eight ratios (dispatch's rows of one mode) is given as counts."""
    lines = []
    by = groups(doc["verdicts"])
    for study in dict.fromkeys(k[0] for k in by):
        parts = []
        for (st, group), vs in by.items():
            if st != study:
                continue
            counts = {o: [v for v in vs if v["outcome"] == o] for o in OUTCOMES}
            if len(vs) > 8:
                said = ", ".join(f"{o} {len(c)}" for o, c in counts.items() if c) + f" of {len(vs)}"
            else:
                said = "; ".join(f"{o} {len(c)} ({', '.join(v['candidate'] for v in c)})" for o, c in counts.items() if c)
            parts.append((f"{group}: " if group else "") + said)
        vs = [v for (st, _), g in by.items() if st == study for v in g]
        refs = list(dict.fromkeys(v["reference"] for v in vs))
        covs = sorted({round(100 * v["coverage"]) for v in vs if v.get("coverage")})
        lines.append(f"{study}: against {refs[0]}" + (" and the other references" if len(refs) > 1 else "") + ": "
                     + "; ".join(parts)
                     + (f" (intervals of {'/'.join(map(str, covs))}% coverage)" if covs else "") + ".")
    proj = next((s["metrics"].get("projection") for s in doc["studies"] if s["name"] == "sim"), None)
    if proj:
        b = proj["palm_band"]
        lines.append(f"The simulator projects PaLM's two-pod weak scaling at {proj['palm_weak_scaling']:.3f}x "
                     f"(band {b[0]:.3f}-{b[1]:.3f}; the paper: {proj['palm_paper']:g}x) and Table 2's pipelines at "
                     + ", ".join(f"{k} {v:.3f}x" for k, v in proj["table2"].items()) + " of SPMD.")
    return lines


def build(root):
    meta = read_json(os.path.join(root, "meta.json")) or {}
    studies = []
    for name in meta.get("studies", [n for n in EXTRACT if os.path.isdir(os.path.join(root, n))]):
        d = os.path.join(root, name)
        st = (read_text(os.path.join(d, "status.txt")) or "-1 0").split()
        s = {"name": name, "title": TITLES[name], "exit_code": int(st[0]), "seconds": float(st[1]),
             "command": read_text(os.path.join(d, "command.txt")).strip(),
             "tables": [], "verdicts": [], "notes": [], "svgs": [], "traces": [], "metrics": {},
             "reproduces": REPRODUCES[name]}
        try:
            EXTRACT[name](d, s)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            s["notes"].append(f"report_page.py could not read this study's outputs: {type(e).__name__}: {e}")
        # The study's own plots first (a sweep's over its sub-runs'), then its sub-runs'.
        s["images"] = [rel(p, root) for p in sorted(glob.glob(os.path.join(d, "**", "*.png"), recursive=True),
                                                    key=lambda p: (p.count(os.sep), p))]
        s["raw_outputs"] = [rel(p, root) for p in sorted(glob.glob(os.path.join(d, "**", "*"), recursive=True))
                            if os.path.isfile(p) and (p.endswith((".json", ".txt", ".jsonl", ".log", ".md")))
                            and not p.endswith(".trace.json")]
        s["traces"] = [rel(p, root) for p in s["traces"]]
        studies.append(s)
    doc = {"schema": "pathways-mpi report 1", "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "meta": meta, "studies": [], "verdicts": []}
    for s in studies:
        doc["verdicts"] += s["verdicts"]
        doc["studies"].append({k: v for k, v in s.items() if k not in ("svgs",)})
    doc["headline"] = headline({"verdicts": doc["verdicts"], "studies": studies})
    text = page(doc, studies, root)
    # Every table's caption as the page shows it (the first section's and the machine table too,
    # which no study lists): report_check.py fails when one of them is missing from the page.
    doc["page_tables"] = [html.unescape(c) for c in re.findall(r"<table><caption>(.*?)</caption>", text)]
    with open(os.path.join(root, "report.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write(text)
    return doc


def page(doc, studies, root):
    m = doc["meta"]
    cpu = m.get("cpu", {})
    h = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>pathways-mpi report</title>",
         f"<style>{CSS}</style></head><body><h1>pathways-mpi report</h1>"]
    h.append("<section id=verdict><h2>What this run found</h2><ul>"
             + "".join(f"<li>{esc(line)}</li>" for line in doc["headline"]) + "</ul>")
    if doc["verdicts"]:
        h.append("<p>won: the ratio's interval lies above 1 (faster than the reference); lost: below 1; tied: it "
                 "holds 1 (same within noise); no interval: one round. Every ratio is in its study's section.</p>")
        h.append(table_html({"caption": "Ratios against their reference per study, by outcome",
                             "columns": ["study", "kind", "reference", *OUTCOMES],
                             "rows": [[st, g or "-", ", ".join(dict.fromkeys(v["reference"] for v in vs)),
                                       *[str(sum(v["outcome"] == o for v in vs)) for o in OUTCOMES]]
                                      for (st, g), vs in groups(doc["verdicts"]).items()]}))
    h.append("</section>")
    h.append("<section id=machine><h2>Machine, commit and commands</h2>")
    h.append(table_html({"caption": "Where and what ran", "columns": ["", ""], "rows": [
        ["CPU", cpu.get("model", "?")], ["cores", str(cpu.get("cores", "?"))],
        ["memory", f"{m.get('memory_bytes', 0) / 2**30:.1f} GiB"],
        ["MPI", f"{m.get('mpi', {}).get('version', '?')} ({m.get('mpi', {}).get('launcher', '?')})"],
        ["network between hosts", m.get("network", "?")],
        *[[f"where {s['name']} ran", s["metrics"]["where"]] for s in studies if s["metrics"].get("where")],
        ["commit", f"{m.get('commit', '?')}{' (with local changes)' if m.get('dirty') else ''}: {m.get('commit_subject', '')}"],
        ["started", m.get("started", "?")], ["command", m.get("command", "?")],
        ["settings", "--full: every study at its script's defaults" if m.get("full") else
         "quick: short settings per study (each study's command below)"]]}))
    h.append(f"<p>CPU flags: {esc(' '.join(cpu.get('flags', [])))}</p>")
    h.append('<p>Every command: <a href="commands.txt">commands.txt</a>; machine: <a href="meta.json">meta.json</a>; '
             'every figure of this page: <a href="report.json">report.json</a>.</p></section>')
    for s in studies:
        h.append(f'<section id="{esc(s["name"])}"><h2>{esc(s["title"])}</h2>')
        state = "finished" if s["exit_code"] == 0 else f'<span class=fail>exited {s["exit_code"]}</span>'
        h.append(f"<p>{state} in {s['seconds']:.0f} s. Reproduces "
                 + ", ".join(esc(p) for p in s["reproduces"]) + f'. Log: <a href="{esc(s["name"])}/log.txt">'
                 f'{esc(s["name"])}/log.txt</a></p>')
        h.append(f"<pre>$ {esc(s['command'])}</pre>")
        for n in s["notes"]:
            h.append(f"<p>{esc(n)}</p>")
        if not s["tables"]:
            h.append(f"<p class=fail>No table: the study wrote none of the outputs this page reads "
                     f"(see its log).</p>")
        for t in s["tables"]:
            h.append(table_html(t) if t["rows"] else f"<p class=fail>{esc(t['caption'])}: no rows</p>")
        if s["verdicts"] and len(s["verdicts"]) <= 40:
            h.append(f"<figure>{ratio_svg(s['verdicts'])}<figcaption>Each ratio (dot) with its interval (bar) against "
                     f"its reference; green won, red lost, grey tied</figcaption></figure>")
        for title, svg in s["svgs"]:
            h.append(f"<figure>{svg}<figcaption>{esc(title)}</figcaption></figure>")
        for p in s["images"]:
            h.append(img_html(os.path.join(root, p), p))
        if s["traces"]:
            h.append("<p>Perfetto traces (open in ui.perfetto.dev): "
                     + " ".join(f'<a href="{esc(t)}">{esc(os.path.basename(t))}</a>' for t in s["traces"]) + "</p>")
        if s["raw_outputs"]:
            h.append("<details><summary>Raw outputs</summary><p>"
                     + " ".join(f'<a href="{esc(p)}">{esc(p)}</a>' for p in s["raw_outputs"]) + "</p></details>")
        h.append("</section>")
    h.append("</body></html>")
    return "\n".join(h)


def validate(report, schema):
    import jsonschema  # Debian's python3-jsonschema (env.sh: pwm_install_report_tools)
    try:
        jsonschema.validate(read_json(report), read_json(schema))
    except jsonschema.ValidationError as e:
        print(f"report_page.py: error: {report} does not match {schema}: {e.message} (at {list(e.absolute_path)})",
              file=sys.stderr)
        return 1
    print(f"report_page.py: {report} matches {schema}")
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "--validate":
        return validate(argv[1], argv[2])
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print(__doc__, file=sys.stderr)
        return 2
    doc = build(argv[0])
    for line in doc["headline"]:
        print(line)
    print(f"report_page.py: wrote {argv[0]}/report.json and {argv[0]}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
