#!/usr/bin/env python3
"""Bad input to the benchmarks and the simulator (issue 42: nothing silent).

    tool_input_cases.py CASE BUILD_DIR

Each case runs one program (pwm_sim, model_bench, collectives_bench, dispatch_bench) with what a
newcomer might give it: zero, negative, huge or junk numbers, a FIFO, a directory or a missing
directory as an input or output, a file that is not JSON or lacks a key. Every run must end
within seconds with exactly one error line in the project's words (none of CLI11's, nlohmann's
or the C++ library's texts), a non-zero exit, nothing measured first and no file left behind.
"""
import os
import subprocess

from harness import launch
from harness.launch import MPIRUN, NP_FLAG, case_main

# Texts of the libraries underneath that a user must never see for bad input.
LIBRARY_TEXTS = ("json.exception", "Could not convert", "std::", "what()", "not in range", "basic_string",
                 "basic_filebuf", "internal error", "takes no value", "Segmentation", "core dumped")

# A profile with every required key (values need not be realistic).
PROFILE = """{"machine": "test", "kernels": {"fwd_us_per_gflop": 1000, "bwd_us_per_gflop": 2000,
 "opt_us_per_param": 0.001, "step_overhead_us": 10},
 "links": {"reduce_ns_per_byte": 0.2, "intra": {"latency_us": 1, "gbytes_per_s": 5},
           "inter": {"latency_us": 50, "gbytes_per_s": 1}},
 "dispatch": {"call_us": 10, "node_us": 5, "msg_us": 2, "exec_us": 3, "spmd_exec_us": 1, "fetch_rtt_us": 40}}
"""

# model_bench's model, small enough to run in a blink if a check were missing.
TINY_MODEL = {"--d-model": "32", "--layers": "1", "--heads": "2", "--head-dim": "16", "--d-ff": "64",
              "--vocab": "64", "--seq": "16", "--batch": "2", "--steps": "1", "--warmup": "0", "--peak-reps": "0"}


def path(*p):
    return os.path.join(launch.TMP, *p)


def write(name, text):
    with open(path(name), "w") as f:
        f.write(text)
    return path(name)


def refused(cmd, pattern, prefix, timeout=30, forbidden_stdout=None):
    """Runs `cmd`, expects one error line with `pattern`; returns it."""
    before = sorted(os.listdir(launch.TMP))
    try:
        p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=timeout, cwd=launch.TMP)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung (> {timeout} s): {' '.join(cmd)}")
    shown = f"{' '.join(cmd)}\nstdout:\n{p.stdout[-1500:]}\nstderr:\n{p.stderr[-2000:]}"
    assert p.returncode != 0, f"exit 0 for bad input: {shown}"
    lines = [l for l in p.stderr.splitlines() if prefix in l]
    assert len(lines) == 1, f"expected one '{prefix}' line, got {len(lines)}: {shown}"
    assert pattern in lines[0], f"the error line does not mention {pattern!r}: {lines[0]}"
    for t in LIBRARY_TEXTS:
        assert t not in p.stderr, f"a library's text ({t!r}) reached the user: {shown}"
    if forbidden_stdout:
        assert forbidden_stdout not in p.stdout, f"ran before refusing: {shown}"
    after = sorted(os.listdir(launch.TMP))
    assert after == before, f"files left behind: {sorted(set(after) - set(before))}: {shown}"
    print("ok:", lines[0])
    return lines[0]


def exe(*p):
    return os.path.join(launch.BUILD, *p)


# Special paths every case can use: a FIFO, a directory, a file in a missing directory.
def specials():
    fifo = path("fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    return fifo, launch.TMP, path("missing", "out.json")


def case_sim_bad_inputs():
    sim = exe("sim", "pwm_sim")
    prof = write("prof.json", PROFILE)
    static_prof = write("static_prof.json", PROFILE.rstrip()[:-1] + ', "static": {"node_us": 3, "step_us": 40, "exec_us": 0.5, "run_us": 20}}')
    fifo, directory, missing = specials()
    write("bad.json", '{"kernels": ')
    write("nokey.json", '{"kernels": {}}')
    write("type.json", '{"kernels": {"fwd_us_per_gflop": "fast"}}')
    write("array.json", "[1, 2]")
    write("noline.jsonl", "garbage\n")
    P = "pwm_sim: error:"
    for args, pattern in [
        (["--profile", fifo], "--profile " + fifo + " is a FIFO"),
        (["--profile", directory], "is a directory"),
        (["--profile", path("nope.json")], "No such file"),
        (["--profile", path("bad.json")], "is not valid JSON (line 1, column 13)"),
        (["--profile", path("nokey.json")], "missing key kernels.fwd_us_per_gflop"),
        (["--profile", path("type.json")], 'kernels.fwd_us_per_gflop must be a number (got "fast")'),
        (["--profile", path("array.json")], "the top level must be a JSON object"),
        (["--profile", prof, "--cluster", path("nokey.json")], "--cluster " + path("nokey.json") + ": missing key hosts"),
        (["--profile", prof, "--cluster", fifo], "is a FIFO"),
        (["--profile", prof, "--workers", "0"], "--workers must be in [1, 8192] (got 0)"),
        (["--profile", prof, "--workers", "1000000000"], "--workers must be in [1, 8192]"),
        (["--profile", prof, "--chain", "0"], "--chain must be in"),
        (["--profile", prof, "--compute-us", "-5"], "--compute-us -5"),
        (["--profile", prof, "--compute-us", "1,,2"], "'' is not a number"),
        (["--profile", prof, "--what", "clients", "--clients", "0"], "--clients 0"),
        (["--profile", prof, "--what", "pipeline"], "--stages must be in [1, 4096] (got 0)"),
        (["--profile", prof, "--what", "fig6", "--hosts-list", "2,1000000"], "--hosts-list 2,1000000"),
        (["--profile", prof, "--what", "step", "--dp", "0"], "--dp"),  # divided by zero (SIGFPE) before
        (["--profile", prof, "--what", "step", "--dp", "100000"], "more than the 8192 devices"),
        (["--profile", prof, "--what", "step", "--dp", "3"], "--batch 16 is not divisible"),
        (["--what", "dispatch"], "--profile is required"),
        (["--what", "kernels"], "--sim-trace is required"),
        (["--what", "kernels", "--sim-trace", fifo], "--sim-trace " + fifo + " is a FIFO"),
        (["--what", "kernels", "--sim-trace", path("bad.json")], "is not valid JSON"),
        # Mixture of Experts: what the MoE step model does not cover is one line.
        (["--profile", prof, "--what", "moe"], "--what moe needs a Mixture-of-Experts model: add --experts E"),
        (["--profile", prof, "--what", "pipeline", "--stages", "1", "--experts", "4"],
         "with --what step or moe only (got --what pipeline)"),
        (["--profile", prof, "--what", "step", "--experts", "4", "--granularity", "opbyop"], "under --granularity opbyop"),
        (["--profile", prof, "--what", "step", "--experts", "4", "--replicas", "2", "--dp", "1"], "leave out --replicas"),
        (["--profile", prof, "--what", "moe", "--experts", "4", "--moe-imbalance", "0.5"], "--moe-imbalance must be in [1,"),
        (["--profile", prof, "--what", "moe", "--dp", "2", "--experts", "4", "--expert-parallel", "2",
          "--moe-imbalance", "3"], "--moe-imbalance 3 must be in [1, 2]"),
        (["--profile", prof, "--what", "step", "--experts", "4", "--moe-routing", "often"], "--moe-routing"),
        (["--profile", prof, "--what", "step", "--moe-routing", "worker"], "applies to Mixture-of-Experts models"),
        (["--profile", prof, "--what", "step", "--experts", "4", "--granularity", "chained", "--moe-routing",
          "controller"], "set --capacity-factor 0"),
        # The static model (--mpmd static): a profile calibrated before it, and what it does not run.
        (["--profile", prof, "--what", "step", "--mpmd", "oneflow"], "unknown --mpmd 'oneflow' (pathways, static)"),
        (["--profile", prof, "--what", "step", "--dp", "2", "--granularity", "chained", "--mpmd", "static"],
         "the profile has no static section"),
        (["--profile", prof, "--what", "dispatch", "--mpmd", "static"], "--mpmd static is simulated with --what step or pipeline"),
        (["--profile", static_prof, "--what", "step", "--dp", "2", "--granularity", "opbyop", "--mpmd", "static"],
         "no --granularity opbyop"),
        (["--profile", static_prof, "--what", "step", "--mpmd", "static"], "runs --granularity fused or chained"),
    ]:
        refused([sim, "--what", "dispatch"] + args if "--what" not in args else [sim] + args, pattern, P,
                timeout=20, forbidden_stdout='"what"')
    # Still runs with good input.
    p = subprocess.run([sim, "--what", "dispatch", "--profile", prof, "--compute-us", "0,100"], env=launch.ENV,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.count('"what":"dispatch"') == 2, p.stderr
    p = subprocess.run([sim, "--what", "moe", "--profile", prof, "--dp", "2", "--experts", "4", "--expert-parallel", "2",
                        "--top-k", "2", "--moe-every", "2", "--layers", "2"], env=launch.ENV, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.count('"what":"moe"') == 5 and p.stdout.count('"what":"moe_layer"') == 1, p.stderr
    p = subprocess.run([sim, "--what", "pipeline", "--profile", static_prof, "--mpmd", "static", "--stages", "2",
                        "--schedule", "1f1b", "--microbatches", "4", "--layers", "2"], env=launch.ENV, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.count('"mpmd":"static"') == 1, p.stderr
    p = subprocess.run([sim, "--what", "dispatch", "--profile", static_prof, "--compute-us", "0"], env=launch.ENV,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.count('"static":') == 1, p.stderr


def case_model_bench_bad_inputs():
    mb = exe("bench", "model", "model_bench")
    fifo, directory, missing = specials()
    P = "model_bench: error:"

    def run(overrides, pattern):
        flags = dict(TINY_MODEL, **overrides)
        args = [a for kv in flags.items() for a in kv]
        refused([mb] + args, pattern, P, timeout=30, forbidden_stdout="tokens/s=")

    # Each of these ran the whole benchmark before refusing (--json) or ran with a nonsense value.
    run({"--json": missing}, "--json " + missing + ": the directory")
    run({"--json": directory}, "is a directory")
    run({"--json": fifo}, "is not a regular file")
    run({"--steps": "0"}, "--steps must be at least 1 (got 0)")
    run({"--batch": "0"}, "--batch must be at least 1 (got 0)")
    run({"--peak-reps": "-1"}, "--peak-reps must be >= 0 (got -1)")
    run({"--warmup": "-1"}, "--warmup must be >= 0 (got -1)")
    run({"--head-dim": "3"}, "--head-dim must be even")
    run({"--seq": "1000000000"}, "GiB of memory")
    run({"--steps": "5x"}, "--steps: '5x' is not a whole number")


def mpi(n, program, args):
    return MPIRUN + [NP_FLAG, str(n), program] + args


def case_collectives_bench_bad_inputs():
    cb = exe("bench", "collectives", "collectives_bench")
    fifo, directory, missing = specials()
    P = "collectives_bench: error:"
    small = ["-b", "4", "-e", "1K", "-n", "1", "-w", "0"]
    for args, pattern in [
        (small + ["--json", missing], "--json " + missing + ": the directory"),
        (small + ["--json", fifo], "is not a regular file"),
        (["-n", "0"], "-n/--iters must be at least 1 (got 0)"),
        (["--rounds", "0"], "--rounds must be in [1, 1000] (got 0)"),
        (["-f", "1"], "-f/--stepfactor must be in [1.01, 1e6] (got 1)"),
        (["-b", "0x10"], "-b/--minbytes 0x10"),
        (["-e", "999G"], "use a smaller -e"),
        (["--algo", ""], "--algo '' names no algorithm"),
        (["--coll-timeout", "0"], "--coll-timeout must be > 0"),
    ]:
        refused(mpi(2, cb, args), pattern, P, timeout=60, forbidden_stdout="# collectives_bench:")


def case_dispatch_bench_bad_inputs():
    db = exe("bench", "pathways", "dispatch_bench")
    fifo, directory, missing = specials()
    P = "dispatch_bench: error:"
    for args, pattern in [
        (["--fig8-reps", "0"], "--fig8-reps must be in [1, 10000] (got 0)"),  # undefined behaviour before
        (["--reps", "0"], "--reps must be in"),
        (["--fig8-seconds", "0"], "--fig8-seconds must be > 0"),
        (["--clients", "0"], "--clients 0"),
        (["--figs", "9"], "--figs 9"),
        (["--islands", "2x2"], "--islands 2x2: 2 x 2 = 4 devices but there are 1 workers"),
        (["--json", missing], "--json " + missing + ": the directory"),
        (["--json", fifo], "is not a regular file"),
    ]:
        refused(mpi(2, db, args), pattern, P, timeout=60, forbidden_stdout="# dispatch_bench:")


if __name__ == "__main__":
    case_main(globals(), "tool_inputs")
