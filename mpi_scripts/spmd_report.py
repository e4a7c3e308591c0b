#!/usr/bin/env python3
"""The report of mpi_scripts/spmd_bench.sh: the runs' table, the bars, results/spmd_bench.json.

    spmd_report.py OUT_DIR ROUNDS PEER_TOKENS_S "ALONE EVERY" "ALONE EVERY" [PREC=DDP_TOKENS_S...]

OUT_DIR holds spmd_<name>.r<k>.jsonl (k = 1..ROUNDS, the rounds interleaved) for dp1, dp2,
dp2_b4m_overlap, dp2_b4m_nooverlap and dp2_<prec> of every PREC given; PEER_TOKENS_S is the
PyTorch peer's at 2 threads, one value per round, comma-separated; the two probes are
pwm_speed_probe's GEMM GFLOP/s before and after the fp32 runs (one process alone, per process on
every core); PREC=DDP_TOKENS_S PyTorch DDP's per precision and round (comma-separated, empty for
none). Prints tokens/s (median over the rounds), MFU, step time and communication share per run,
and every ratio (weak scaling, to the peer, to DDP, the overlap's gain) as the median of its
per-round paired ratios with its interval (mpi_scripts/measure.py); writes OUT_DIR/spmd_bench.json.
Unit-tested in tests/scripts/test_spmd_report.py.
"""
import json
import statistics
import sys

import measure


def lines(out, name):
    """Every record of OUT_DIR/spmd_<name>.jsonl (the first is the run's header)."""
    with open(f"{out}/spmd_{name}.jsonl") as f:
        return [json.loads(line) for line in f]


def final(out, name):
    """The run's first `final` record."""
    return next(j for j in lines(out, name) if j.get("final"))


def mfu(out, name, probes):
    """(MFU, peak GFLOP/s per rank) against the highest peak seen for the run's rank count.

    The peaks: the run's own, at start-up (its header) and at the end (its final line: the
    highest of its model-shape probes, or its fastest step's rate if that was higher, so that
    the MFU is at most 1), and each probe's figure for its rank count (alone for 1 rank, every
    core busy for more).
    """
    head, j = lines(out, name)[0], final(out, name)
    ranks = head["ranks"]
    peak = max([head["peak_gflops_per_rank"], j.get("peak_gflops_per_rank", 0.0)] +
               [p[0 if ranks == 1 else 1] for p in probes])
    # (In the trainer's order of operations: the final line's peak is at least this rate.)
    return j["tokens_per_s"] * head["flops_per_token"] / ranks / 1e9 / peak, peak


def per_round(args):
    """{key: [values per round]} from KEY=V1,V2,... arguments (an empty value is no figure: [])."""
    return {a.split("=")[0]: [float(x) for x in a.split("=", 1)[1].split(",") if x] for a in args}


def tps(out, name, rounds):
    """The run's tokens/s in each round."""
    return [final(out, f"{name}.r{k}")["tokens_per_s"] for k in range(1, rounds + 1)]


def main(argv=None):
    """spmd_report.py OUT_DIR ROUNDS PEER_TOKENS_S PROBE_BEFORE PROBE_AFTER [PREC=DDP_TOKENS_S...]"""
    argv = sys.argv[1:] if argv is None else argv
    out, rounds = argv[0], int(argv[1])
    peer = [float(x) for x in argv[2].split(",")]
    probes = [[float(x) for x in p.split()] for p in argv[3:5]]  # [alone, per process on every core]
    ddp = per_round(argv[5:])
    names = ("dp1", "dp2", "dp2_b4m_overlap", "dp2_b4m_nooverlap")
    t = {n: tps(out, n, rounds) for n in names}
    r = {}
    print(f"\n{rounds} rounds, interleaved; tokens/s: median over the rounds (their range); MFU of the median round")
    print(f"{'run':<18}{'tokens/s':>10}{'range':>14}{'MFU':>8}{'step p50 ms':>13}{'comm share':>12}{'peak used':>11}")
    for n in names:
        k = min(range(rounds), key=lambda i: abs(t[n][i] - statistics.median(t[n])))  # the median round
        j = dict(final(out, f"{n}.r{k + 1}"), tokens_per_s_rounds=t[n])
        m, pk = mfu(out, f"{n}.r{k + 1}", probes)
        j["mfu_conservative"], j["mfu_peak_gflops"] = m, pk
        r[n] = j
        rng = f"{min(t[n]):.0f}-{max(t[n]):.0f}"
        print(f"{n:<18}{statistics.median(t[n]):>10.0f}{rng:>14}{100*m:>7.1f}%{j['step_ms_p50']:>13.1f}"
              f"{100*j['comm_share']:>11.1f}%{pk:>11.1f}")
    print(f"{'torch peer (2T)':<18}{statistics.median(peer):>10.0f}{f'{min(peer):.0f}-{max(peer):.0f}':>14}")
    print("MFU: against the highest GEMM peak per rank seen for the run's rank count (the run's own, at start-up and at its end, "
          "and the probes before and after)")
    print("ratios: the median of the per-round paired ratios (interval: mpi_scripts/measure.py)")
    eff = measure.paired_ratio([2 * x for x in t["dp1"]], t["dp2"])
    ratio = measure.paired_ratio(peer, t["dp2"])
    overlap = measure.paired_ratio(t["dp2_b4m_nooverlap"], t["dp2_b4m_overlap"])
    print(f"\nweak-scaling efficiency dp=2 vs dp=1: {100*eff.median:.1f}% ({eff.interval_text()}) (bar 90%)")
    print(f"dp=2 vs PyTorch peer at 2 threads: {ratio.text()} (bar 1.2x)")
    print(f"overlap on vs off (dp=2, 4 MiB buckets): {overlap.text()}")
    vs_ddp = {}
    for prec, theirs in ddp.items():
        ours = tps(out, f"dp2_{prec}", rounds)
        r[f"dp2_{prec}"] = final(out, f"dp2_{prec}.r1")
        what = "bfloat16 autocast" if prec == "bf16" else "float32"
        if len(theirs) != rounds:
            vs_ddp[prec] = {"ours_tokens_per_s": ours, "ddp_tokens_per_s": theirs, "ratio": 0.0}
            print(f"dp=2 {prec}: spmd_train {statistics.median(ours):.0f} tokens/s; PyTorch DDP {what}: no figure")
            continue
        q = measure.paired_ratio(theirs, ours)
        vs_ddp[prec] = {"ours_tokens_per_s": ours, "ddp_tokens_per_s": theirs, "ratio": q.median, "interval": q.as_dict()}
        print(f"dp=2 {prec}: spmd_train {statistics.median(ours):.0f} tokens/s vs PyTorch DDP {what} "
              f"{statistics.median(theirs):.0f}: {q.text()} (bar 1.2x)")
    with open(f"{out}/spmd_bench.json", "w") as f:
        json.dump({"runs": r, "rounds": rounds, "torch_peer_2threads_tokens_per_s": peer,
                   "weak_scaling_efficiency": eff.median, "weak_scaling": eff.as_dict(),
                   "dp2_vs_peer": ratio.median, "dp2_vs_peer_interval": ratio.as_dict(),
                   "overlap_gain": overlap.as_dict(), "dp2_vs_ddp": vs_ddp}, f, indent=1)


if __name__ == "__main__":
    main()
