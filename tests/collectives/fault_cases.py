#!/usr/bin/env python3
"""Faults around the collectives, end to end under real mpirun (issue 17, part A).

    fault_cases.py CASE BUILD_DIR

Mismatched collectives between ranks, and bad PWM_* environment settings: each must end the job
non-zero with one clear line, never with a memory corruption, a backtrace or a hang.
"""
import os
import subprocess

from harness import launch
from harness.launch import MPIRUN, NP_FLAG, case_main, trainer
from harness.workloads import TINY

# What a memory corruption, an escaped exception or an MPI error handler leaves in the output.
CORRUPTION = ("free(): ", "corrupted", "double free", "Segmentation fault", "signal 11", "SIGSEGV", "Aborted",
              "backtrace", "Read -1", "terminate called", "NULL communicator", "core dumped")


def case_mismatched_buckets_fail_cleanly():
    # MPMD: the two ranks run spmd_train with other --bucket-bytes, so their gradient AllReduces
    # differ in size. Without PWM_COLL_DEBUG every run must end non-zero with a line naming the
    # collective, the sizes and the peer (or, where every rank checks the whole configuration
    # before training, a line naming the differing flag) and no trace of a memory corruption.
    # Repeated: before issue 17 six runs in seven crashed, one of them with no error line.
    def app(bucket):
        return [NP_FLAG, "1", trainer()] + TINY + ["--dp", "2", "--bucket-bytes", str(bucket)]
    for i in range(4):
        cmd = MPIRUN + app(100000) + [":"] + app(50000)
        p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        assert p.returncode != 0, f"run {i}: mismatched bucket sizes exited 0:\n{out}"
        lines = [l for l in out.splitlines()
                 if "collective mismatch: world rank" in l or ("error:" in l and "bucket" in l)]
        assert lines, f"run {i}: no line names the mismatch:\n{out[-3000:]}"
        for l in lines:
            if "collective mismatch" in l:
                assert "allreduce(" in l and "bytes" in l and "from world rank" in l, l
        for bad in CORRUPTION:
            assert bad not in out, f"run {i}: {bad!r} in the output:\n{out[-3000:]}"
    print("ok:", lines[0])


BAD_ENV = (("PWM_COLL_TIMEOUT", "abc"), ("PWM_COLL_TIMEOUT", "0"), ("PWM_COLL_TIMEOUT", "-1"),
           ("PWM_COLL_DEBUG", "yes"), ("PWM_COLL_SEGMENT_BYTES", "0"), ("PWM_COLL_SEGMENT_BYTES", "abc"))


def expect_env_error(exe, n, flags, name, value):
    cmd = MPIRUN + [NP_FLAG, str(n), trainer(exe)] + TINY + flags
    p = subprocess.run(cmd, env=dict(launch.ENV, **{name: value}), capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    what = f"{name}={value} {os.path.basename(trainer(exe))}"
    assert p.returncode != 0, f"{what}: exited 0"
    prog = os.path.basename(trainer(exe))
    lines = [l for l in out.splitlines() if "error:" in l]
    assert len(lines) == 1, f"{what}: expected one error line, got {len(lines)}:\n{out[-3000:]}"
    assert lines[0].startswith(f"{prog}: error: {name}={value}: expected "), f"{what}: {lines[0]}"
    assert "unset it" in lines[0], lines[0]
    for bad in CORRUPTION:
        assert bad not in out, f"{what}: {bad!r} in the output:\n{out[-3000:]}"
    print("ok:", lines[0])


def case_bad_environment_fails_cleanly():
    # Each bad value ends every rank non-zero with one line naming the variable, the value and
    # what it accepts (before issue 17: std::terminate on every rank, interleaved backtraces,
    # rc 134), in both trainers.
    for name, value in BAD_ENV:
        expect_env_error("spmd", 2, ["--dp", "2"], name, value)
    expect_env_error("pathways", 3, ["--dp", "2"], "PWM_COLL_TIMEOUT", "abc")
    expect_env_error("pathways", 3, ["--dp", "2"], "PWM_PW_SCHEDULER", "lifo")


if __name__ == "__main__":
    case_main(globals(), "coll")
