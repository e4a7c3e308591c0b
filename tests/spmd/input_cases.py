#!/usr/bin/env python3
"""Bad input and bad settings, end to end under real mpirun (issue 42: nothing silent).

    input_cases.py CASE BUILD_DIR

Each case gives the trainers what a newcomer might: malformed or out-of-range numbers, a config
file with keys the trainer does not have, outputs that name an input or each other, special
files and inputs larger than memory, the collectives' timeout as an environment setting, and
ranks started with different PWM_* settings. Every case expects one error line in the project's
words (none of CLI11's, nlohmann's or the C++ library's texts), a non-zero exit, nothing written,
and no hang (each launch is bounded); or, for the settings, the documented value taking effect.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time

from harness import launch
from harness.errors import one_error_line
from harness.launch import MPIRUN, NP_FLAG, case_main, run, trainer
from harness.workloads import TINY

# Texts of the libraries underneath that a user must never see for bad input.
LIBRARY_TEXTS = ("Could not convert", "was not expected", "were not expected", " not in {", "json.exception",
                 "std::", "stoi", "stoll", "basic_string", "required TEXT", "required INT", "required FLOAT",
                 "internal error")

PW = "pathways_train: error:"


def error_line(p, pattern, prefix="spmd_train: error:"):
    line = one_error_line(p, pattern, prefix)
    for t in LIBRARY_TEXTS:
        assert t not in p.stderr, f"a library's text ({t!r}) reached the user:\n{p.stderr[-2000:]}"
    return line


def refused(args, pattern, n=2, exe="spmd", env=None, timeout=60):
    """Runs a job expected to refuse `args` before training; returns its error line."""
    cmd = MPIRUN + [NP_FLAG, str(n), trainer(exe)] + args
    try:
        p = subprocess.run(cmd, env=dict(launch.ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung (> {timeout} s): {' '.join(cmd)}")
    assert "| loss" not in p.stdout, f"trained before refusing {args}:\n{p.stdout[-1500:]}"
    prefix = {"spmd": "spmd_train", "static": "mpmd_train"}.get(exe, "pathways_train") + ": error:"
    return error_line(p, pattern, prefix=prefix)


def base(n=2, timeout_flag=True):
    """The tiny workload at --dp n; without its --coll-timeout 60 when `timeout_flag` is False."""
    args = list(TINY)
    if not timeout_flag:
        i = args.index("--coll-timeout")
        del args[i:i + 2]
    return args + ["--dp", str(n)]


def case_junk_numbers_are_refused():
    # Each was accepted before: 99999999999999999999 saturated to INT64_MAX, -1 wrapped to 2^64-1,
    # 010 read as octal, inf/nan trained (or failed inside the optimizer under its own name).
    cases = [
        (["--steps", "5x"], "--steps: '5x' is not a whole number"),
        (["--steps", "99999999999999999999"], "--steps: '99999999999999999999' is too large"),
        (["--steps", "3.5"], "--steps: '3.5' is not a whole number"),
        (["--steps", "010"], "--steps: '010' has a leading zero"),
        (["--seed", "-1"], "--seed: '-1' is negative"),
        (["--lr", "1e-3junk"], "--lr: '1e-3junk' is not a number"),
        (["--lr", "inf"], "--lr: 'inf' is not a finite number"),
        (["--lr", "nan"], "--lr: 'nan' is not a finite number"),
        (["--lr", "1e400"], "--lr: '1e400'"),
        (["--lr"], "--lr needs a value"),
        (["--lr", "-1"], "--lr must be a finite number >= 0 (got -1)"),
        (["--beta1", "1"], "--beta1 must be in [0, 1) (got 1)"),
        (["--eps", "0"], "--eps must be a finite number > 0"),
        (["--min-lr-frac", "2"], "--min-lr-frac must be in [0, 1]"),
        (["--coll-timeout", "inf"], "--coll-timeout: 'inf' is not a finite number"),
        (["--rope-base", "1"], "--rope-base must be a finite number > 1"),
        (["--layers", "0"], "--layers must be at least 1 (got 0)"),
        (["--precision", "fp16"], "--precision 'fp16': expected one of fp32, bf16"),
        (["--fsdp=maybe"], "--fsdp 'maybe'"),
        (["--no-such-flag"], "--no-such-flag is not a flag of spmd_train"),
        (["--islands", "2x2"], "--islands is pathways_train's, not a flag of spmd_train"),
    ]
    for extra, pattern in cases:
        refused(base() + extra, pattern)
    # pathways_train's own parser of --islands KxM took "1x2junk" as 1x2.
    refused(base() + ["--islands", "1x2junk"], "--islands 1x2junk", n=3, exe="pathways")
    refused(base() + ["--granularity", "fast"], "--granularity 'fast': expected one of fused, chained, opbyop", n=3,
            exe="pathways")


def write(name, text):
    path = os.path.join(launch.TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def case_config_files_are_checked():
    refused(base() + ["--config", write("unknown.json", '{"bogus": 1}')], "key 'bogus' is not a flag of spmd_train")
    refused(base() + ["--config", write("self.json", '{"config": "x.json"}')], "key 'config' cannot be set")
    refused(base() + ["--config", write("help.json", '{"help": true}')], "key 'help' cannot be set")
    refused(base() + ["--config", write("cut.json", '{"lr": ')], "cut.json is not valid JSON")
    refused(base() + ["--config", write("junk.json", '{"steps": "5x"}')], "--steps: '5x' is not a whole number")
    refused(base() + ["--config", write("inf.json", '{"lr": "inf"}')], "--lr: 'inf' is not a finite number")
    # A key of the MPMD trainers: refused by spmd_train by name, taken by pathways_train (which
    # refused its own keys in a config file before).
    mpmd = write("mpmd.json", '{"granularity": "chained", "steps": 2}')
    refused(base() + ["--config", mpmd], "key 'granularity' is pathways_train's and mpmd_train's, not a flag of spmd_train")
    p = run(3, base() + ["--config", mpmd], exe="pathways")
    assert "[pathways-chained]" in p.stdout, p.stdout[-1500:]
    print("ok: pathways_train took --granularity chained from its config file")


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def case_outputs_never_alias_inputs():
    corpus = os.path.join(launch.TMP, "corpus.txt")
    shutil.copy("/usr/share/common-licenses/GPL-3", corpus)
    before = md5(corpus)
    link = os.path.join(launch.TMP, "link.txt")
    os.symlink(corpus, link)
    data_dir = os.path.join(launch.TMP, "data")
    os.makedirs(data_dir)
    shutil.copy(corpus, os.path.join(data_dir, "a.txt"))
    cfg = write("run.json", '{"steps": 2}')
    m, t = os.path.join(launch.TMP, "m.jsonl"), os.path.join(launch.TMP, "t.json")
    d = ["--data", corpus]
    # The training data overwritten with metrics was the reported case (exit 0, corpus lost).
    refused(base() + d + ["--metrics", corpus], f"--metrics {corpus} is the training data")
    refused(base() + d + ["--ckpt", link], f"--ckpt {link} is the training data")
    refused(base() + d + ["--metrics", m, "--trace", m], "are the same file")
    refused(base() + d + ["--metrics", m, "--ckpt", os.path.join(launch.TMP, ".", "m.jsonl")], "are the same file")
    refused(base() + ["--data", data_dir, "--metrics", os.path.join(data_dir, "m.jsonl")],
            "lies inside the training data directory")
    refused(base() + d + ["--config", cfg, "--trace", cfg], f"--trace {cfg} is the config file")
    # pathways_train's own output (PWM_PW_TRACE) takes part too.
    refused(base() + d + ["--metrics", m], "PWM_PW_TRACE", n=3, exe="pathways", env={"PWM_PW_TRACE": m})
    assert md5(corpus) == before, "the corpus changed"
    assert not os.path.exists(m) and not os.path.exists(t), "an output was written by a refused run"
    assert sorted(os.listdir(data_dir)) == ["a.txt"], os.listdir(data_dir)


def sparse(name, size):
    """A file of `size` bytes that takes no disk space (nothing reads it if the checks work)."""
    path = os.path.join(launch.TMP, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def case_special_and_huge_inputs_are_refused():
    fifo = os.path.join(launch.TMP, "fifo")
    os.mkfifo(fifo)
    # Each hung before: a rank blocked opening the FIFO while rank 0 had refused it.
    refused(base() + ["--config", fifo], "is a FIFO (named pipe), not a regular file")
    refused(base() + ["--ckpt", fifo, "--resume"], "is a FIFO")
    refused(base() + ["--data", fifo], "is a FIFO", n=3, exe="pathways")
    refused(base() + ["--data", "/dev/zero"], "is a character device")
    # Larger than memory or than a config can be: refused from the size, before reading.
    tib = 1 << 40
    refused(base() + ["--data", sparse("huge.txt", tib)], "GiB of training data held by the ranks")
    refused(base() + ["--ckpt", sparse("huge.ckpt", tib), "--resume"], "more than this run can read")
    refused(base() + ["--config", sparse("huge.json", 2 << 20)], "more than this run can read")


def rank_pids(marker):
    """The pids of the trainer processes whose command line holds `marker` (not the launcher)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if comm in ("spmd_train", "pathways_train") and marker in cmd:
            out.append(int(pid))
    return sorted(out)


def stopped_rank_run(extra, env):
    """2 ranks; stops the last once training runs; returns (stderr, seconds from the stop to the
    watchdog's line)."""
    marker = os.path.join(launch.TMP, f"stop{time.monotonic_ns()}.jsonl")
    cmd = MPIRUN + [NP_FLAG, "2", trainer()] + base(timeout_flag=False) + [
        "--steps", "100000", "--step-sleep-ms", "20", "--log-every", "1", "--metrics", marker] + extra
    p = subprocess.Popen(cmd, env=dict(launch.ENV, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    stopped = []
    try:
        for line in p.stdout:
            if "| loss" in line:
                break
        pids = rank_pids(marker)
        assert len(pids) == 2, f"expected 2 ranks, found {pids}"
        os.kill(pids[-1], signal.SIGSTOP)
        stopped.append(pids[-1])
        t0 = time.monotonic()
        for line in p.stdout:
            pass
        p.wait(timeout=120)
        text = "".join(err)
        return text, time.monotonic() - t0
    finally:
        for pid in stopped:
            for s in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, s)
                except ProcessLookupError:
                    pass
        if p.poll() is None:
            p.kill()


def case_island_shapes_checked_at_start_up():
    # Issue 59: --islands KxM in 64 bits (65536 x 65536 read as 0 devices) and a slice that no
    # island can hold, both refused at start-up in one line naming --islands (the second was an
    # error of the resource manager's after the run had started, without the flag's name).
    args = list(TINY) + ["--replicas", "2", "--islands", "65536x65536"]
    line = refused(args, "65536 x 65536 = 4294967296 devices, but the job has 2 workers", n=3, exe="pathways")
    print("ok:", line)
    args = list(TINY) + ["--replicas", "2", "--dp", "2", "--islands", "4x1"]
    line = refused(args, "--islands 4x1: a slice of --dp 2 x --tp 1 = 2 devices does not fit an island of 1 device",
                   n=5, exe="pathways")
    print("ok:", line)


def case_unused_flags_are_refused():
    # Issue 59: a flag the configuration never reads was accepted and ignored (--top-k on a dense
    # model, --schedule without a pipeline, --granularity in a pipeline, --straggler-rank without
    # a delay); now one line naming it, on a command line and in a --config file
    # (train/flag_use.cc; every row on every trainer: tests/model/test_flag_use.cc).
    refused(base() + ["--top-k", "1"], "--top-k applies to Mixture-of-Experts models: add --experts E")
    refused(base() + ["--straggler-rank", "1"], "--straggler-rank applies to a straggler test")
    refused(list(TINY) + ["--bucket-bytes", "4096"], "--bucket-bytes applies to gradients summed", n=1)
    refused(base() + ["--schedule", "1f1b"], "--schedule applies to pipelines: add --stages 2", exe="static")
    refused(list(TINY) + ["--stages", "2", "--islands", "2x1", "--granularity", "opbyop"],
            "--granularity applies to one slice's step, not a pipeline's stages", n=3, exe="pathways")
    cfg = write("unused.json", '{"router-skew": 2}')
    refused(base() + ["--config", cfg], "--router-skew applies to Mixture-of-Experts models")
    # And mpmd_train --spare-workers -1 (which trained): pathways_train's flag, not mpmd_train's.
    refused(base() + ["--spare-workers", "-1"], "--spare-workers is pathways_train's, not a flag of mpmd_train",
            exe="static")


def case_coll_timeout_setting_and_flag():
    # The documented order: --coll-timeout where given, else PWM_COLL_TIMEOUT, else 300 s. Before,
    # the flag's default (300) overwrote PWM_COLL_TIMEOUT in both trainers.
    text, waited = stopped_rank_run([], {"PWM_COLL_TIMEOUT": "3"})
    assert "timed out after 3.0 s" in text, text[-2000:]
    print(f"ok: PWM_COLL_TIMEOUT=3: the watchdog fired, the job ended {waited:.1f} s after the stop")
    text, waited = stopped_rank_run(["--coll-timeout", "2"], {"PWM_COLL_TIMEOUT": "100"})
    assert "timed out after 2.0 s" in text, text[-2000:]
    print(f"ok: --coll-timeout 2 over PWM_COLL_TIMEOUT=100: the job ended {waited:.1f} s after the stop")


def case_ranks_agree_on_settings():
    # A PWM_* setting on one rank only: named before any collective. Before, PWM_COLL_DEBUG on one
    # rank showed up as "the ranks called different collectives", PWM_COLL_TIMEOUT not at all.
    a = base() + ["--steps", "2"]
    for name, value in (("PWM_COLL_TIMEOUT", "5"), ("PWM_COLL_DEBUG", "1")):
        cmd = MPIRUN + [NP_FLAG, "1", trainer()] + a + [":", NP_FLAG, "1", "env", f"{name}={value}",
                                                                  trainer()] + a
        p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=60)
        error_line(p, f"rank 1 runs with other PWM_* settings than rank 0 ({name}={value} vs (unset))")


if __name__ == "__main__":
    case_main(globals(), "inputs")
