#!/usr/bin/env python3
"""pathways_train's replicas against spmd_train under real mpirun (issue 15): replicas of one slice,
one island each, exchanging their gradients between the islands; and --fsdp (issue 40).

    pathways_cases.py CASE BUILD_DIR

CTest runs these cases through pathways_cases.py, which imports them (as the other cases there,
each against spmd_train on the same workload); `replicas_cases.py CASE BUILD_DIR` runs one too.
"""
import json
import os
import shutil

from harness import launch
from harness.compare import RTOL, assert_bitwise, assert_close_curves
from harness.errors import expect_error
from harness.launch import case_main, run
from harness.outputs import metrics
from harness.workloads import TINY, train


# ---- Issue 15: replicas, one slice per island, exchanging gradients between the islands ---------

# --islands 2x1 / 2x2 make one island per replica on this one host (over the emulated cluster the
# hosts are the islands: tests/cluster, case pathways_replicas_two_hosts).
R2 = ["--replicas", "2", "--islands", "2x1"]


def case_replicas_equal_spmd_dp():
    # 2 replicas x dp 1 against spmd_train --dp 2 on the same global batch: replica r reads data
    # index r (spmd's rank r) and both sum the gradient over 2 data-parallel ranks. With two
    # summands the sum is one addition, a + b == b + a in IEEE arithmetic, so SPMD's AllReduce
    # (flat, hierarchical or plain: all reduce two ranks to that one addition) and Pathways'
    # replica_add (island order on every island) give the same bits: asserted bitwise.
    for extra in ([], ["--microbatches", "2"]):
        ref = train(2, "spmd_dp2" + "".join(extra), ["--dp", "2"] + extra)
        for g in ("fused", "chained"):
            got = train(3, f"r2_{g}" + "".join(extra), R2 + extra + ["--granularity", g], exe="pathways")
            assert_bitwise(ref, got, f"pathways {g} --replicas 2 {' '.join(extra)}")
            f = got[2]
            # 2 islands x 1 device x (the pieces: the whole gradient) + one loss each, in bytes.
            assert f["dcn_bytes_per_step"] == 2 * (4 * f["state_bytes"] // 16 + 8), f
            assert f["xchg_exposed_ms"] >= 0 and f["xchg_tail_ms"] >= 0, f
            assert f["peak_rss_bytes"] > f["state_bytes"] > 0, f
    # Without --islands the host is one island holding both replicas' slices: the same bits.
    got = train(3, "r2_one_island", ["--replicas", "2", "--granularity", "chained"], exe="pathways")
    assert_bitwise(train(2, "spmd_dp2_again", ["--dp", "2"]), got, "pathways --replicas 2 on one island")


def case_replicas_dp2_match_spmd_dp4():
    # 2 replicas x dp 2 (5 ranks). Against spmd_train --replicas 2 --dp 2 (its hierarchical
    # exchange, the default): both sum every element as (a + b) + (c + d), a ReduceScatter inside
    # the replica (island) then the two replicas' shards, so the bits are equal: asserted bitwise.
    # Against spmd_train --dp 4 the four ranks' gradients are summed in the order of SPMD's ring
    # chunks, so the two agree to float rounding only: RTOL (1e-5 relative on every loss, the
    # dp/tp decomposition bound of tests/spmd; measured differences are printed).
    hier = train(4, "spmd_r2dp2", ["--replicas", "2", "--dp", "2"])
    ref = train(4, "spmd_dp4", ["--dp", "4"])
    for g in ("fused", "chained"):
        got = train(5, f"r2dp2_{g}", ["--replicas", "2", "--dp", "2", "--islands", "2x2", "--granularity", g],
                    exe="pathways")
        assert_bitwise(hier, got, f"pathways {g} --replicas 2 --dp 2 vs spmd --replicas 2 --dp 2")
        assert_close_curves(ref, got, RTOL, f"pathways {g} --replicas 2 --dp 2 vs spmd --dp 4")
        # Each device sends its half of every piece and its loss to its peer: 2 islands x 2
        # devices x (half the gradient + 8 bytes); the tiny model's pieces (its 2 layers, the
        # tied embedding and final norm) have even sizes, so no chunk is padded. The parameters
        # from the state (parameters, gradients and both moments: 16 bytes each, per device), the
        # same in both trainers.
        f = got[2]
        assert f["state_bytes"] == hier[2]["state_bytes"], (f["state_bytes"], hier[2]["state_bytes"])
        params = f["state_bytes"] // 16
        want = 2 * 2 * (4 * params // 2 + 8)
        assert f["dcn_bytes_per_step"] == want, (f["dcn_bytes_per_step"], want, "at dp 1 it would be", 2 * 2 * (4 * params + 8))


def sends_before_last_backward(trace_path):
    """From the runtime's trace (PWM_PW_TRACE), per worker and replicas-step run: whether the
    worker posted a send to the other island before its last backward unit of that run ended."""
    ev = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    runs = {e["args"]["run"] for e in ev if e.get("cat") == "node" and e["args"]["program"].startswith("replicas-")}
    got = {}
    for pid in {e["pid"] for e in ev if e["pid"] > 0}:
        for run in runs:
            bwd = [e["ts"] + e["dur"] for e in ev if e["pid"] == pid and e.get("cat") == "node" and
                   e["args"]["run"] == run and "_block_bwd" in e["args"]["kernel"]]
            sends = [e["ts"] for e in ev if e["pid"] == pid and e.get("cat") == "transfer" and
                     e["args"]["run"] == run and e["name"].startswith("send")]
            if bwd and sends:
                got[(pid, run)] = min(sends) < max(bwd)
    return got


def case_replicas_exchange_overlaps_backward():
    # Chained at every D and T: a piece's sends (D > 1: of its chunk, after the island's
    # ReduceScatter, the next node) are posted when the piece is final, while the island still
    # computes the backward of the layers below, not when the exchange's nodes come after the
    # whole backward. Checked from the runtime's own record of each worker's kernels and
    # transfers: on every worker, in every step, the first send is posted before the last
    # block_bwd ends (4 layers: three backward units follow the first final piece).
    four = ["--layers", "4", "--steps", "3"]
    for mesh, n in ((["--dp", "1", "--islands", "2x1"], 3), (["--dp", "2", "--islands", "2x2"], 5),
                    (["--tp", "2", "--islands", "2x2"], 5)):
        t = os.path.join(launch.TMP, f"rt{n}{mesh[0]}.json")
        env = launch.ENV
        launch.ENV = dict(env, PWM_PW_TRACE=t)
        try:
            train(n, f"xchg{n}{mesh[0]}", ["--replicas", "2", "--granularity", "chained"] + mesh + four, exe="pathways")
        finally:
            launch.ENV = env
        got = sends_before_last_backward(t)
        what = " ".join(mesh)
        print(f"{what}: (worker, run) -> first send before the last backward ends: {got}")
        assert len(got) >= (n - 1) * 3, f"{what}: {len(got)} worker-steps with sends and backward units, want {(n - 1) * 3}"
        assert all(got.values()), f"{what}: a worker posted its first send only after its backward: {got}"


def case_replicas_hold_one_step_of_pieces():
    # Issue 58: a step dispatched ahead posts its receives when it starts its first kernel, not
    # when it arrives (dataflow/interpreter.cc, Walk::may_post_recv), so a device holds one
    # step's pieces: its own copies and the other island's (received), each sum written over
    # the received copy (replica_add's donor, programs/step_io.h: replica_add_attrs), 2 x the
    # bytes it sends; plus, at most, the last step's own copies while their sends are not yet
    # done (a send keeps its buffer until MPI is done with it): 3 x. Measured: 2.00 x with
    # OpenMPI, 2.26 x and 2.75 x with MPICH, whose sends here can end after the next step's
    # first kernel; 2.25 x with OpenMPI before the sums were written in place, so this bound
    # does not tell the two apart. Posted on arrival, the next step's receives came on top while
    # the islands' first steps ran apart: 62.6 MiB on island 1 at this workload (4.2 x 14.75 MiB).
    path = os.path.join(launch.TMP, "r2_fused_pieces.jsonl")
    model = ["--d-model", "256", "--layers", "4", "--heads", "4", "--head-dim", "64", "--d-ff", "1024",
             "--seq-len", "128", "--batch", "32", "--steps", "6", "--eval-batches", "1", "--eval-every", "100",
             "--log-every", "100", "--peak-gflops", "50"]
    run(3, model + R2 + ["--granularity", "fused", "--metrics", path], exe="pathways", timeout=300)
    f = metrics(path)[2]
    f = f.get("figures", f)
    sent = f["dcn_bytes_per_step"] / 2  # each island's pieces
    peak = max(f["peak_intermediate_bytes"])
    print(f"peak intermediates {[round(b / 2**20, 1) for b in f['peak_intermediate_bytes']]} MiB; "
          f"each island sends {sent / 2**20:.2f} MiB a step")
    assert peak <= 3 * sent * 1.02, f"a device held {peak / sent:.2f} x its pieces' bytes (one step and sends: 3)"


def case_replicas_resume_across_meshes():
    # Checkpoints are mesh-independent (full tensors, the workload only): a run at 2 replicas,
    # killed after its step-4 checkpoint, resumes at 1 replica in pathways_train and in
    # spmd_train --dp 1, the two continuations bitwise equal (same mesh, same trainer bits); and
    # within RTOL of the uninterrupted 2-replica run (dp 1 vs 2 sums the batch in another order).
    full = train(3, "r2_full", R2 + ["--granularity", "chained"], exe="pathways")
    ck = os.path.join(launch.TMP, "r2.ckpt")
    p = run(3, TINY + R2 + ["--granularity", "chained", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5"],
            expect_ok=False, exe="pathways")
    assert p.returncode != 0
    cks = []
    for i in range(2):  # each resumed run writes its final checkpoint over its own copy
        cks.append(os.path.join(launch.TMP, f"r2_{i}.ckpt"))
        shutil.copy(ck, cks[-1])
    a = train(2, "r1_resumed", ["--ckpt", cks[0], "--resume", "--granularity", "chained"], exe="pathways")
    b = train(1, "spmd1_resumed", ["--ckpt", cks[1], "--resume"])
    assert min(a[0]) == 4 and min(b[0]) == 4, f"resumed at {min(a[0])}, {min(b[0])}"
    assert_bitwise(b, a, "resumed at 1 replica: pathways vs spmd --dp 1")
    for s in a[0]:
        x, y = a[0][s]["loss"], full[0][s]["loss"]
        assert abs(x - y) <= RTOL * abs(y), f"step {s}: resumed loss {x} vs uninterrupted {y}"
    # The reverse: spmd_train --dp 1's step-4 checkpoint resumes at 2 replicas (fused), bitwise
    # equal to spmd_train --dp 2 resumed from it (the first case's equality, from a checkpoint).
    ck1 = os.path.join(launch.TMP, "dp1.ckpt")
    p = run(1, TINY + ["--ckpt", ck1, "--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "0"],
            expect_ok=False)
    assert p.returncode != 0
    c1, c2 = os.path.join(launch.TMP, "dp1_a.ckpt"), os.path.join(launch.TMP, "dp1_b.ckpt")
    shutil.copy(ck1, c1)
    shutil.copy(ck1, c2)
    r = train(3, "r2_resumed", R2 + ["--ckpt", c1, "--resume", "--granularity", "fused"], exe="pathways")
    d = train(2, "spmd2_resumed", ["--dp", "2", "--ckpt", c2, "--resume"])
    assert min(r[0]) == 4, f"2 replicas resumed at {min(r[0])}"
    assert_bitwise(d, r, "resumed at 2 replicas vs spmd --dp 2")


def case_fsdp_equals_spmd():
    # Issue 40: pathways_train --fsdp against spmd_train --fsdp, bitwise: fused runs spmd_train's
    # own Fsdp step on the shards; chained and opbyop run one kernel per unit with the collectives
    # as nodes of their own (each layer gathered by an fsdp_gather node before its forward and its
    # backward, each micro-batch's full layer gradient reduce-scattered by fsdp_rs_start/_finish
    # around the next backward unit, or one blocking node with --no-overlap, and added to the
    # chunk; the tied piece reduce-scattered once), the same sums in the same order. Fused also against
    # plain dp: at dp 2 each reduce-scattered element is a + b, as the AllReduce's, so losses and
    # weights are bitwise equal; the reported gradient norm is summed per shard, then over dp,
    # which rounds differently (1e-16 relative; it is the same on every rank, so the clipping and
    # the weights agree). The state per device: both trainers count the shards plus the gathered
    # buffers at their peak.
    for mesh, n in ((["--dp", "2"], 2), (["--dp", "2", "--tp", "2"], 4), (["--dp", "2", "--microbatches", "2"], 2)):
        tag = "".join(mesh)
        ref = train(n, "spmd_fsdp" + tag, mesh + ["--fsdp"])
        plain = train(n, "spmd_plain" + tag, mesh)
        for g in ("chained", "opbyop", "chained --no-overlap"):
            if g != "chained" and "--microbatches" not in mesh:
                continue
            other = train(n + 1, f"pw_fsdp_{g.replace(' ', '')}" + tag, mesh + ["--fsdp", "--granularity"] + g.split(),
                          exe="pathways")
            assert_bitwise(ref, other, f"pathways {g} --fsdp {' '.join(mesh)} vs spmd --fsdp")
            # The same buffers at the same time as spmd_train's Fsdp (a gathered layer, its full
            # gradient, the chunk its reduce-scatter lands in, the tied pieces for the step), one
            # counted from the program's arrays, the other from Fsdp's own.
            assert other[2]["state_bytes"] == ref[2]["state_bytes"], (g, other[2]["state_bytes"], ref[2]["state_bytes"])
        got = train(n + 1, "pw_fsdp" + tag, mesh + ["--fsdp", "--granularity", "fused"], exe="pathways")
        assert_bitwise(ref, got, f"pathways fused --fsdp {' '.join(mesh)} vs spmd --fsdp")
        what = f"pathways fused --fsdp {' '.join(mesh)} vs spmd without --fsdp"
        if "--microbatches" in mesh:
            # FSDP reduce-scatters each micro-batch's layer gradient and adds it to the shard;
            # plain dp accumulates the micro-batches, then sums over dp: another order, so a
            # tolerance (as spmd_train's own fsdp_matches_dp).
            assert_close_curves(plain, got, RTOL, what)
            continue
        for st in plain[0]:
            assert plain[0][st]["loss"] == got[0][st]["loss"], f"{what}: step {st} loss"
            a, b = plain[0][st]["grad_norm"], got[0][st]["grad_norm"]
            assert abs(a - b) <= 1e-12 * a, f"{what}: step {st} grad norm {b!r} vs {a!r}"
        assert plain[1] == got[1] and plain[2]["weights_hash"] == got[2]["weights_hash"], what
        print(f"{what}: losses, validation losses and weights bitwise equal, gradient norms within 1e-12")
        assert got[2]["state_bytes"] == ref[2]["state_bytes"] < plain[2]["state_bytes"], (
            got[2]["state_bytes"], ref[2]["state_bytes"], plain[2]["state_bytes"])
    # Two replicas of dp 2, one island each (5 ranks): each device's gradient shard (its 1/2 of
    # the island's sum) is what crosses to its peer, replica_add sums the two (a + b), the update
    # runs on the shard: bitwise equal to spmd_train --fsdp --replicas 2 (its AllReduce of the
    # shard over the replicas), with spmd_train --replicas 2's weights and losses.
    r2 = ["--replicas", "2", "--dp", "2"]
    ref = train(4, "spmd_r2_fsdp", r2 + ["--fsdp"])
    plain = train(4, "spmd_r2_plain", r2)
    got = train(5, "pw_r2_fsdp", r2 + ["--fsdp", "--islands", "2x2"], exe="pathways")
    assert_bitwise(ref, got, "pathways fused --fsdp --replicas 2 --dp 2 vs spmd --fsdp --replicas 2 --dp 2")
    assert plain[2]["weights_hash"] == got[2]["weights_hash"], "pathways --fsdp --replicas 2 vs spmd --replicas 2: weights"
    assert all(plain[0][st]["loss"] == got[0][st]["loss"] for st in plain[0]), "losses vs spmd --replicas 2"
    # Across the islands per step: 2 islands x 2 devices x (the shard, half the gradient of the
    # tiny model's even-sized pieces, + the loss).
    params = plain[2]["state_bytes"] // 16
    want = 2 * 2 * (4 * params // 2 + 8)
    assert got[2]["dcn_bytes_per_step"] == want, (got[2]["dcn_bytes_per_step"], want)
    assert got[2]["state_bytes"] == ref[2]["state_bytes"], (got[2]["state_bytes"], ref[2]["state_bytes"])
    # The same at chained, two micro-batches: each layer's chunk is what crosses, as the island's
    # backward makes it (the same bytes in all: the chunks make the shard); bitwise equal again.
    m2 = ["--microbatches", "2"]
    ref = train(4, "spmd_r2_fsdp_m2", r2 + m2 + ["--fsdp"])
    got = train(5, "pw_r2_fsdp_chained", r2 + m2 + ["--fsdp", "--islands", "2x2", "--granularity", "chained"],
                exe="pathways")
    assert_bitwise(ref, got, "pathways chained --fsdp --replicas 2 --dp 2 vs spmd --fsdp --replicas 2 --dp 2")
    assert got[2]["dcn_bytes_per_step"] == want, (got[2]["dcn_bytes_per_step"], want)
    # Checkpoints hold full tensors: a --fsdp run killed after its step-4 checkpoint resumes in
    # pathways_train --fsdp, bitwise equal to spmd_train --fsdp resumed from it, and with the
    # weights of spmd_train without --fsdp resumed from it (dp 2, as above).
    ck = os.path.join(launch.TMP, "fsdp.ckpt")
    p = run(3, TINY + ["--dp", "2", "--fsdp", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5"],
            expect_ok=False, exe="pathways")
    assert p.returncode != 0
    cks = [os.path.join(launch.TMP, f"fsdp_{i}.ckpt") for i in range(3)]
    for c in cks:
        shutil.copy(ck, c)
    a = train(3, "pw_fsdp_resumed", ["--dp", "2", "--fsdp", "--ckpt", cks[0], "--resume"], exe="pathways")
    b = train(2, "spmd_fsdp_resumed", ["--dp", "2", "--fsdp", "--ckpt", cks[1], "--resume"])
    c = train(2, "spmd_dp2_resumed", ["--dp", "2", "--ckpt", cks[2], "--resume"])
    assert min(a[0]) == 4 and min(b[0]) == 4 and min(c[0]) == 4, f"resumed at {min(a[0])}, {min(b[0])}, {min(c[0])}"
    assert_bitwise(b, a, "pathways --fsdp resumed vs spmd --fsdp resumed")
    assert a[2]["weights_hash"] == c[2]["weights_hash"], "pathways --fsdp resumed vs spmd --dp 2 resumed: weights"
    # What is not built is refused in one line, before training.
    m = os.path.join(launch.TMP, "fsdp_refused.jsonl")
    expect_error(5, TINY + ["--dp", "2", "--fsdp", "--metrics", m, "--stages", "2", "--layers", "2"],
                 "pathways_train runs --fsdp without --stages", [m], exe="pathways")


def case_replicas_bad_inputs_fail_cleanly():
    m = os.path.join(launch.TMP, "bad.jsonl")
    expect_error(3, TINY + ["--replicas", "2", "--dp", "2", "--metrics", m], "ranks", [m], exe="pathways")
    expect_error(3, TINY + ["--replicas", "2", "--granularity", "opbyop", "--metrics", m], "not opbyop", [m],
                 exe="pathways")
    expect_error(3, TINY + ["--replicas", "2", "--stages", "2", "--metrics", m],
                 "--stages 2 needs 4 workers (--replicas 2 x 2 stages", [m], exe="pathways")


if __name__ == "__main__":
    case_main(globals(), "pw")
