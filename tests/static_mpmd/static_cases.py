#!/usr/bin/env python3
"""End-to-end tests of mpmd_train (the static model) under real mpirun.

    static_cases.py CASE BUILD_DIR

References: spmd_train on the same dense dp x tp workload (the same bits: every rank runs the
kernels spmd_train's rank of the same mesh position runs, in the same order), and
pathways_train on the same pipeline (the same bits: both models run the one traced program).
"""
import os

from harness import launch
from harness.compare import DETERMINISTIC_FIELDS, FIELDS, assert_bitwise
from harness.errors import expect_error
from harness.launch import case_main, run, supervised, supervisor_lines
from harness.outputs import metrics
from harness.workloads import TINY, train


def case_dense_bitwise_equal_to_spmd():
    # dp 3: from three summands the order of the gradient sum shows in the bits.
    meshes = ((["--dp", "2"], 2), (["--tp", "2"], 2), (["--dp", "2", "--microbatches", "2"], 2),
              (["--dp", "3", "--batch", "12"], 3), (["--dp", "2", "--precision", "bf16"], 2),
              (["--dp", "2", "--fsdp"], 2))
    for mesh, n in meshes:
        ref = train(n, "spmd" + "".join(mesh), mesh)
        for g in ("fused", "chained"):
            got = train(n, "static_" + g + "".join(mesh), mesh + ["--granularity", g], exe="static")
            assert_bitwise(ref, got, f"mpmd_train {g} {' '.join(mesh)}")
            assert got[2]["messages_per_step"] == 0, "one slice: every edge stays on its rank, no message"


def case_moe_bitwise_equal_to_spmd():
    # The experts split over the dp ranks; the AllToAll inside the block kernels. Capacity
    # (static shapes) and dropless (the counts exchanged inside the kernel, --moe-routing worker).
    moe = ["--dp", "2", "--expert-parallel", "2", "--experts", "4", "--top-k", "2", "--moe-every", "1"]
    for cap in (["--capacity-factor", "1.25"], ["--capacity-factor", "0"]):
        ref = train(2, "spmd_moe" + "".join(cap), moe + cap)
        for g in ("fused", "chained"):
            got = train(2, "static_moe_" + g + "".join(cap), moe + cap + ["--granularity", g], exe="static")
            assert_bitwise(ref, got, f"mpmd_train MoE {g} {' '.join(cap)}")


def case_pipeline_bitwise_equal_to_pathways():
    # The one pipeline program (programs/pipeline.h), run by a controller's dispatch or by every
    # rank's own list: the same bits, GPipe and 1F1B, with and without replicas.
    for extra, n in ((["--stages", "2", "--microbatches", "4"], 2),
                     (["--stages", "2", "--microbatches", "4", "--dp", "2"], 4),
                     (["--stages", "2", "--microbatches", "2", "--replicas", "2", "--batch", "8"], 4)):
        for sched in ("gpipe", "1f1b"):
            args = extra + ["--schedule", sched]
            label = "".join(args)
            islands = ["--islands", f"{n // 2}x2"] if n == 4 else ["--islands", "2x1"]
            ref = train(n + 1, "pw" + label, args + islands, exe="pathways")
            got = train(n, "static" + label, args, exe="static")
            assert_bitwise(ref, got, f"mpmd_train {' '.join(args)}", ref_name="pathways_train")
            assert got[2]["messages_per_step"] > 0, "a pipeline's activations travel between ranks"


def case_replicas_bitwise_equal_to_spmd_and_pathways():
    # Replicas of one dp x tp slice each: the pieces cross between the replicas' corresponding
    # ranks as messages and are summed in replica order, as pathways_train's islands sum them, the
    # same bits as spmd_train's replicas.
    for extra, n in ((["--replicas", "2"], 2), (["--replicas", "2", "--dp", "2"], 4),
                     (["--replicas", "2", "--dp", "2", "--fsdp"], 4)):
        ref = train(n, "spmd" + "".join(extra), extra)
        for g in ("fused", "chained"):
            args = extra + ["--granularity", g]
            got = train(n, "static" + "".join(args), args, exe="static")
            assert_bitwise(ref, got, f"mpmd_train {' '.join(args)}")
            assert got[2]["messages_per_step"] > 0, "the replicas' pieces travel between ranks"
            assert_bitwise(train(n + 1, "pw" + "".join(args), args, exe="pathways"), got,
                           f"mpmd_train {' '.join(args)} against pathways_train", ref_name="pathways_train")


def case_pipeline_1f1b_holds_fewer_activations():
    # Per stage, the most bytes of a step's intermediates alive at once: 1F1B keeps S - s
    # micro-batches' activations, GPipe all M. Wider layers than TINY's so that the activations,
    # not the step's fixed buffers, are what the stage holds.
    wide = ["--d-model", "128", "--d-ff", "512", "--seq-len", "64", "--heads", "4", "--head-dim", "32"]
    peak = {}
    for sched in ("gpipe", "1f1b"):
        quota = ["--quota", "2"] if sched == "1f1b" else []  # (1F1B's need at S = 2: 2 on stage 0, 1 on stage 1)
        got = train(2, "static_mem_" + sched, wide + ["--stages", "2", "--microbatches", "8", "--batch", "16",
                                                        "--schedule", sched] + quota, exe="static")
        peak[sched] = got[2]["peak_intermediate_bytes"]
        assert got[2]["stage_activations"] == ([8, 8] if sched == "gpipe" else [2, 1]), got[2]["stage_activations"]
        assert 0 <= got[2]["bubble"] < 1 and got[2]["bubble_bound"] == 1 / 9, got[2]
    for s, (g, f) in enumerate(zip(peak["gpipe"], peak["1f1b"])):
        assert 0 < f <= 0.5 * g, f"stage {s}: 1F1B held {f} bytes, GPipe {g}"
        print(f"stage {s}: 1F1B {f} bytes of intermediates at most, GPipe {g} ({f / g:.2f}x)")


def case_checkpoints_cross_trainers():
    ref = train(2, "ref", ["--dp", "2"])
    # spmd_train stops after its step-4 checkpoint (killed in step 5); mpmd_train resumes from it.
    ck = os.path.join(launch.TMP, "a.ckpt")
    p = run(2, TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "1"],
            expect_ok=False)
    assert p.returncode != 0
    got = train(2, "static_resumed", ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--resume",
                                      "--granularity", "chained"], exe="static")
    assert min(got[0]) == 4, f"mpmd_train resumed at {min(got[0])}"
    for s in got[0]:
        for k in FIELDS:
            assert got[0][s][k] == ref[0][s][k], f"step {s} {k} differs after resuming in mpmd_train"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"]
    # mpmd_train is killed after its step-4 checkpoint; spmd_train and pathways_train resume from it.
    ck2 = os.path.join(launch.TMP, "b.ckpt")
    p = run(2, TINY + ["--dp", "2", "--ckpt", ck2, "--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "1"],
            expect_ok=False, exe="static")
    assert p.returncode != 0
    got = train(2, "spmd_resumed", ["--dp", "2", "--ckpt", ck2, "--resume"])
    assert min(got[0]) == 4 and got[2]["weights_hash"] == ref[2]["weights_hash"], "spmd_train from mpmd_train's checkpoint"
    got = train(3, "pw_resumed", ["--dp", "2", "--ckpt", ck2, "--resume", "--granularity", "fused"], exe="pathways")
    assert got[2]["weights_hash"] == ref[2]["weights_hash"], "pathways_train from mpmd_train's checkpoint"
    # A pipeline's checkpoint is the whole model (its stages merged): spmd_train resumes it.
    ck3 = os.path.join(launch.TMP, "c.ckpt")
    pipe = ["--stages", "2", "--microbatches", "4"]
    full = train(2, "static_pipe_full", pipe, exe="static")
    p = run(2, TINY + pipe + ["--ckpt", ck3, "--ckpt-every", "2", "--kill-step", "5", "--kill-rank", "0"],
            expect_ok=False, exe="static")
    assert p.returncode != 0
    got = train(2, "static_pipe_resumed", pipe + ["--ckpt", ck3, "--resume"], exe="static")
    assert min(got[0]) == 4 and got[2]["weights_hash"] == full[2]["weights_hash"], "mpmd_train pipeline resume"
    print("checkpoints resume bitwise across the three trainers")


def case_bad_inputs_fail_cleanly():
    m = os.path.join(launch.TMP, "bad.jsonl")
    bad = (
        (2, ["--dp", "2", "--granularity", "opbyop"], "no --granularity opbyop"),
        (2, ["--dp", "2", "--spare-workers", "1"], "--spare-workers is pathways_train's, not a flag of mpmd_train"),
        (2, ["--dp", "2", "--sequential"], "--sequential is pathways_train's, not a flag of mpmd_train"),
        (2, ["--dp", "2", "--islands", "2x1"], "--islands is pathways_train's, not a flag of mpmd_train"),
        (2, ["--replicas", "2", "--experts", "4", "--capacity-factor", "1.25"], "leave out --replicas"),
        (3, ["--stages", "2", "--microbatches", "4"], "--stages 2 needs 2 ranks"),
        (2, ["--stages", "3", "--layers", "2", "--microbatches", "4"], "--stages 3 is more than --layers 2"),
        (2, ["--dp", "3"], "--dp 3 x --tp 1 = 3 ranks"),
        # The deadlock matrix's quota case: a quota below the schedule's need, refused before training.
        (2, ["--stages", "2", "--microbatches", "8", "--schedule", "gpipe", "--quota", "2"],
         "--quota 2 is below what --schedule gpipe needs on stage 0: 8 micro-batches' activations"),
        (2, ["--stages", "2", "--microbatches", "8", "--schedule", "1f1b", "--quota", "1"],
         "--quota 1 is below what --schedule 1f1b needs on stage 0: 2 micro-batches' activations"),
        (2, ["--dp", "2", "--quota", "2"], "--quota applies to pipelines"),
        (2, ["--dp", "2", "--experts", "4", "--expert-parallel", "2", "--capacity-factor", "0", "--moe-routing",
             "controller"], "no controller to route through"),
    )
    for n, args, pattern in bad:
        expect_error(n, TINY + args + ["--metrics", m], pattern, [m], exe="static")
    expect_error(3, TINY + ["--stages", "2", "--microbatches", "4", "--quota", "2", "--metrics", m],
                 "--quota is mpmd_train's", [m], exe="pathways")


def case_lost_rank_ends_the_job():
    # No controller watches the ranks: a rank killed in a step leaves its peers waiting in a
    # receive or a collective, whose watchdog (--coll-timeout) ends the job with one line naming
    # what it waited for; the checkpoint written before is intact.
    ck = os.path.join(launch.TMP, "k.ckpt")
    for extra in (["--dp", "2", "--granularity", "chained"], ["--stages", "2", "--microbatches", "4"]):
        args = TINY[:-2] + ["--coll-timeout", "5", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "3",
                                "--kill-rank", "1"] + extra
        p = run(2, args, expect_ok=False, timeout=60, exe="static")
        assert p.returncode != 0, "the job went on without a rank"
        assert os.path.exists(ck), "the step-2 checkpoint is gone"
        print("ok:", extra, "ended", p.returncode)


def case_supervisor_restarts_from_the_checkpoint():
    # Issue 38's restart for the model with no controller to remap a slice: a rank SIGKILLed in
    # step 5 (after the step-4 checkpoint; injected on the first attempt only) ends the job, the
    # supervisor runs the same command again, it resumes from the checkpoint, and the job ends
    # with the weights of the run that did not fail, bitwise (dense chained and a 1F1B pipeline).
    TINY[TINY.index("--steps") + 1] = "8"
    for mesh in (["--dp", "2", "--granularity", "chained"], ["--stages", "2", "--microbatches", "4", "--schedule", "1f1b"]):
        label = "".join(mesh)
        ref = train(2, "sup_ref" + label, mesh, exe="static")
        ck, m = os.path.join(launch.TMP, f"sup{label}.ckpt"), os.path.join(launch.TMP, f"sup{label}.jsonl")
        args = TINY + mesh + ["--ckpt", ck, "--ckpt-every", "2", "--resume", "--metrics", m]
        p = supervised(["--inject", "--kill-step 5 --kill-rank 1"], 2, args, exe="static")
        assert p.returncode == 0, f"the supervised job failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        lines = supervisor_lines(p)
        assert len(lines) == 1 and "restart 1 of at most 3, from " + ck in lines[0], lines
        got = metrics(m)
        assert min(got[0]) == 4, f"the restart began at step {min(got[0])}, not at the step-4 checkpoint"
        for st in got[0]:
            for k in DETERMINISTIC_FIELDS:
                assert got[0][st][k] == ref[0][st][k], f"step {st} {k}: {got[0][st][k]} vs {ref[0][st][k]}"
        assert got[2]["weights_hash"] == ref[2]["weights_hash"], "final weights differ from the run without failure"
        print(f"{' '.join(mesh)}: {lines[0]}; steps 4..7 and the final weights bitwise equal to the run without failure")


if __name__ == "__main__":
    case_main(globals(), "static")
