#!/usr/bin/env python3
"""Liveness between the Pathways controller and its workers, under real mpirun (issue 17).

    liveness_cases.py CASE BUILD_DIR

pathways_train runs with a 3 s --coll-timeout; once it has logged a training step, one rank is
stopped from outside (SIGSTOP): the controller, or a worker that shares no collective with
another worker. The job must end non-zero, on its own, with one line naming the silent rank,
its host and what was awaited (pathways/liveness.h). Before issue 17 each of these hung until
killed from outside.
"""
import os
import re
import signal
import subprocess
import threading
import time

from harness import launch
from harness.launch import MPIRUN, NP_FLAG, case_main, trainer
from harness.workloads import TINY

TIMEOUT_S = 3
# A hang is what these cases catch: the bound only has to be far above 2 x the timeout.
HANG_S = 90
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def rank_pids(marker):
    """World rank -> pid of this job's processes (found by `marker` in their command line)."""
    pids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd or not cmd[0].endswith(b"pathways_train") or marker.encode() not in cmd:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        for v in RANK_VARS:
            if v.encode() in env:
                pids[int(env[v.encode()])] = int(d)
                break
    return pids


def stop_rank_during_training(n, flags, rank):
    """Runs pathways_train on n ranks, SIGSTOPs world rank `rank` after the first logged step and
    returns (exit code, output). Every rank left is killed at the end (SIGCONT first)."""
    marker = os.path.join(launch.TMP, "liveness.jsonl")
    args = TINY[:-2] + ["--coll-timeout", str(TIMEOUT_S), "--steps", "5000", "--log-every", "1",
                        "--metrics", marker] + flags
    cmd = MPIRUN + [NP_FLAG, str(n), trainer("pathways")] + args
    proc = subprocess.Popen(cmd, env=launch.ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    pids = {}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not any(re.search(r"step +\d+/", x) for x in lines[:]):
            time.sleep(0.1)
        assert any(re.search(r"step +\d+/", x) for x in lines[:]), "no training step was logged:\n" + "".join(lines)
        pids = rank_pids(marker)
        assert sorted(pids) == list(range(n)), f"ranks found: {pids}"
        os.kill(pids[rank], signal.SIGSTOP)
        t0 = time.time()
        try:
            proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job hung for {HANG_S} s after world rank {rank} was stopped:\n" +
                                 "".join(lines)[-3000:])
        print(f"the job ended {time.time() - t0:.1f} s after world rank {rank} was stopped (timeout {TIMEOUT_S} s)")
    finally:
        for pid in pids.values():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def check_report(rc, out, pattern, what):
    assert rc != 0, f"{what}: the job exited 0"
    reports = [l for l in out.splitlines() if "pathways liveness:" in l]
    assert reports, f"{what}: no liveness report:\n{out[-3000:]}"
    matching = [l for l in reports if re.search(pattern, l)]
    assert matching, f"{what}: no report matches /{pattern}/:\n" + "\n".join(reports)
    silence = float(re.search(r"for ([0-9.]+) s", matching[0]).group(1))
    assert silence >= TIMEOUT_S, f"{what}: reported after {silence} s of silence, before the timeout"
    for bad in ("terminate called", "backtrace", "Segmentation", "free(): "):
        assert bad not in out, f"{what}: {bad!r} in the output:\n{out[-3000:]}"
    print(f"{what}: {matching[0]}")


def case_controller_stopped():
    # Both workers (dp 2) wait for the stopped controller: each names it and its host.
    rc, out = stop_rank_during_training(3, ["--dp", "2"], 0)
    check_report(rc, out, r"worker device [01] \(world rank [12] on \S+\) has heard nothing from the controller "
                          r"\(world rank 0 on \S+\) for [0-9.]+ s while waiting for", "controller stopped")


def case_pipeline_worker_stopped():
    # --stages 2: the two workers share no collective; stage 1's worker is stopped. The other
    # worker keeps beating (it waits for data in its loop), the controller names the stopped one.
    rc, out = stop_rank_during_training(3, ["--stages", "2", "--microbatches", "2"], 2)
    check_report(rc, out, r"the controller \(world rank 0 on \S+\) has heard nothing from world rank 2 on \S+ "
                          r"\(device 1\) for [0-9.]+ s while waiting for ", "pipeline worker stopped")


def case_single_worker_stopped():
    # One controller and one worker (-n 2 --dp 1).
    rc, out = stop_rank_during_training(2, ["--dp", "1"], 1)
    check_report(rc, out, r"the controller \(world rank 0 on \S+\) has heard nothing from world rank 1 on \S+ "
                          r"\(device 0\) for [0-9.]+ s while waiting for ", "single worker stopped")


if __name__ == "__main__":
    case_main(globals(), "pw_live")
