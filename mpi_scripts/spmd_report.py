#!/usr/bin/env python3
"""The report of mpi_scripts/spmd_bench.sh: the runs' table, the bars, results/spmd_bench.json.

    spmd_report.py OUT_DIR PEER_TOKENS_S "ALONE EVERY" "ALONE EVERY" [PREC=DDP_TOKENS_S...]

OUT_DIR holds spmd_<name>.jsonl for dp1, dp2, dp2_b4m_overlap, dp2_b4m_nooverlap and dp2_<prec>
of every PREC given; PEER_TOKENS_S is the PyTorch peer's at 2 threads; the two probes are
pwm_speed_probe's GEMM GFLOP/s before and after the fp32 runs (one process alone, per process on
every core); PREC=DDP_TOKENS_S PyTorch DDP's per precision (empty for none). Prints tokens/s,
MFU, step time and communication share per run, the weak-scaling efficiency, the ratios to the
peer and to DDP, and the overlap's gain; writes OUT_DIR/spmd_bench.json.
Unit-tested in tests/scripts/test_spmd_report.py.
"""
import json
import sys


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


def parse_ddp(args):
    """{prec: tokens/s} from PREC=TOKENS_S arguments (an empty value is 0)."""
    return {a.split("=")[0]: float(a.split("=")[1] or 0) for a in args}


def main(argv=None):
    """spmd_report.py OUT_DIR PEER_TOKENS_S PROBE_BEFORE PROBE_AFTER [PREC=DDP_TOKENS_S...]"""
    argv = sys.argv[1:] if argv is None else argv
    out, peer = argv[0], float(argv[1])
    probes = [[float(x) for x in p.split()] for p in argv[2:4]]  # [alone, per process on every core]
    ddp = parse_ddp(argv[4:])
    r = {n: final(out, n) for n in ("dp1", "dp2", "dp2_b4m_overlap", "dp2_b4m_nooverlap")}
    print(f"\n{'run':<16}{'tokens/s':>10}{'MFU':>8}{'step p50 ms':>13}{'comm share':>12}{'peak used':>11}")
    for n, j in r.items():
        m, pk = mfu(out, n, probes)
        j["mfu_conservative"], j["mfu_peak_gflops"] = m, pk
        print(f"{n:<18}{j['tokens_per_s']:>10.0f}{100*m:>7.1f}%{j['step_ms_p50']:>13.1f}{100*j['comm_share']:>11.1f}%{pk:>11.1f}")
    print(f"{'torch peer (2T)':<18}{peer:>10.0f}")
    print("MFU: against the highest GEMM peak per rank seen for the run's rank count (the run's own, at start-up and at its end, "
          "and the probes before and after)")
    eff = r["dp2"]["tokens_per_s"] / (2 * r["dp1"]["tokens_per_s"])
    ratio = r["dp2"]["tokens_per_s"] / peer
    print(f"\nweak-scaling efficiency dp=2 vs dp=1: {100*eff:.1f}% (bar 90%)")
    print(f"dp=2 vs PyTorch peer at 2 threads: {ratio:.2f}x (bar 1.2x)")
    print(f"overlap on vs off (dp=2, 4 MiB buckets): {r['dp2_b4m_overlap']['tokens_per_s']/r['dp2_b4m_nooverlap']['tokens_per_s']:.3f}x")
    vs_ddp = {}
    for prec, t in ddp.items():
        ours = final(out, f"dp2_{prec}")["tokens_per_s"]
        r[f"dp2_{prec}"] = final(out, f"dp2_{prec}")
        vs_ddp[prec] = {"ours_tokens_per_s": ours, "ddp_tokens_per_s": t, "ratio": ours / t if t else 0.0}
        print(f"dp=2 {prec}: spmd_train {ours:.0f} tokens/s vs PyTorch DDP {'bfloat16 autocast' if prec == 'bf16' else 'float32'} "
              f"{t:.0f}: {vs_ddp[prec]['ratio']:.2f}x (bar 1.2x)")
    with open(f"{out}/spmd_bench.json", "w") as f:
        json.dump({"runs": r, "torch_peer_2threads_tokens_per_s": peer, "weak_scaling_efficiency": eff,
                   "dp2_vs_peer": ratio, "dp2_vs_ddp": vs_ddp}, f, indent=1)


if __name__ == "__main__":
    main()
