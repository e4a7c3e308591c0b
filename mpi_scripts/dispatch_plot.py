#!/usr/bin/env python3
"""Draws the dispatch benchmark's figures (paper Fig. 5-8) from dispatch_bench's JSON files.

    dispatch_plot.py OUT_DIR FILE.json...

Each file is one dispatch_bench run (its workers and, for emulated clusters, its hosts are in the
name: dispatch_hosts<K>_w<W>.json, dispatch_np<N>.json, dispatch_fig8_own_core.json). Writes, when
the files hold those figures:
  fig5.png   computations/s of opbyop, chained and fused over SPMD's, against the compute time T
             of one computation, one line style per mode and one colour per run (host count);
  fig6.png   the break-even T (the smallest swept T from which on Pathways reaches 95% of SPMD)
             against the number of hosts, per mode;
  fig7.png   a pipeline of k stages: parallel vs sequential dispatch, computations/s;
  fig8_*.png multi-tenancy: utilization against SPMD by number of clients, one line per T (a plot
             per run that has Fig. 8);
and prints the break-even table and, per run, every Pathways row of Fig. 5/6 and 8 against SPMD
at its T as docs/measurement.md prescribes: the median of the rounds' paired ratios (SPMD and
Pathways ran back to back in each round; dispatch_bench's round_computations_per_s) with its
order-statistic interval and verdict (measure.py). The plots and the break-even keep
dispatch_bench's best-over-best ratio. Plots need gnuplot (Debian gnuplot-nox); a missing gnuplot
is one line on stderr, not an error.
Unit-tested in tests/scripts/test_dispatch_plot.py.
"""
import json
import os
import re
import subprocess
import sys

import measure

MODES = ("opbyop", "chained", "fused", "static")


def label_of(path, doc):
    m = re.search(r"hosts(\d+)_w(\d+)", os.path.basename(path))
    if m:
        return f"{m.group(1)} host{'s' if m.group(1) != '1' else ''}, {m.group(2)}/host", int(m.group(1))
    return f"{doc['workers']} workers, one host", 1


def gnuplot(script, out):
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True)
        print(f"wrote {out}")
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"dispatch_plot: gnuplot failed for {out}: {e}", file=sys.stderr)


def line_plot(out, title, xlabel, ylabel, series, settings=""):
    """One PNG of `series` (gnuplot plot clauses) with the common frame of Fig. 6-8."""
    gnuplot(f"""set terminal pngcairo size 800,500 font ',10'
set output '{out}'
set title '{title}'
set xlabel '{xlabel}'
set ylabel '{ylabel}'
set grid
{settings}
plot {', '.join(series)}
""", out)


def series_by(tmp, stem, rows, key, x, y, title):
    """One line per value of rows' `key`: (x, y) points written to a data file, as plot clauses."""
    series = []
    for k in sorted({r[key] for r in rows}):
        data = os.path.join(tmp, f"{stem}_{k}.dat")
        write_data(data, sorted((r[x], r[y]) for r in rows if r[key] == k))
        series.append(f"'{data}' using 1:2 with linespoints title '{title(k)}'")
    return series


def write_data(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(" ".join(str(x) for x in r) + "\n")


def spmd_key(row):
    """Which SPMD row a row's rounds pair with: Fig. 8 runs rounds of its own, Fig. 5 (T = 0) and 6
    share theirs."""
    return ("8" if row["fig"] == "8" else "5/6", row["compute_us"])


def paired_ratios(doc):
    """[(row, measure.Ratio)]: every Pathways row of Fig. 5/6 and 8 over the SPMD row at its T, paired
    by round (entry i of both lists ran in round i), in the rows' order. Rows without per-round
    rates (written by a dispatch_bench before round_computations_per_s) are left out."""
    spmd = {spmd_key(r): r["round_computations_per_s"] for r in doc["rows"]
            if r["mode"] == "spmd" and r.get("round_computations_per_s")}
    out = []
    for r in doc["rows"]:
        ref, cand = spmd.get(spmd_key(r)), r.get("round_computations_per_s")
        if r["fig"] != "7" and r["mode"] != "spmd" and ref and cand:
            out.append((r, measure.paired_ratio(ref, cand)))
    return out


def row_name(row):
    """'fig 6, T = 100 us, chained' or 'fig 8, T = 330 us, 4 clients'."""
    what = row["mode"]
    if what == "clients":
        what = f"{row['clients']} client{'s' if row['clients'] != 1 else ''}"
    return f"fig {row['fig']}, T = {row['compute_us']} us, {what}"


def ratio_lines(label, doc):
    """The report's lines for one run: a heading and a verdict per paired ratio (measure.Ratio);
    one line saying so when the run's rows have no per-round rates; none without Fig. 5/6 or 8."""
    if not any(r["fig"] != "7" and r["mode"] != "spmd" for r in doc["rows"]):
        return []
    pairs = paired_ratios(doc)
    if not pairs:
        return [f"{label}: no per-round rates (an older dispatch_bench): no paired ratios"]
    return ([f"{label}: Pathways / SPMD computations per second, median of the rounds' paired ratios (interval):"]
            + ["  " + ratio.verdict(row_name(r), "spmd") for r, ratio in pairs])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out_dir, files = argv[0], argv[1:]
    docs = []
    for p in files:
        with open(p) as f:
            doc = json.load(f)
        label, hosts = label_of(p, doc)
        docs.append((p, label, hosts, doc))
    tmp = os.path.join(out_dir, "plot_data")
    os.makedirs(tmp, exist_ok=True)

    # Fig. 5: ratio to SPMD against T, per run and mode.
    plots, breakeven = [], []
    for i, (p, label, hosts, doc) in enumerate(docs):
        rows = [r for r in doc["rows"] if r["fig"] in ("5", "6")]
        spmd = {r["compute_us"]: r["computations_per_s"] for r in rows if r["mode"] == "spmd"}
        if not spmd:
            continue
        for dt, mode in enumerate(MODES):
            pts = sorted((r["compute_us"], r["computations_per_s"] / spmd[r["compute_us"]])
                         for r in rows if r["mode"] == mode and spmd.get(r["compute_us"]))
            if not pts:
                continue
            data = os.path.join(tmp, f"fig5_{i}_{mode}.dat")
            write_data(data, pts)
            plots.append(f"'{data}' using ($1 + 1):2 with linespoints lc {i + 1} dt {dt + 1} pt {dt + 5} "
                         f"title '{mode}, {label}'")
        be = doc.get("breakeven_us", {})
        breakeven.append((hosts, label, be.get("opbyop"), be.get("chained"), doc["workers"]))
    if plots:
        out = os.path.join(out_dir, "fig5.png")
        gnuplot(f"""set terminal pngcairo size 1100,650 font ',10'
set output '{out}'
set title 'Fig. 5: dispatch overhead, Pathways / SPMD (multi-controller) computations per second'
set xlabel 'compute time T of one computation + 1 (us, log)'
set ylabel 'throughput relative to SPMD'
set logscale x
set yrange [0:1.3]
set xrange [0.8:1500]
set key outside right
set grid
set arrow from graph 0, first 0.95 to graph 1, first 0.95 nohead dt 3 lc rgb 'gray'
plot {', '.join(plots)}
""", out)
        print("break-even T (>= 95% of SPMD at that T and every larger one):")
        print(f"{'run':>28} {'workers':>8} {'opbyop':>10} {'chained':>10}")
        for hosts, label, o, c, w in sorted(breakeven):
            fmt = lambda v: f"{v} us" if v is not None else "not reached"
            print(f"{label:>28} {w:>8} {fmt(o):>10} {fmt(c):>10}")
    for p, label, hosts, doc in docs:
        for line in ratio_lines(label, doc):
            print(line)

    # Fig. 6: break-even against hosts, for runs of one worker per host (the paper's axis).
    per_host = sorted((h, o, c) for h, label, o, c, w in breakeven if label.endswith(", 1/host"))
    if len(per_host) >= 2:
        data = os.path.join(tmp, "fig6.dat")
        # A break-even never reached is NaN: gnuplot leaves the point out.
        write_data(data, [(h, o if o is not None else "NaN", c if c is not None else "NaN") for h, o, c in per_host])
        line_plot(os.path.join(out_dir, "fig6.png"),
                  "Fig. 6: break-even compute time against hosts (1 worker per host; emulated hosts)", "hosts",
                  "break-even T (us)", [f"'{data}' using 1:2 with linespoints pt 5 title 'opbyop'",
                                        f"'{data}' using 1:3 with linespoints pt 7 title 'chained'"])

    # Fig. 7: parallel vs sequential dispatch of a pipeline of k stages.
    for p, label, hosts, doc in docs:
        rows = [r for r in doc["rows"] if r["fig"] == "7"]
        if not rows:
            continue
        series = series_by(tmp, "fig7", rows, "mode", "stages", "computations_per_s", str)
        line_plot(os.path.join(out_dir, "fig7.png"),
                  f"Fig. 7: a pipeline of k stages, parallel vs sequential dispatch ({label})", "stages",
                  "pipelines per second", series, "set logscale xy")
        break

    # Fig. 8: multi-tenancy, utilization against SPMD by clients, per T.
    for p, label, hosts, doc in docs:
        rows = [r for r in doc["rows"] if r["fig"] == "8" and r["mode"] == "clients"]
        if not rows:
            continue
        series = series_by(tmp, "fig8_" + os.path.basename(p), rows, "compute_us", "clients", "utilization_vs_spmd",
                           lambda t: f"T = {t} us")
        own = ", controller on its own core" if "own_core" in p else ""
        line_plot(os.path.join(out_dir, "fig8_" + os.path.basename(p).replace("dispatch_", "").replace(".json", ".png")),
                  f"Fig. 8: multi-tenancy, utilization vs SPMD ({label}{own})", "concurrent clients",
                  "utilization relative to SPMD", series, "set logscale x 2\nset yrange [0:1.2]")


if __name__ == "__main__":
    main()
