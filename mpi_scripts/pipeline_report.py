#!/usr/bin/env python3
"""The report of mpi_scripts/pipeline_bench.sh: a table per place the sweep ran, the summary JSON.

    pipeline_report.py OUT.json HOSTS DCN WHERE/NAME=METRICS.jsonl[,ROUND2.jsonl...]...

Each run is named WHERE/NAME: WHERE is `local` or `hosts<K>`, NAME `spmd_dp<N>` (the reference),
`S<S>_M<M>_<gpipe|1f1b>` (pathways_train) or `static_S<S>_M<M>_<gpipe|1f1b>` (mpmd_train, whose
tokens/s is also paired with pathways_train's run of the same configuration); its metrics' last `final` record is its result, one file per round
(the rounds interleaved, every run in each). Prints per WHERE tokens/s (the median round's), the
ratio to the spmd_train row of the same devices (the median of the per-round paired ratios with
its interval, mpi_scripts/measure.py), the measured bubble against the
bound, the peak intermediates and the object store's high-water mark per stage, and stage 0's
1F1B / GPipe ratio of peak intermediates; with HOSTS > 0 the hosts' tokens/s over one host's.
Writes OUT.json ({"runs", "hosts", "dcn"}). Unit-tested in tests/scripts/test_pipeline_report.py.
"""
import json
import sys

import measure

MiB = 1 << 20


def last_final(path):
    """The last final record of a metrics file."""
    res = None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if j.get("final"):
                res = j
    return res


def load_runs(runs):
    """{WHERE/NAME: result} from WHERE/NAME=PATH[,PATH...] arguments, in their order: the median
    round's final record, with every round's tokens/s in tokens_per_s_rounds."""
    res = {}
    for r in runs:
        key, paths = r.split("=", 1)
        finals = [last_final(p) for p in paths.split(",")]
        tps = [j["tokens_per_s"] for j in finals]
        med = measure.median(tps)
        res[key] = dict(min(finals, key=lambda j: abs(j["tokens_per_s"] - med)), tokens_per_s_rounds=tps)
    return res


def stages_of(name):
    """S of a pipeline run's name [static_]S<S>_M<M>_<schedule>."""
    return int(name.removeprefix("static_").split("_")[0][1:])


def vs_pathways_ratio(name, j, rows):
    """A static run's tokens/s over pathways_train's run of the same configuration, paired by
    round (a measure.Ratio); None for a pathways run or without it."""
    ref = rows.get(name.removeprefix("static_")) if name.startswith("static_") else None
    if not ref:
        return None
    rounds = lambda r: r.get("tokens_per_s_rounds", [r["tokens_per_s"]])  # noqa: E731
    return measure.paired_ratio(rounds(ref), rounds(j))


def vs_spmd_ratio(name, j, rows):
    """A pipeline run's tokens/s over spmd_train's on its devices (S x stage dp), paired by round
    (a measure.Ratio), None without the reference."""
    ref = rows.get(f"spmd_dp{stages_of(name) * int(j.get('stage_dp', 1))}")
    if not ref:
        return None
    rounds = lambda r: r.get("tokens_per_s_rounds", [r["tokens_per_s"]])  # noqa: E731
    return measure.paired_ratio(rounds(ref), rounds(j))


def vs_spmd(name, j, rows):
    """The median of vs_spmd_ratio, nan without the reference."""
    r = vs_spmd_ratio(name, j, rows)
    return r.median if r else float("nan")


def table(res, where):
    """Prints WHERE's table; returns its runs by NAME."""
    rows = {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith(where + "/")}
    print(f"\n== {where}")
    print(f"{'run':<23}{'tokens/s':>10}{'vs spmd':>9}{'interval':>24}{'vs pw':>8}{'interval':>24}{'bubble':>9}{'bound':>8}"
          f"{'diff pp':>9}{'msgs':>6}   peak intermediates per stage (MiB) | store high-water (MiB)")
    for name, j in rows.items():
        if name.startswith("spmd"):
            print(f"{name:<23}{j['tokens_per_s']:>10.0f}")
            continue
        ratio = vs_spmd_ratio(name, j, rows)
        vs = ratio.median if ratio else float("nan")
        iv = ratio.interval_text() if ratio else "-"
        if ratio:
            j["vs_spmd"] = ratio.as_dict()
        pw = vs_pathways_ratio(name, j, rows)
        if pw:
            j["vs_pathways"] = pw.as_dict()
        pws, piv = (f"{pw.median:.3f}", pw.interval_text()) if pw else ("-", "-")
        b, bb = 100 * j["bubble"], 100 * j["bubble_bound"]
        act = " ".join(f"{x / MiB:.1f}" for x in j["peak_intermediate_bytes"])
        st = " ".join(f"{x / MiB:.1f}" for x in j["peak_store_bytes"]) if "peak_store_bytes" in j else "-"
        isl = ",".join(str(int(i)) for i in j.get("stage_islands", []))
        msgs = f"{j['messages_per_step']:.0f}" if "messages_per_step" in j else "-"
        where_ = f"   (islands {isl})" if isl else ""
        print(f"{name:<23}{j['tokens_per_s']:>10.0f}{vs:>9.3f}{iv:>24}{pws:>8}{piv:>24}{b:>8.1f}%{bb:>7.1f}%{b - bb:>+9.1f}"
              f"{msgs:>6}   {act} | {st}{where_}")
    print("stage 0 peak intermediates, 1F1B / GPipe:")
    for name, j in rows.items():
        if name.endswith("_1f1b") and name[:-5] + "_gpipe" in rows:
            g = rows[name[:-5] + "_gpipe"]
            print(f"  {name[:-5]}: {j['peak_intermediate_bytes'][0] / g['peak_intermediate_bytes'][0]:.3f} "
                  f"({j['peak_intermediate_bytes'][0] / MiB:.2f} / {g['peak_intermediate_bytes'][0] / MiB:.2f} MiB)")
    return rows


def main(argv=None):
    """pipeline_report.py OUT.json HOSTS DCN WHERE/NAME=METRICS.jsonl..."""
    argv = sys.argv[1:] if argv is None else argv
    out, hosts, dcn, runs = argv[0], int(argv[1]), argv[2], argv[3:]
    res = load_runs(runs)
    local = table(res, "local")
    summary = {"runs": res, "hosts": hosts, "dcn": dcn}
    if hosts:
        where = f"hosts{hosts}"
        far = table(res, where)
        print(f"\n{where} (DCN {dcn}) against one host, tokens/s:")
        for name, j in far.items():
            if name in local:
                print(f"  {name:<16}{j['tokens_per_s'] / local[name]['tokens_per_s']:.3f}")
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
