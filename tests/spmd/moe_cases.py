#!/usr/bin/env python3
"""End-to-end Mixture-of-Experts cases of spmd_train under real mpirun (issue 36).

    moe_cases.py CASE BUILD_DIR

Expert parallelism against every rank holding every expert, dropless against a capacity that
drops nothing, resume across --expert-parallel 1 and 2, the per-step MoE metrics, and bad
settings (one line, a non-zero exit, nothing written). One expert against the dense model on the
same weights is a model test (tests/model/test_moe.cc).
"""
import os
import re
import subprocess

from harness import launch
from harness.compare import RTOL, assert_close_curves, same_bits
from harness.errors import expect_error
from harness.launch import case_main, run
from harness.workloads import TINY, train

MOE = ["--experts", "4", "--top-k", "1", "--capacity-factor", "1.25"]
NOCLIP = ["--max-grad-norm", "0"]


def case_expert_parallel_matches_every_expert_everywhere():
    # dp = 2, one micro-batch: each expert's gradient on its rank is (0 + a) + b, its two blocks of
    # rows (one per source rank) accumulated in order, and a row's products never depend on the
    # other rows; every rank holding every expert sums a + b in the dp AllReduce (two summands:
    # order-free). So the bits match. Only the gradient norm is summed in another order (dense
    # part + the experts' over the group, instead of tensor by tensor): with clipping off,
    # bitwise; the norm itself within double rounding; with clipping on, RTOL.
    for extra, label in ((MOE, "capacity 1.25"), (["--experts", "4", "--top-k", "2", "--capacity-factor", "0"],
                                                     "top-2 dropless")):
        ref = train(2, "ep1", ["--dp", "2"] + extra + NOCLIP)
        got = train(2, "ep2", ["--dp", "2", "--expert-parallel", "2"] + extra + NOCLIP)
        same_bits(ref, got, f"{label}: --expert-parallel 2 vs every expert on both ranks", ("step", "loss", "lr"))
        for s in ref[0]:
            a, b = ref[0][s]["grad_norm"], got[0][s]["grad_norm"]
            assert abs(a - b) <= 1e-11 * a, f"{label}: step {s}: grad_norm {b} vs {a}"
        # Half the experts per rank: the state holds fewer parameters.
        assert got[2]["state_bytes"] < ref[2]["state_bytes"], (got[2]["state_bytes"], ref[2]["state_bytes"])
    # Clipping on, two micro-batches, dp = 4 with groups of 2 (the experts' gradients then also
    # summed over the two ranks holding the same experts): other summation orders, RTOL. A
    # capacity applies to each routing group, one micro-batch of one rank: the reference routes
    # the same groups (4 micro-batches of 2 sequences on one rank).
    ref = train(1, "ep_ref1", ["--microbatches", "4"] + MOE)
    assert_close_curves(ref, train(2, "ep2_m2", ["--dp", "2", "--expert-parallel", "2", "--microbatches", "2"] + MOE),
                        RTOL, "--expert-parallel 2 x 2 micro-batches vs one rank")
    assert_close_curves(ref, train(4, "ep2_dp4", ["--dp", "4", "--expert-parallel", "2"] + MOE), RTOL,
                        "dp 4 --expert-parallel 2 vs one rank")
    assert_close_curves(ref, train(4, "ep4_dp4", ["--dp", "4", "--expert-parallel", "4"] + MOE), RTOL,
                        "dp 4 --expert-parallel 4 vs one rank")
    assert_close_curves(ref, train(4, "ep2_r2", ["--replicas", "2", "--dp", "2", "--expert-parallel", "2"] + MOE),
                        RTOL, "replicas 2 x dp 2 --expert-parallel 2 vs one rank")


def case_dropless_matches_a_capacity_that_drops_nothing():
    # Capacity 4 with E = 4, K = 1: ceil(4 N / 4) = N rows per expert, nothing can be dropped;
    # the padding rows are zeros. The model test (Moe.DroplessEqualsLargeCapacity) checks it
    # bitwise where the float GEMM's sums do not depend on the shape; here the curves, RTOL.
    dropless = ["--experts", "4", "--top-k", "1", "--capacity-factor", "0"]
    padded = ["--experts", "4", "--top-k", "1", "--capacity-factor", "4"]
    for mesh in (["--dp", "2"], ["--dp", "2", "--expert-parallel", "2"]):
        a = train(2, "dropless", mesh + dropless)
        b = train(2, "padded", mesh + padded)
        assert_close_curves(a, b, RTOL, f"{' '.join(mesh)}: dropless vs capacity 4")
        for s in b[0]:
            assert b[0][s]["moe"]["dropped_share"] == 0, b[0][s]["moe"]
            assert b[0][s]["moe"]["padding_share"] > 0.5, b[0][s]["moe"]  # 3 of 4 rows padding at most
            assert a[0][s]["moe"]["padding_share"] == 0 and a[0][s]["moe"]["dropped_share"] == 0, a[0][s]["moe"]


def killed_at_5(n, ck, mesh):
    p = run(n, TINY + mesh + ["--ckpt", ck, "--ckpt-every", "4", "--kill-step", "5", "--kill-rank", "0",
                              "--metrics", os.path.join(launch.TMP, "killed.jsonl")], expect_ok=False)
    assert p.returncode != 0 and os.path.exists(ck), "the killed run left no step-4 checkpoint"


def case_resume_across_expert_parallel():
    # The checkpoint holds whole tensors (every expert), whatever --expert-parallel wrote it: a
    # P = 2 run resumes at P = 1 and the reverse (RTOL against the uninterrupted run of the
    # resuming mesh: the first steps ran on another decomposition); the same P resumes bitwise.
    TINY[TINY.index("--steps") + 1] = "8"
    p1, p2 = ["--dp", "2"] + MOE, ["--dp", "2", "--expert-parallel", "2"] + MOE
    ref1, ref2 = train(2, "rp1", p1), train(2, "rp2", p2)
    for src, dst, ref, label in ((p2, p1, ref1, "P=2 -> P=1"), (p1, p2, ref2, "P=1 -> P=2"), (p2, p2, ref2, "P=2 -> P=2")):
        ck = os.path.join(launch.TMP, label.replace(" ", "").replace(">", "") + ".ckpt")
        killed_at_5(2, ck, src)
        got = train(2, "resumed", dst + ["--ckpt", ck, "--resume"])
        assert min(got[0]) == 4, f"{label}: resumed at step {min(got[0])}, not 4"
        if src == dst:
            for s in got[0]:
                assert got[0][s]["loss"] == ref[0][s]["loss"], f"{label}: step {s}"
            assert got[2]["weights_hash"] == ref[2]["weights_hash"], f"{label}: final weights differ"
            print(f"{label}: bitwise equal to the uninterrupted run")
        else:
            assert_close_curves(({s: ref[0][s] for s in got[0]}, ref[1], None), got, RTOL, label)


def case_metrics_report_routing():
    # A skew towards expert 0 with capacity 1.0 drops tokens and unbalances the experts; the
    # AllToAll time is reported under --expert-parallel and is zero without.
    skew = ["--experts", "4", "--top-k", "1", "--capacity-factor", "1.0", "--router-skew", "4"]
    a = train(2, "skew", ["--dp", "2", "--expert-parallel", "2"] + skew)
    b = train(2, "noskew", ["--dp", "2", "--expert-parallel", "2", "--experts", "4", "--top-k", "1",
                            "--capacity-factor", "1.0"])
    c = train(2, "noep", ["--dp", "2"] + skew)
    for s in a[0]:
        m = a[0][s]["moe"]
        for k in ("dropped_share", "padding_share", "max_mean_tokens", "device_max_mean", "lb_loss", "z_loss", "alltoall_ms"):
            assert k in m, f"step {s}: no {k} in {m}"
        assert m["alltoall_ms"]["max"] > 0, m
        assert c[0][s]["moe"]["alltoall_ms"]["max"] == 0, c[0][s]["moe"]
        # Perfect balance is 1 for both; the skew pushes expert 0 far above its share.
        assert m["max_mean_tokens"] > b[0][s]["moe"]["max_mean_tokens"], (m, b[0][s]["moe"])
        # and the busiest of the 2 experts' devices (experts 0-1) above its share, within [1, 2].
        assert 2 >= m["device_max_mean"] > b[0][s]["moe"]["device_max_mean"] >= 1, (m, b[0][s]["moe"])
        assert c[0][s]["moe"]["device_max_mean"] == 1, c[0][s]["moe"]  # one device holds every expert
        assert m["dropped_share"] > b[0][s]["moe"]["dropped_share"], (m, b[0][s]["moe"])
        assert m["lb_loss"] > b[0][s]["moe"]["lb_loss"], (m, b[0][s]["moe"])
        assert 0 < m["dropped_share"] < 1 and 0 <= m["padding_share"] < 1
    dense = train(1, "dense1", [])
    assert all("moe" not in dense[0][s] for s in dense[0])


def case_bf16_trains_under_expert_parallelism():
    # bf16 products (the experts' GEMMs; the router stays float32): --expert-parallel 2 against
    # every expert on both ranks. The same shapes per block, so the same bits where the bf16
    # kernel's sums depend only on the shape (the fp32 fallback on CPUs without AVX-512, oneDNN's
    # brgemm); 1e-3 covers a kernel that picks by the number of rows. bf16 must be in effect (step
    # 0 differs from fp32) and within its bound of fp32 (docs/model_kernels.md, "bf16": 2e-3 at step 0).
    bf = ["--precision", "bf16"]
    a = train(2, "bf16_ep1", ["--dp", "2"] + MOE + bf + NOCLIP)
    b = train(2, "bf16_ep2", ["--dp", "2", "--expert-parallel", "2"] + MOE + bf + NOCLIP)
    assert_close_curves(a, b, 1e-3, "bf16: --expert-parallel 2 vs every expert on both ranks")
    f = train(2, "fp32_ep2", ["--dp", "2", "--expert-parallel", "2"] + MOE + NOCLIP)
    l16, l32 = b[0][0]["loss"], f[0][0]["loss"]
    assert l16 != l32 and abs(l16 - l32) <= 2e-3 * l32, f"step 0: bf16 {l16} vs fp32 {l32}"
    steps = sorted(b[0])
    assert b[0][steps[-1]]["loss"] < b[0][steps[0]]["loss"], "the bf16 MoE run did not train"


def case_bad_settings_are_one_line():
    m = os.path.join(launch.TMP, "bad.jsonl")
    t = TINY + ["--metrics", m]
    expect_error(1, t + ["--experts", "4", "--top-k", "5"], "--top-k must be between 1 and --experts=4 (got 5)", [m])
    expect_error(2, t + ["--dp", "2", "--experts", "3", "--expert-parallel", "2"],
                 "--experts 3 is not divisible by --expert-parallel 2", [m])
    expect_error(1, t + ["--experts", "4", "--capacity-factor", "-1"], "--capacity-factor must be in [0, 1000000] (got -1)", [m])
    expect_error(1, t + ["--experts", "4", "--moe-every", "0"], "--moe-every must be >= 1", [m])
    expect_error(1, t + ["--experts", "4", "--moe-every", "3"], "--moe-every 3 leaves no MoE layer in 2 layers", [m])
    expect_error(2, t + ["--dp", "2", "--experts", "4", "--expert-parallel", "4"], "--expert-parallel 4 must divide --dp 2", [m])
    expect_error(2, t + ["--dp", "2", "--expert-parallel", "2"], "--expert-parallel applies to Mixture-of-Experts models", [m])
    expect_error(2, t + ["--dp", "2", "--experts", "4", "--expert-parallel", "2", "--fsdp"],
                 "--expert-parallel with --fsdp", [m])
    expect_error(2, t + ["--tp", "2", "--experts", "4"], "--experts with --tp 2", [m])
    expect_error(1, t + ["--experts", "-2"], "--experts must be >= 0", [m])
    expect_error(1, t + ["--experts", "4", "--router-skew", "1e9"], "--router-skew must be in [-100, 100]", [m])
    # pathways_train's own MoE refusals: tests/pathways_train/pathways_cases.py; pwm_sim's:
    # tests/sim/tool_input_cases.py.


def case_eval_reads_an_moe_checkpoint():
    # pwm_eval builds the model from the checkpoint's config, experts and all; its loss on the
    # training data is that of the run's final weights (finite, below the initial loss).
    ck = os.path.join(launch.TMP, "moe.ckpt")
    a = train(2, "evalrun", ["--dp", "2", "--expert-parallel", "2", "--ckpt", ck] + MOE)
    p = subprocess.run([os.path.join(launch.BUILD, "train", "tools", "pwm_eval"), "--checkpoint", ck, "--text",
                        "/usr/share/common-licenses/GPL-3", "--max-windows", "4"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    print(p.stdout.strip())
    first = a[0][min(a[0])]["loss"]
    m = re.search(r"xent ([0-9.]+) nats/token", p.stdout)
    assert m and 0 < float(m.group(1)) < first, f"no cross-entropy below the first step's {first} in: {p.stdout}"
    assert "experts=4 top_k=1" in p.stdout, p.stdout


if __name__ == "__main__":
    case_main(globals(), "moe")
