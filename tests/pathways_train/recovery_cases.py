#!/usr/bin/env python3
"""pathways_train's in-job recovery under real mpirun (--spare-workers, OpenMPI's mpirun
--enable-recovery): a worker lost (killed, or stopped as a hung host) is replaced by a spare and
the run ends on the bits of the run without the loss.

    pathways_cases.py CASE BUILD_DIR

CTest runs these cases through pathways_cases.py, which imports them; `recovery_cases.py CASE
BUILD_DIR` runs one too.
"""
import os
import re
import signal
import subprocess
import sys
import time

from harness import launch
from harness.compare import DETERMINISTIC_FIELDS, assert_bitwise
from harness.errors import expect_error
from harness.launch import MPIRUN, NP_FLAG, SKIP, case_main, run, trainer, watch_a_stop
from harness.outputs import metrics, temp_leftovers
from harness.workloads import TINY, train


def case_spare_worker_recovers_bitwise():
    """--spare-workers: a worker SIGKILLed in the middle of a step is replaced in the job (OpenMPI's
    mpirun --enable-recovery keeps the other ranks alive), and the run ends on the bits of the same
    run without the loss: restored from the other replica's memory, from this run's checkpoint
    with a replay, from the initial state with a replay; for slices of one device and of two (dp
    and tp: the device left in the slice is interrupted inside its collectives). Under MPICH (no library support: the
    launcher ends the job, docs/failures.md) the job ends non-zero, the supervisor's case."""
    openmpi = os.environ.get("PWM_MPI_FLAVOR", "openmpi") == "openmpi"
    fast = ["--coll-timeout", "3", "--steps", "8"]  # (liveness: the loss is seen after 3 s of silence)
    if not openmpi:
        m = os.path.join(launch.TMP, "mpich.jsonl")
        p = run(4, TINY + fast + ["--replicas", "2", "--spare-workers", "1", "--kill-step", "3", "--kill-rank", "2",
                                  "--metrics", m], expect_ok=False, exe="pathways", timeout=120)
        out = p.stdout + p.stderr
        # (Hydra names the killed rank by its signal, or, when another rank's end is reported
        # first, by "EXIT CODE: 9" in its banner: seen once in CI; or a survivor's UCX read from
        # the killed rank's memory fails first, "process_vm_readv(pid=...) returned -1: No such
        # process", and ends it with EXIT CODE 6: seen once in CI, 2026-12-07.)
        killed = "signal 9" in out or "EXIT CODE: 9" in out or "No such process" in out
        assert "[pathways] controller + 3 workers" in out and killed, f"MPICH: no training, or no kill?\n{out}"
        assert p.returncode != 0 and not os.path.exists(m), f"MPICH: the job went on after a lost rank?\n{out}"
        print("MPICH: a lost worker ends the job (no in-job recovery), exit", p.returncode)
        return
    recovery = ["--enable-recovery"]
    cases = [  # (name, ranks without the spare, flags, where the state comes from)
        ("replicas_fused", 3, ["--replicas", "2"], "replica 0's memory", ["--kill-step", "3", "--kill-rank", "2"]),
        ("replicas_chained", 3, ["--replicas", "2", "--granularity", "chained"], "replica 1's memory",
         ["--kill-step", "4", "--kill-rank", "1"]),
        ("chained_ckpt", 2, ["--granularity", "chained", "--ckpt-every", "2"], "the checkpoint of step 4",
         ["--kill-step", "5", "--kill-rank", "1"]),
        ("opbyop_start", 2, ["--granularity", "opbyop"], "the initial state", ["--kill-step", "5", "--kill-rank", "1"]),
        # Slices of two devices: the device left in the slice waits in a collective with the lost
        # one until the controller's cancel interrupts it (WorkerOptions::interruptible).
        ("dp2_fused_start", 3, ["--dp", "2"], "the initial state", ["--kill-step", "3", "--kill-rank", "2"]),
        ("tp2_chained_ckpt", 3, ["--tp", "2", "--granularity", "chained", "--ckpt-every", "2"], "the checkpoint of step 4",
         ["--kill-step", "5", "--kill-rank", "1"]),
        ("dp2_replicas", 5, ["--dp", "2", "--replicas", "2"], "replica 0's memory", ["--kill-step", "3", "--kill-rank", "3"]),
        # (a slice of four: its tp pair left whole still gets a fresh context, the lost device's peers move)
        ("dp2_tp2_chained_start", 5, ["--dp", "2", "--tp", "2", "--granularity", "chained"], "the initial state",
         ["--kill-step", "3", "--kill-rank", "4"]),
    ]
    for name, n, flags, source, kill in cases:
        # (each run writes its own checkpoints from step 0)
        ckpt = lambda run: ["--ckpt", os.path.join(launch.TMP, f"{name}_{run}.ckpt")] if "--ckpt-every" in flags else []  # noqa: E731
        ref = train(n, name + "_ref", flags + fast + ckpt("ref"), exe="pathways")
        m = os.path.join(launch.TMP, name + ".jsonl")
        cmd = MPIRUN + recovery + [NP_FLAG, str(n + 1), trainer("pathways")] + TINY + flags + fast + ckpt("lost") + [
            "--spare-workers", "1", "--metrics", m] + kill
        p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=180)
        # (mpirun --enable-recovery exits 0 whatever the ranks' exit codes: the outputs say.)
        out = p.stdout + p.stderr
        assert "recovered at step" in out and source in out, f"{name}: no recovery from {source}:\n{out[-4000:]}"
        assert "the controller lost device" in out, f"{name}: the loss was not reported:\n{out[-3000:]}"
        # (Killed before its update's reductions over the slice, whose peers wait in one; replicas
        # exchange over islands instead, where the peers wait between kernels.)
        if ("--dp" in flags or "--tp" in flags) and "--replicas" not in flags:
            assert "left kernel" in out and "inside its collectives" in out, \
                f"{name}: no device of the slice was interrupted inside a collective:\n{out[-3000:]}"
        got = metrics(m)
        assert_bitwise(ref, got, f"pathways {name} after losing a worker", "the run without the loss")
        assert got[2]["recoveries"] == 1, f"{name}: recoveries {got[2].get('recoveries')}"
        print(f"{name}: recovered from {source}, bitwise equal to the run without the loss")
    # No spare in the lost device's island (one device per island), with replicas: the run goes on
    # with one replica fewer on the same global batch, from the input state of the oldest step in
    # flight (step F, in the recovery line), held by the replica left. So it must end on the bits
    # of a run of 2 replicas to step F (its checkpoint: a run killed in step F with a checkpoint
    # every step) resumed with 1 replica.
    m = os.path.join(launch.TMP, "nospare.jsonl")
    cmd = MPIRUN + recovery + [NP_FLAG, "4", trainer("pathways")] + TINY + fast + [
        "--replicas", "2", "--islands", "3x1", "--spare-workers", "1", "--kill-step", "3", "--kill-rank", "2",
        "--metrics", m]
    p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    rec = re.search(r"recovered at step (\d+): .*no spare left: going on with 1 replica\(s\), 1 fewer, on the same global "
                    r"batch of 8", out)
    assert rec and "slice 2 has no spare left" in out, f"no recovery with one replica fewer:\n{out[-3000:]}"
    f_step, ck = int(rec.group(1)), os.path.join(launch.TMP, "fewer.ckpt")
    run(3, TINY + fast + ["--replicas", "2", "--ckpt", ck, "--ckpt-every", "1", "--kill-step", str(f_step),
                          "--kill-rank", "0"], expect_ok=False, exe="pathways", timeout=120)
    ref = train(2, "fewer_ref", fast + ["--ckpt", ck, "--resume"], exe="pathways")
    got = metrics(m)
    assert min(ref[0]) == f_step, f"the reference resumed at step {min(ref[0])}, not {f_step}"
    for st in ref[0]:
        for k in DETERMINISTIC_FIELDS:
            assert got[0][st][k] == ref[0][st][k], f"one replica fewer, step {st} {k}: {got[0][st][k]} vs {ref[0][st][k]}"
    assert got[2]["weights_hash"] == ref[2]["weights_hash"], "one replica fewer: the final weights differ"
    assert (got[2]["replicas_dropped"], got[2]["replicas_left"]) == (1, 1), got[2]
    print(f"no spare: went on with 1 replica from step {f_step}, bitwise equal to 2 replicas resumed as 1 there")
    # No spare and no replica left: the job ends with one line.
    m = os.path.join(launch.TMP, "nospare1.jsonl")
    cmd = MPIRUN + recovery + [NP_FLAG, "3", trainer("pathways")] + TINY + fast + [
        "--islands", "2x1", "--spare-workers", "1", "--kill-step", "3", "--kill-rank", "1", "--metrics", m]
    p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=180)
    assert "cannot go on without it" in p.stdout + p.stderr and not os.path.exists(m), (p.stdout + p.stderr)[-3000:]
    # The controller's own loss: the workers' liveness ends the job (one line each, naming rank 0),
    # no metrics are left, and nothing hangs (mpirun --enable-recovery would keep waiting for
    # ranks that waited for ever).
    m = os.path.join(launch.TMP, "controller.jsonl")
    cmd = MPIRUN + recovery + [NP_FLAG, "4", trainer("pathways")] + TINY + fast + [
        "--replicas", "2", "--spare-workers", "1", "--kill-step", "3", "--kill-rank", "0", "--metrics", m]
    p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert "has heard nothing from the controller (world rank 0" in out and not os.path.exists(m), out[-3000:]
    # What --spare-workers does not cover is refused before anything runs, in one line.
    expect_error(4, TINY + ["--dp", "2", "--fsdp", "--spare-workers", "1"],
                 "--spare-workers runs dense models without --fsdp", exe="pathways")
    expect_error(3, TINY + ["--spare-workers", "2"], "--spare-workers 2 leaves no worker", exe="pathways")


def world_rank_pid(rank, marker):
    """The pid of the process of MPI world rank `rank` whose command line contains `marker`."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(d)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return None


def case_spare_worker_recovers_a_pipeline():
    """--spare-workers with --stages 2: a stage's device lost is replaced from a spare, its stage's
    state restored from the same stage of the other replica (or every stage from the checkpoint or
    the initial state), and the run ends on the bits of the run without the loss. Killed by the
    hook in its update, and from outside at a moment the test does not choose (inside a kernel,
    its collectives or its stage's dp reductions, or between two): wherever it lands, the run
    ends on the same bits."""
    if os.environ.get("PWM_MPI_FLAVOR", "openmpi") != "openmpi":
        print("SKIP: in-job recovery needs OpenMPI's --enable-recovery (docs/failures.md)")
        sys.exit(SKIP)  # (ctest's skip code here)
    fast = ["--coll-timeout", "3", "--steps", "8", "--stages", "2", "--microbatches", "2"]
    cases = [  # (name, ranks without the spare, flags, where the state comes from, the kill)
        ("pipe_start", 3, [], "the initial state", ["--kill-step", "3", "--kill-rank", "2"]),
        ("pipe_replicas", 5, ["--replicas", "2"], "replica 1's memory", ["--kill-step", "3", "--kill-rank", "1"]),
        # (from outside: world rank 3, stage 1's first dp device, once the metrics show step 3)
        ("pipe_dp2_outside", 5, ["--dp", "2", "--steps", "40", "--step-sleep-ms", "20"], None, []),
    ]
    for name, n, flags, source, kill in cases:
        ref = train(n, name + "_ref", fast + flags, exe="pathways")
        m = os.path.join(launch.TMP, name + ".jsonl")
        cmd = MPIRUN + ["--enable-recovery", NP_FLAG, str(n + 1), trainer("pathways")] + TINY + fast + flags + [
            "--spare-workers", "1", "--metrics", m] + kill
        log = os.path.join(launch.TMP, name + ".log")
        with open(log, "w") as lf:
            proc = subprocess.Popen(cmd, env=launch.ENV, stdout=lf, stderr=subprocess.STDOUT, text=True)
        try:
            if not kill:
                deadline, victim = time.time() + 60, None
                while victim is None and time.time() < deadline and proc.poll() is None:
                    tmp = [t for t in temp_leftovers(launch.TMP) if os.path.basename(t).startswith(name + ".jsonl")]
                    try:
                        if tmp and sum(1 for _ in open(tmp[0])) >= 4:  # (the header and three steps)
                            victim = world_rank_pid(3, m)
                    except FileNotFoundError:
                        pass
                    time.sleep(0.02)
                assert victim, f"{name}: no rank to kill found while the run trained"
                os.kill(victim, signal.SIGKILL)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:  # (the job's own lines: what it was waiting for)
                proc.kill()
                proc.wait()
                raise AssertionError(f"{name}: the job did not end within 180 s of its start:\n{open(log).read()[-6000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
        out = open(log).read()
        assert "recovered at step" in out and (source is None or source in out), \
            f"{name}: no recovery from {source}:\n{out[-4000:]}"
        got = metrics(m)
        assert_bitwise(ref, got, f"pathways {name} after losing a worker", "the run without the loss")
        assert got[2]["recoveries"] == 1, f"{name}: recoveries {got[2].get('recoveries')}"
        print(f"{name}: {re.search(r'recovered at step [^;]*;[^;]*; state restored from [^;]*', out).group(0)}; "
              "bitwise equal to the run without the loss")


def case_spare_worker_survives_a_stop():
    """--spare-workers with a worker stopped (SIGSTOP: a hung host) instead of killed: the
    controller declares it lost after the liveness timeout and goes on on the spare, bitwise. Stopped
    for good, the job still ends once the run is written (the controller's MPI_Abort ends the rank the
    launcher would wait for). Resumed after the loss, the worker reads its eviction and leaves with
    one line, and the job goes on without it. Under MPICH a stopped worker ends the job (the
    liveness), as stopped_rank_ends_the_job checks for every model."""
    if os.environ.get("PWM_MPI_FLAVOR", "openmpi") != "openmpi":
        print("SKIP: in-job recovery needs OpenMPI's --enable-recovery (docs/failures.md)")
        sys.exit(SKIP)  # (ctest's skip code here)
    timeout = 3
    flags = ["--granularity", "chained", "--coll-timeout", str(timeout), "--steps", "60", "--step-sleep-ms", "20"]
    refs = {1: train(2, "stop_ref", flags, exe="pathways"),
            2: train(3, "stop_ref_dp2", flags + ["--dp", "2"], exe="pathways")}
    stop = ["--kill-step", "5", "--kill-rank", "1", "--kill-signal", "stop"]
    # (dp 2: the device left in the slice waits for the stopped one inside a collective, until the
    # controller's cancel interrupts it)
    for resume, dp in ((False, 1), (True, 1), (False, 2)):
        ref = refs[dp]
        m = os.path.join(launch.TMP, f"stop{int(resume)}_dp{dp}.jsonl")
        cmd = MPIRUN + ["--enable-recovery", NP_FLAG, str(dp + 2), trainer("pathways")] + TINY + flags + [
            "--dp", str(dp), "--spare-workers", "1", "--metrics", m] + stop

        def on_line(line, stopped):  # resume the stopped worker once the controller has gone on without it
            if resume and "the controller lost device" in line:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
        rc, out, stopped_at, ended, seen = watch_a_stop(cmd, on_line)
        assert stopped_at is not None, f"no worker was seen stopped:\n{out[-3000:]}"
        recovered = [t for l, t in seen.items() if "recovered at step" in l]
        assert recovered and "the controller lost device 0 (world rank 1" in out, f"no recovery:\n{out[-4000:]}"
        took = recovered[0] - stopped_at
        assert took <= 2 * timeout + 5, f"recovered {took:.1f} s after the stop (timeout {timeout} s)"
        if resume:  # it left while the job went on (stopped for good, it may say so too: mpirun's abort
            # sends SIGCONT before SIGTERM)
            left = [t for l, t in seen.items() if "was declared lost by the controller" in l]
            done = [t for l, t in seen.items() if "the run is done and written" in l]
            assert left and done and left[0] < done[0], f"the resumed worker did not leave first:\n{out[-3000:]}"
        assert "ending world rank(s) 1 that were lost" in out, f"the job did not end the lost rank:\n{out[-3000:]}"
        got = metrics(m)
        assert_bitwise(ref, got, "pathways after a stopped worker", "the run without the loss")
        print(f"dp={dp} resumed={resume}: recovered {took:.1f} s after the stop, job ended {ended - stopped_at:.1f} s after it "
              f"(exit {rc}), bitwise equal to the run without the loss")


if __name__ == "__main__":
    case_main(globals(), "pw")
