#!/usr/bin/env python3
"""End-to-end tests of spmd_train under real mpirun (one CTest case per function).

    spmd_cases.py CASE BUILD_DIR

Each case launches spmd_train with a tiny model on the default corpus and checks the metrics
(JSON lines), checkpoints and exit codes against an independent run: another decomposition of
the same computation (dp, tp), the same run again (determinism), or the uninterrupted run
(kill and resume). What the case files share (launching ranks, reading outputs, checking error
lines, the tiny workload) is tests/harness/.
"""
import json
import math
import os
import signal
import subprocess
import time

from harness import launch
from harness.checks import check_mfu_never_over_one, check_nonfinite_stop, check_overlap, nan_step_runs
from harness.compare import DETERMINISTIC_FIELDS, RTOL, assert_close_curves, same_bits
from harness.errors import expect_error, one_error_line
from harness.launch import (MPIRUN, NP_FLAG, SUPERVISE, case_main, mpmd, run, small_tmpfs, supervised,
                            supervisor_lines, trainer, watch_a_stop)
from harness.outputs import finite_checkpoint, metrics, poison_checkpoint, temp_leftovers
from harness.workloads import TINY, train


def case_dp_matches_dp1():
    ref = train(1, "dp1", ["--dp", "1"])
    assert_close_curves(ref, train(2, "dp2", ["--dp", "2"]), RTOL, "dp=2 vs dp=1")
    assert_close_curves(ref, train(4, "dp4", ["--dp", "4"]), RTOL, "dp=4 vs dp=1")
    # Gradient accumulation is another decomposition of the same batch too.
    assert_close_curves(ref, train(2, "dp2m2", ["--dp", "2", "--microbatches", "2"]), RTOL,
                        "dp=2 x 2 micro-batches vs dp=1")


def case_tp_matches_tp1():
    ref = train(1, "tp1", ["--tp", "1"])
    assert_close_curves(ref, train(2, "tp2", ["--tp", "2"]), RTOL, "tp=2 vs tp=1")
    assert_close_curves(ref, train(4, "dp2tp2", ["--dp", "2", "--tp", "2"]), RTOL, "dp=2 x tp=2 vs dp=1")


def case_overlap_off_is_bitwise_equal():
    # Overlap changes only when buckets start, not what is summed: identical bits.
    a = train(2, "ov_on", ["--dp", "2", "--bucket-bytes", "16384"])
    b = train(2, "ov_off", ["--dp", "2", "--bucket-bytes", "16384", "--no-overlap"])
    assert a[2]["weights_hash"] == b[2]["weights_hash"], "overlap on/off changed the weights"
    assert [a[0][s]["loss"] for s in sorted(a[0])] == [b[0][s]["loss"] for s in sorted(b[0])]


def case_same_seed_is_bitwise_identical():
    ck1, ck2 = os.path.join(launch.TMP, "det1.ckpt"), os.path.join(launch.TMP, "det2.ckpt")
    a = train(2, "det1", ["--dp", "2", "--ckpt", ck1])
    b = train(2, "det2", ["--dp", "2", "--ckpt", ck2])
    for s in a[0]:
        for k in DETERMINISTIC_FIELDS:
            assert a[0][s][k] == b[0][s][k], f"step {s} {k}: {a[0][s][k]} vs {b[0][s][k]}"
    assert a[1] == b[1], "validation losses differ"
    assert a[2]["weights_hash"] == b[2]["weights_hash"]
    assert a[2]["final_loss"] == b[2]["final_loss"]
    with open(ck1, "rb") as f1, open(ck2, "rb") as f2:
        assert f1.read() == f2.read(), "checkpoints differ"
    # A different seed gives a different model: the check above can fail.
    c = train(2, "det3", ["--dp", "2", "--seed", "7"])
    assert c[2]["weights_hash"] != a[2]["weights_hash"]


def resume_matches(ref, ckpt, label):
    got = train(2, label, ["--dp", "2", "--ckpt", ckpt, "--ckpt-every", "2", "--resume"])
    first = min(got[0])
    assert first > 0, f"{label}: the resumed run started from step 0 (no checkpoint was written?)"
    for s in got[0]:
        for k in DETERMINISTIC_FIELDS:
            assert got[0][s][k] == ref[0][s][k], f"{label}: step {s} {k}: {got[0][s][k]} vs {ref[0][s][k]}"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"], f"{label}: final weights differ"
    print(f"{label}: resumed at step {first}, steps {first}..{max(got[0])} and the final weights match bitwise")


def case_kill_and_resume_is_bitwise():
    ref = train(2, "ref", ["--dp", "2", "--steps", "8"])
    TINY[TINY.index("--steps") + 1] = "8"
    # 1. A rank SIGKILLs itself in the middle of step 5 (after the step-4 checkpoint).
    ck = os.path.join(launch.TMP, "kill.ckpt")
    p = run(2, TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "5",
                       "--kill-rank", "1", "--metrics", os.path.join(launch.TMP, "killed.jsonl")],
            expect_ok=False)
    assert p.returncode != 0, "the killed run exited 0"
    assert not os.path.exists(os.path.join(launch.TMP, "killed.jsonl")), "a killed run left a metrics file"
    resume_matches(ref, ck, "resume after --kill-step")
    # 2. An outside SIGKILL of one rank at an arbitrary moment (possibly mid-checkpoint-write):
    # once both ranks run and a checkpoint exists, wait a while, then kill the highest rank's
    # process. The wait starts at the ranks, not at the launch: on a loaded machine (ctest -j)
    # mpirun can take longer than the delay to start them.
    ck2 = os.path.join(launch.TMP, "kill2.ckpt")

    def ranks():
        out = subprocess.run(["pgrep", "-f", f"spmd_train.*{ck2}"], capture_output=True, text=True).stdout
        return [int(x) for x in out.split() if int(x) != proc.pid]

    for delay in (0.05, 0.23, 0.41):
        cmd = MPIRUN + [NP_FLAG, "2", trainer()] + TINY + ["--dp", "2", "--ckpt", ck2, "--ckpt-every", "2",
                                                          "--resume", "--step-sleep-ms", "200"]
        proc = subprocess.Popen(cmd, env=launch.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not (os.path.exists(ck2) and len(ranks()) == 2) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(delay)
        pids = ranks()
        assert pids and proc.poll() is None, f"no rank to kill: the run ended too early ({proc.poll()})"
        os.kill(max(pids), signal.SIGKILL)
        try:
            assert proc.wait(timeout=120) != 0, "the killed job exited 0"
        except subprocess.TimeoutExpired:
            ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,args"], capture_output=True, text=True).stdout
            raise AssertionError(f"the job went on for 120 s after rank pid {max(pids)} of {pids} was killed:\n{ps}")
    resume_matches(ref, ck2, "resume after an outside SIGKILL")


def case_bad_inputs_fail_cleanly():
    m = os.path.join(launch.TMP, "bad.jsonl")
    expect_error(2, TINY + ["--dp", "3", "--metrics", m], "--dp 3 x --tp 1 = 3 ranks", [m])
    expect_error(3, TINY + ["--tp", "3", "--metrics", m], "n_heads=4 is not divisible by tp=3", [m])
    expect_error(2, TINY + ["--dp", "2", "--data", "/nonexistent/corpus.txt", "--metrics", m], "/nonexistent/corpus.txt", [m])
    empty = os.path.join(launch.TMP, "empty.txt")
    open(empty, "w").close()
    expect_error(2, TINY + ["--dp", "2", "--data", empty, "--metrics", m], "empty.txt", [m])
    expect_error(2, TINY + ["--dp", "2", "--metrics", "/nonexistent/dir/m.jsonl"], "--metrics /nonexistent/dir/m.jsonl")
    expect_error(2, TINY + ["--dp", "2", "--batch", "7", "--metrics", m], "--batch 7 is not divisible", [m])
    expect_error(2, TINY + ["--dp", "2", "--no-such-flag"], "no-such-flag")
    # A checkpoint of another config is refused.
    ck = os.path.join(launch.TMP, "other.ckpt")
    train(2, "other", ["--dp", "2", "--ckpt", ck])
    args = [a for a in TINY]
    args[args.index("--d-model") + 1] = "32"
    expect_error(2, args + ["--head-dim", "8", "--dp", "2", "--ckpt", ck, "--resume", "--metrics", m],
                 "d_model", [m])
    expect_error(2, TINY + ["--dp", "2", "--lr", "5e-3", "--ckpt", ck, "--resume", "--metrics", m],
                 "another workload", [m])
    # The mesh (issue 15): replicas x dp x tp must be the job, --fsdp needs a dp axis, the replica
    # reduction is one of two.
    expect_error(2, TINY + ["--replicas", "2", "--dp", "2", "--metrics", m], "mesh --replicas 2 x --dp 2", [m])
    expect_error(2, TINY + ["--replicas", "2", "--fsdp", "--metrics", m], "--fsdp shards over --dp", [m])
    expect_error(2, TINY + ["--replicas", "2", "--replica-reduce", "ring", "--metrics", m], "--replica-reduce", [m])


def case_trace_and_metrics_are_complete():
    t = os.path.join(launch.TMP, "trace.json")
    steps, vals, final = train(2, "traced", ["--dp", "2", "--trace", t, "--bucket-bytes", "65536"])
    doc = json.load(open(t))
    ev = doc["traceEvents"]
    pids = {e["pid"] for e in ev}
    assert pids == {0, 1}, f"trace rows {pids}"
    names = {e["name"] for e in ev}
    for n in ("forward", "backward", "optimizer", "allreduce bucket 0"):
        assert n in names, f"trace lacks {n}: {sorted(names)[:20]}"
    s0 = steps[0]
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "compute_ms", "comm_ms", "wait_ms"):
        assert k in s0, f"metrics line lacks {k}"
    for k in ("min", "median", "max", "slowest_rank"):
        assert k in s0["comm_ms"]
    for k in ("tokens_per_s", "mfu", "final_loss", "final_val_loss", "weights_hash"):
        assert k in final, f"final line lacks {k}"
    assert len(steps) == 6 and math.isfinite(final["final_loss"]) and final["final_val_loss"] > 0


# ---- Issue 18: real overlap by default ------------------------------------------------------------


def case_first_bucket_overlaps_backward():
    def traced(name, extra):
        t = os.path.join(launch.TMP, f"overlap_{name}.json")
        train(2, "overlap_" + name, ["--dp", "2", "--trace", t] + extra)
        return t
    check_overlap(traced, (0, 1), "spmd_train --dp 2")


# ---- Issue 17: nothing lost, nothing thrown away at the end -------------------------------------


def case_full_disk_leaves_nothing():
    # 1. --metrics on a full filesystem: one line, non-zero, nothing under the final name, no
    # temporary file (the old code exited 0 with an empty file).
    full = small_tmpfs("full")
    subprocess.run(["dd", "if=/dev/zero", f"of={full}/fill", "bs=4k"], capture_output=True)
    m = os.path.join(full, "m.jsonl")
    p = run(2, TINY + ["--dp", "2", "--steps", "2", "--metrics", m], expect_ok=False)
    one_error_line(p, "No space left on device")
    assert not os.path.exists(m), "a metrics file was left under its final name"
    assert not temp_leftovers(full), f"temporary files left: {temp_leftovers(full)}"
    # 2. A checkpoint larger than the filesystem (the metrics elsewhere): the same, and the
    # metrics file is not moved into place either.
    small = small_tmpfs("small")
    ck, m2 = os.path.join(small, "c.ckpt"), os.path.join(launch.TMP, "m2.jsonl")
    p = run(2, TINY + ["--dp", "2", "--steps", "2", "--ckpt", ck, "--metrics", m2], expect_ok=False)
    one_error_line(p, f"checkpoint {ck}")
    assert not os.path.exists(ck) and not os.path.exists(m2), "an output was left under its final name"
    assert not temp_leftovers(small) and not temp_leftovers(launch.TMP), "temporary files left"


def case_outputs_checked_before_training():
    d = os.path.join(launch.TMP, "adir")
    os.makedirs(d)
    for flag in ("--metrics", "--ckpt", "--trace"):
        p = run(2, TINY + ["--dp", "2", flag, d], expect_ok=False)
        one_error_line(p, f"{flag} {d} is a directory")
        assert "step" not in p.stdout, f"{flag} DIR: the run trained before failing:\n{p.stdout}"
        assert not temp_leftovers(launch.TMP), f"{flag} DIR left {temp_leftovers(launch.TMP)}"
    p = run(2, TINY + ["--dp", "2", "--ckpt", os.path.join(launch.TMP, "missing", "c.ckpt")], expect_ok=False)
    one_error_line(p, "does not exist")


def case_bad_data_fails_before_training():
    fifo = os.path.join(launch.TMP, "fifo")
    os.mkfifo(fifo)
    try:  # the old code blocked forever opening it
        p = run(2, TINY + ["--dp", "2", "--data", fifo], expect_ok=False, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("--data FIFO hung")
    one_error_line(p, "FIFO")
    # --vocab below the data's bytes: named before training, not an internal check in the model.
    p = run(2, TINY + ["--dp", "2", "--vocab", "100"], expect_ok=False)
    one_error_line(p, "--vocab 100 is smaller than the data's symbols")
    # A model too large for this host: both numbers, before anything is allocated (the old code
    # ended in std::bad_alloc). 1.8 MB of text so that the data holds the windows.
    big = os.path.join(launch.TMP, "big.txt")
    with open(big, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 40000)
    p = run(2, TINY + ["--dp", "2", "--batch", "2", "--seq-len", "300000", "--val-fraction", "0.5", "--data", big],
            expect_ok=False)
    line = one_error_line(p, "needs about")
    assert "available" in line and "GiB" in line, line


def case_ranks_agree_on_the_configuration():
    # MPMD launches with other flags on one rank: named before training (the old code trained
    # apart silently with --seed, and corrupted memory with --bucket-bytes).
    a = TINY + ["--dp", "2", "--steps", "2"]
    p = mpmd([(1, a + ["--seed", "1"]), (1, a + ["--seed", "2"])])
    one_error_line(p, "rank 1 started with other flags than rank 0")
    assert "seed=2 vs 1" in p.stderr, p.stderr
    p = mpmd([(1, a + ["--bucket-bytes", "100000"]), (1, a + ["--bucket-bytes", "50000"])])
    one_error_line(p, "bucket_bytes=50000 vs 100000")
    # The same flags in both parts: it trains.
    p = mpmd([(1, a), (1, a)])
    assert p.returncode == 0, p.stderr


def case_small_cases_are_named():
    m = os.path.join(launch.TMP, "s.jsonl")
    expect_error(2, TINY + ["--dp", "2", "--kill-step", "1", "--kill-rank", "2", "--metrics", m], "--kill-rank 2", [m])
    expect_error(2, TINY + ["--dp", "2", "--steps", "-3"], "--steps must be at least 1 (got -3)")
    # Resuming with another --steps names the field, in one short line (not two JSON dumps).
    ck = os.path.join(launch.TMP, "s.ckpt")
    train(2, "s6", ["--dp", "2", "--ckpt", ck])
    p = run(2, TINY + ["--dp", "2", "--steps", "8", "--ckpt", ck, "--resume"], expect_ok=False)
    line = one_error_line(p, "optim/total_steps=6 vs 8")
    assert "--steps" in line and line.count("{") == 0, line


def case_sigterm_removes_temp_files():
    # A run stopped by SIGTERM (the launcher's, after an abort; or a Ctrl-C) leaves no temporary
    # file: the handler unlinks the live ones and re-raises.
    m = os.path.join(launch.TMP, "sig.jsonl")
    cmd = MPIRUN + [NP_FLAG, "2", trainer()] + TINY + ["--dp", "2", "--steps", "200", "--step-sleep-ms", "100",
                                                      "--metrics", m]
    proc = subprocess.Popen(cmd, env=launch.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not temp_leftovers(launch.TMP) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        tmp = temp_leftovers(launch.TMP)
        assert tmp, "the metrics file's temporary file never appeared"
        pid = int(tmp[0].rsplit(".", 1)[1])  # PATH.tmp.<pid>: rank 0's process
        os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=120) != 0, "the job exited 0 after a SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not temp_leftovers(launch.TMP), f"temporary files left after SIGTERM: {temp_leftovers(launch.TMP)}"
    assert not os.path.exists(m)


def case_compare_script_flags():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi_scripts", "compare.sh")
    for args, pattern in ((["--np"], "--np needs a value"), (["--rounds", "x"], "--rounds must be a whole number"),
                          (["--np", "--steps", "3"], "--np needs a value"), (["--steps", "0"], "--steps 0 is out of range")):
        p = subprocess.run(["bash", script] + args, capture_output=True, text=True, timeout=60,
                           env=dict(launch.ENV, BUILD_DIR=os.path.join(launch.TMP, "never-built")))
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and pattern in lines[0], f"compare.sh {args}: {p.returncode} {p.stderr}"
        print("ok:", lines[0])



# ---- issue 15: the mesh replicas x dp x tp, sharded data parallelism ------------------------------

def tiny_pieces():
    """The TINY model's FSDP pieces (train/fsdp.h), counted from its shapes (model/params.h):
    elements of the embedding, of one layer, of the final norm, and the number of layers."""
    a = dict(zip(TINY[::2], TINY[1::2]))
    C, L, H, D, F = (int(a[k]) for k in ("--d-model", "--layers", "--heads", "--head-dim", "--d-ff"))
    V = 256
    return V * C, C + C * H * D + 2 * C * D + H * D * C + 3 * C * F, C, L


def tiny_params():
    """Parameters of the TINY model."""
    e, n, f, L = tiny_pieces()
    return e + L * n + f


def fsdp_state_bytes(D):
    """What an FSDP rank holds at D, from the shapes: the four shards (parameters, gradients, two
    moments) of every piece cut in D slices of ceil(n / D), plus the most held at once during the
    step: the gathered embedding and final norm with their full gradients, ONE gathered layer, ONE
    layer's full gradient (the slot of each) and the reduce-scatter scratch of one slice."""
    e, n, f, L = tiny_pieces()
    s = lambda x: -(-x // D)
    shard = s(e) + L * s(n) + s(f)
    held = max(s(e), s(n), s(f)) + 2 * D * (s(e) + s(f)) + D * s(n) + n
    return 4 * (4 * shard + held)


def case_fsdp_matches_dp():
    # Bitwise at D=2, one micro-batch, clipping off: every rank computes each layer's gradient
    # with the same (gathered, identical) weights as plain dp, and the 2-rank reduce-scatter sums
    # a + b as the 2-rank AllReduce does (commutative: order-free); AdamW is per element. Only
    # the squared norm is summed in another order (over shards instead of whole tensors), so with
    # clipping on, the clip factor may differ in its last bits: then RTOL, as for any other
    # decomposition (harness/compare.py). With 2 micro-batches FSDP sums each micro-batch over ranks before
    # accumulating (plain dp accumulates first): RTOL too. grad_norm is compared only bitwise-run.
    off = ["--max-grad-norm", "0"]
    ref = train(2, "plain_dp2", ["--dp", "2"] + off)
    fs = train(2, "fsdp_dp2", ["--dp", "2", "--fsdp"] + off)
    same_bits(ref, fs, "fsdp D=2 vs dp=2 (no clipping)", ("step", "loss", "lr"))
    # The reported norm: the same squares summed in another order (in double): relative error
    # <= n * 2^-53 for n ~ 1e5 terms, ~1e-11.
    for s in ref[0]:
        a, b = ref[0][s]["grad_norm"], fs[0][s]["grad_norm"]
        assert abs(a - b) <= 1e-11 * a, f"step {s}: grad_norm {b} vs {a}"
    assert_close_curves(train(2, "plain_dp2c", ["--dp", "2"]), train(2, "fsdp_dp2c", ["--dp", "2", "--fsdp"]),
                        RTOL, "fsdp D=2 vs dp=2 (clipping)")
    assert_close_curves(ref, train(2, "fsdp_dp2m2", ["--dp", "2", "--fsdp", "--microbatches", "2"] + off),
                        RTOL, "fsdp D=2 x 2 micro-batches vs dp=2")
    # Memory: plain dp holds 4 full buffers (params, grads, m, v): 16 bytes a parameter; FSDP its
    # shards plus one gathered layer and one layer's gradient at most (counted from the shapes).
    P = tiny_params()
    assert ref[2]["state_bytes_per_rank"] == [16 * P] * 2, f"plain state {ref[2]['state_bytes_per_rank']} vs 16 x {P}"
    want = fsdp_state_bytes(2)
    assert fs[2]["state_bytes_per_rank"] == [want] * 2, f"fsdp state {fs[2]['state_bytes_per_rank']} vs {want} (P = {P})"
    assert fs[2]["state_bytes"] == max(fs[2]["state_bytes_per_rank"])
    assert all(x > 0 for x in fs[2]["peak_resident_bytes_per_rank"])
    assert fs[2]["peak_rss_bytes"] == max(fs[2]["peak_resident_bytes_per_rank"])


def case_replicas_match_dp():
    # R=2 x D=1: the cross-replica sum of two gradients, a + b, is order-free: hierarchical (an
    # AllReduce over the replica group), flat and plain dp=2 give the same bits.
    ref = train(2, "r_dp2", ["--dp", "2"])
    same_bits(ref, train(2, "r2_hier", ["--replicas", "2"]), "replicas=2 hierarchical vs dp=2")
    same_bits(ref, train(2, "r2_flat", ["--replicas", "2", "--replica-reduce", "flat"]), "replicas=2 flat vs dp=2")
    # R=2 x D=2: four summands, summed in another order (pairs inside the replica, then across;
    # or one 4-rank AllReduce): RTOL (the tolerance of any other decomposition, harness/compare.py).
    h = train(4, "r2d2_hier", ["--replicas", "2", "--dp", "2"])
    f = train(4, "r2d2_flat", ["--replicas", "2", "--dp", "2", "--replica-reduce", "flat"])
    assert_close_curves(h, f, RTOL, "replicas=2 x dp=2 hierarchical vs flat")
    assert_close_curves(ref, h, RTOL, "replicas=2 x dp=2 hierarchical vs dp=2")
    assert_close_curves(ref, train(4, "r2d2_fsdp", ["--replicas", "2", "--dp", "2", "--fsdp"]), RTOL,
                        "replicas=2 x dp=2 fsdp vs dp=2")


def killed_at_5(n, ck, mesh):
    """Runs 8 steps with a checkpoint every 4 and SIGKILLs rank 0 in step 5: leaves the step-4 file."""
    p = run(n, TINY + mesh + ["--ckpt", ck, "--ckpt-every", "4", "--kill-step", "5",
                              "--kill-rank", "0", "--metrics", os.path.join(launch.TMP, "killed.jsonl")], expect_ok=False)
    assert p.returncode != 0 and os.path.exists(ck), "the killed run left no step-4 checkpoint"


def case_resume_across_meshes():
    # The checkpoint holds whole tensors whatever the mesh: R=2 x D=2 --fsdp resumes at R=1 x D=1
    # and the reverse. Against the uninterrupted run of the resuming mesh: RTOL (the first 4
    # steps ran on another decomposition). On the same mesh: bitwise, as for dp.
    fsdp_mesh = ["--replicas", "2", "--dp", "2", "--fsdp"]
    TINY[TINY.index("--steps") + 1] = "8"
    steps8 = []
    ref1 = train(1, "mesh_ref1", steps8)
    ref4 = train(4, "mesh_ref4", steps8 + fsdp_mesh)
    ck = os.path.join(launch.TMP, "mesh_a.ckpt")
    killed_at_5(4, ck, fsdp_mesh)
    got = train(1, "mesh_a", steps8 + ["--ckpt", ck, "--resume"])
    assert min(got[0]) == 4, f"resumed at step {min(got[0])}, not 4"
    assert_close_curves(({s: ref1[0][s] for s in got[0]}, ref1[1], None), got, RTOL, "R2xD2 fsdp -> R1xD1")
    ck = os.path.join(launch.TMP, "mesh_b.ckpt")
    killed_at_5(1, ck, [])
    got = train(4, "mesh_b", steps8 + fsdp_mesh + ["--ckpt", ck, "--resume"])
    assert min(got[0]) == 4
    assert_close_curves(({s: ref4[0][s] for s in got[0]}, ref4[1], None), got, RTOL, "R1xD1 -> R2xD2 fsdp")
    ck = os.path.join(launch.TMP, "mesh_c.ckpt")
    killed_at_5(4, ck, fsdp_mesh)
    got = train(4, "mesh_c", steps8 + fsdp_mesh + ["--ckpt", ck, "--resume"])
    assert min(got[0]) == 4
    for s in got[0]:
        for k in DETERMINISTIC_FIELDS:
            assert got[0][s][k] == ref4[0][s][k], f"same-mesh resume: step {s} {k}"
    assert got[2]["weights_hash"] == ref4[2]["weights_hash"], "same-mesh resume: final weights differ"
    print("R2xD2 fsdp -> R2xD2 fsdp: bitwise equal to the uninterrupted run")


# ---- issue 38: the supervisor restarts a failed job from its checkpoint ---------------------------

def case_supervisor_stops_on_a_refusal():
    # Issue 59: a flag no trainer takes, or a mesh the launch does not fit, is refused at start-up
    # with exit 64 (train/bootstrap.h kExitRefused), which the launcher passes on; the supervisor
    # does not restart it (it restarted such a run 25 times a minute) but stops at once, after the
    # trainer's one line, with one line of its own, and exits 64.
    ck = os.path.join(launch.TMP, "refused.ckpt")
    for exe, n, bad, want in (("spmd", 2, ["--dp", "2", "--bogus-flag"], "--bogus-flag is not a flag"),
                              ("spmd", 2, ["--dp", "3"], "--dp 3"),
                              ("pathways", 3, ["--dp", "2", "--bogus-flag"], "--bogus-flag is not a flag")):
        args = TINY + bad + ["--ckpt", ck, "--resume"]
        p = run(n, args, expect_ok=False, timeout=120, exe=exe)
        assert p.returncode == 64, f"{exe} {bad}: exit {p.returncode}, not 64:\n{p.stderr[-2000:]}"
        t0 = time.time()
        p = supervised(["--max-restarts", "5"], n, args, exe=exe)
        assert p.returncode == 64, f"{exe} {bad}: the supervisor exited {p.returncode}:\n{p.stderr[-2000:]}"
        assert supervisor_lines(p) == ["supervise.sh: attempt 1 was refused at start-up (exit 64: a usage, configuration "
                                       "or input error, named above); no restart can fix it"], p.stderr
        errors = [l for l in p.stderr.splitlines() if ": error: " in l and want in l]
        assert len(errors) == 1, p.stderr
        assert not os.path.exists(ck)
        print(f"ok: {exe} {' '.join(bad)}: exit 64, not restarted ({time.time() - t0:.1f} s): {errors[0]}")


def case_resume_at_steps_reports_no_figures():
    # Issue 59: resuming a checkpoint already at --steps runs no step. It recorded final_loss 0.0,
    # 0 tokens/s and MFU 0%; now those figures are null and the done line says why. The
    # validation loss and the weights (measured at the end) stay, and equal the first run's.
    steps = TINY[TINY.index("--steps") + 1]
    for exe, n in (("spmd", 2), ("pathways", 3)):
        ck = os.path.join(launch.TMP, f"at_steps_{exe}.ckpt")
        first = train(n, f"at_steps_{exe}_1", ["--dp", "2", "--ckpt", ck], exe=exe)
        m = os.path.join(launch.TMP, f"at_steps_{exe}_2.jsonl")
        p = run(n, TINY + ["--dp", "2", "--ckpt", ck, "--resume", "--metrics", m], exe=exe)
        steps_run, vals, final = metrics(m)
        assert not steps_run, f"{exe}: steps ran after resuming at --steps {steps}: {sorted(steps_run)}"
        for k in ("tokens_per_s", "mfu", "step_ms_p50", "step_ms_p90", "comm_share", "final_loss"):
            assert k in final and final[k] is None, f"{exe}: {k} = {final.get(k)!r}, not null"
        assert "mfu_fma" not in final
        assert final["weights_hash"] == first[2]["weights_hash"]
        assert final["final_val_loss"] == first[2]["final_val_loss"]
        done = [l for l in p.stdout.splitlines() if "done:" in l]
        assert len(done) == 1 and "no step ran" in done[0] and "tok/s" not in done[0], p.stdout[-1500:]
        print(f"ok: {exe}: {done[0]}")


def case_supervisor_restarts_from_the_checkpoint():
    # A rank SIGKILLed in step 5 (after the step-4 checkpoint; injected on the first attempt
    # only): the supervisor restarts the same command, which resumes from the checkpoint, and the
    # job ends with the weights of the run that did not fail, bitwise, in both trainers (for
    # pathways_train a lost worker ends the job, and the restart is the job's; issue 38's
    # fallback where MPI cannot keep a job alive through a lost rank).
    TINY[TINY.index("--steps") + 1] = "8"
    for exe, n, mesh, victim in (("spmd", 2, ["--dp", "2"], "1"), ("pathways", 3, ["--dp", "2"], "2")):
        ref = train(n, f"sup_ref_{exe}", mesh, exe=exe)
        ck, m = os.path.join(launch.TMP, f"sup_{exe}.ckpt"), os.path.join(launch.TMP, f"sup_{exe}.jsonl")
        args = TINY + mesh + ["--ckpt", ck, "--ckpt-every", "2", "--resume", "--metrics", m]
        p = supervised(["--inject", f"--kill-step 5 --kill-rank {victim}"], n, args, exe=exe)
        assert p.returncode == 0, f"{exe}: the supervised job failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        lines = supervisor_lines(p)
        assert len(lines) == 1 and "restart 1 of at most 3, from " + ck in lines[0], lines
        got = metrics(m)
        assert min(got[0]) == 4, f"{exe}: the restart began at step {min(got[0])}, not at the step-4 checkpoint"
        for st in got[0]:
            for k in DETERMINISTIC_FIELDS:
                assert got[0][st][k] == ref[0][st][k], f"{exe}: step {st} {k}: {got[0][st][k]} vs {ref[0][st][k]}"
        assert got[2]["weights_hash"] == ref[2]["weights_hash"], f"{exe}: final weights differ from the run without failure"
        print(f"{exe}: {lines[0]}; steps 4..7 and the final weights bitwise equal to the run without failure")
    # No restart left: the job's own exit code, and one line saying so.
    ck = os.path.join(launch.TMP, "sup_none.ckpt")
    p = supervised(["--max-restarts", "0", "--inject", "--kill-step 5 --kill-rank 1"], 2,
                   TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--resume"])
    lines = supervisor_lines(p)
    assert p.returncode != 0 and len(lines) == 1 and "no restart left (--max-restarts 0)" in lines[0], (p.returncode, lines)
    # A restart on a smaller mesh (2 ranks, then 1: the checkpoint holds whole tensors): the
    # uninterrupted single-rank run's losses from step 4 on, within RTOL (the first 4 steps ran
    # on dp 2).
    ref1 = train(1, "sup_ref1", [])
    ck, m = os.path.join(launch.TMP, "sup_small.ckpt"), os.path.join(launch.TMP, "sup_small.jsonl")
    p = supervised(["--inject", "--kill-step 5 --kill-rank 1"], 2,
                   TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--resume"],
                   restart=(1, TINY + ["--ckpt", ck, "--resume", "--metrics", m]))
    assert p.returncode == 0, f"the restart on 1 rank failed ({p.returncode}):\n{p.stderr}"
    got = metrics(m)
    assert min(got[0]) == 4
    assert_close_curves(({st: ref1[0][st] for st in got[0]}, ref1[1], None), got, RTOL, "dp 2 -> dp 1 after a restart")
    # A command that cannot restart from a checkpoint is refused before anything runs.
    for bad, want in ((["--dp", "2"], "the command needs --ckpt FILE and --resume"),
                      (["--dp", "2", "--ckpt", ck], "the command needs --ckpt FILE and --resume")):
        p = supervised([], 2, TINY + bad)
        assert p.returncode == 2 and supervisor_lines(p) == [f"supervise.sh: error: {want}, so that a restart "
                                                             "continues from the checkpoint"], (p.returncode, p.stderr)
    p = subprocess.run(["bash", SUPERVISE, "--max-restarts", "x", "--", "true"], capture_output=True, text=True)
    assert p.returncode == 2 and "--max-restarts must be a whole number" in p.stderr, p.stderr
    # --done-file: an attempt that exits 0 without writing the file did not finish (OpenMPI's
    # mpirun --enable-recovery exits 0 whatever its ranks' codes); one that writes it did.
    never, done = os.path.join(launch.TMP, "never.jsonl"), os.path.join(launch.TMP, "done.jsonl")
    p = subprocess.run(["bash", SUPERVISE, "--max-restarts", "1", "--done-file", never, "--", "true", "--ckpt", ck,
                        "--resume"], capture_output=True, text=True, timeout=60)
    lines = supervisor_lines(p)
    assert p.returncode == 1 and len(lines) == 2 and all(f"without writing {never}" in l for l in lines), (p.returncode, lines)
    assert "no restart left" in lines[1], lines
    p = subprocess.run(["bash", SUPERVISE, "--done-file", done, "--", "bash", "-c", f"touch {done}", "_", "--ckpt", ck,
                        "--resume"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not supervisor_lines(p), (p.returncode, p.stderr)
    # One that writes it and exits non-zero finished too (a pathways_train that lost a rank ends
    # the job with MPI_Abort once its metrics are written), said in one line, no restart.
    p = subprocess.run(["bash", SUPERVISE, "--done-file", done, "--", "bash", "-c", f"touch {done}; exit 3", "_",
                        "--ckpt", ck, "--resume"], capture_output=True, text=True, timeout=60)
    lines = supervisor_lines(p)
    assert p.returncode == 0 and len(lines) == 1 and "exit 3 after" in lines[0] and f"wrote {done}" in lines[0], lines


# ---- issue 38: a stopped rank (SIGSTOP: a hung host) in every execution model --------------------

def case_stopped_rank_ends_the_job():
    """A rank stopped (SIGSTOP) in the middle of step 3, as a hung host: every model ends the job
    non-zero within 2x the timeout of the stop, with one line naming the stopped rank, and no
    process is left (the launcher's abort ends the stopped one). SPMD and the static model: the
    peer's watchdog (collective or receive); Pathways: the controller's liveness."""
    timeout = 3
    for exe, n, extra in (("spmd", 2, ["--dp", "2"]), ("static", 2, ["--dp", "2", "--granularity", "chained"]),
                          ("pathways", 3, ["--dp", "2", "--granularity", "chained"])):
        args = TINY[:-2] + ["--coll-timeout", str(timeout), "--steps", "30", "--kill-step", "3", "--kill-rank", "1",
                            "--kill-signal", "stop"] + extra
        rc, out, stopped_at, ended, _ = watch_a_stop(MPIRUN + [NP_FLAG, str(n), trainer(exe)] + args, timeout=120)
        assert stopped_at is not None, f"{exe}: no rank was seen stopped:\n{out[-3000:]}"
        assert rc != 0, f"{exe}: the job with a stopped rank exited 0"
        named = [l for l in out.splitlines() if "aborting the job" in l and "world rank 1" in l]
        assert named, f"{exe}: no line names world rank 1:\n{out[-3000:]}"
        took = ended - stopped_at
        # (2x the timeout, plus 5 s for a machine whose 2 cores other work shares)
        assert took <= 2 * timeout + 5, f"{exe}: ended {took:.1f} s after the stop (timeout {timeout} s)"
        print(f"{exe}: ended {rc} {took:.1f} s after the stop: {named[0][:160]}")


# ---- issue 42: nothing silent - non-finite training ends the run ---------------------------------

def case_nonfinite_stops_the_run():
    check_nonfinite_stop(2, ["--dp", "2"], "spmd", "diverged")
    ref = train(2, "nan_ref", ["--dp", "2"])
    got = nan_step_runs(2, ["--dp", "2"], "spmd", "nan_dp2")
    # The skipped step changed nothing: steps 0, 1 are the reference's; the weights then differ
    # (one update fewer, the later steps' learning rates and bias corrections the same).
    for s in (0, 1):
        assert got[0][s]["loss"] == ref[0][s]["loss"]
    assert got[2]["weights_hash"] != ref[2]["weights_hash"]
    assert got[2]["final_loss"] == got[0][5]["loss"]
    # The same with --fsdp (its own update path).
    fs = train(2, "nan_fsdp", ["--dp", "2", "--fsdp", "--nan-step", "2", "--skip-nonfinite", "1"])
    assert fs[2]["skipped_nonfinite"] == 1 and fs[0][2]["skipped"]
    # A checkpoint holding a NaN (in a parameter, then in a moment; the file otherwise valid) is
    # refused on --resume, naming the file and the tensor; the clean one resumes.
    ck = os.path.join(launch.TMP, "clean.ckpt")
    killed = run(2, TINY + ["--dp", "2", "--ckpt", ck, "--ckpt-every", "2", "--kill-step", "3", "--kill-rank", "1"],
                 expect_ok=False)
    assert killed.returncode != 0 and finite_checkpoint(ck) == 2
    for group, name, kind in (("params", "layers.0.wq", "parameter"), ("adam_v", "embed", "AdamW second moment")):
        bad = os.path.join(launch.TMP, f"nan_{group}.ckpt")
        poison_checkpoint(ck, bad, group, name, 5)
        line = one_error_line(run(2, TINY + ["--dp", "2", "--ckpt", bad, "--resume"], expect_ok=False),
                              f"checkpoint {bad} holds a non-finite value (nan) in {kind} {name}, element 5")
        assert "use an earlier checkpoint" in line, line
    resumed = train(2, "clean_resume", ["--dp", "2", "--ckpt", ck, "--resume"])
    assert min(resumed[0]) == 2 and resumed[2]["weights_hash"] == ref[2]["weights_hash"]
    # pwm_eval refuses a NaN parameter too (it printed a NaN loss).
    bad = os.path.join(launch.TMP, "nan_params.ckpt")
    p = subprocess.run([os.path.join(launch.BUILD, "train", "tools", "pwm_eval"), "--checkpoint", bad, "--text",
                        "/usr/share/common-licenses/GPL-3", "--max-windows", "2"], capture_output=True, text=True)
    assert p.returncode != 0 and "parameter layers.0.wq" in p.stderr, (p.returncode, p.stderr)
    print("NaN checkpoints refused by --resume and pwm_eval:", p.stderr.strip())


# ---- Issue 39: MFU against a peak that is a peak ----------------------------------------------


def case_mfu_never_over_one():
    check_mfu_never_over_one(2, ["--dp", "2"], "spmd", "spmd_dp2")


if __name__ == "__main__":
    case_main(globals(), "spmd")
