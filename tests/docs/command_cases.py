#!/usr/bin/env python3
"""The docs' commands run in tests (issue 59): every command that README.md and docs/*.md show
launching a program of the project is extracted and run, short and on a tiny model, so that a
documented command that fails fails a test (docs/cluster.md's `pathways_train --dp 3 --islands
1x3` stopped at start-up with "--batch 16 is not divisible by ... 3" and no test ran it).

    command_cases.py CASE BUILD_DIR

Where: README.md and docs/*.md. Not docs/results/*.md: those pages are dated measurements, each
showing the command it was measured with at that commit; they are records, not instructions.

What is a command: every line of a fenced block (``` with no language, bash, sh, shell or console;
a leading `$ ` prompt is dropped, `\\` continuations joined, `# comments` cut, `&&` splits) and
every inline `code` span of two words or more whose first word (after VAR=value settings and
`nice [-n N]`) is a launcher (mpirun, mpiexec, srun, sbatch, salloc), a path of the project
(build*/PROGRAM, mpi_scripts/..., sim/...), a program of the project (spmd_train, pathways_train,
mpmd_train, collectives_bench, model_bench, dispatch_bench, pwm_sim), or python3/bash/ninja/ctest
running one. Lines that start otherwise (diagrams, printed output, code) are not commands.

What each command gets (classify(), first match; a command no rule takes fails `inventory`, so a
new doc command cannot slip by):
  run       mpirun/mpiexec/srun -n N PROGRAM and the project's binaries run as written, with
            - the launcher normalized to this build's (mpirun's or Hydra's flags, --oversubscribe),
              one host: --hostfile/-f/--host dropped, srun's --nodes x --ntasks-per-node (or
              --ntasks) becoming -n; OpenMPI's --enable-recovery dropped under MPICH;
            - a trainer's sizes shrunk by flags appended after the documented ones (the trainers
              take a flag's last value, train/flags.cc): SHRINK (TINY's d_model, head_dim, d_ff
              and sequence, 2 steps, 1 validation batch; --coll-timeout 60 unless documented).
              Every other documented flag is kept, and --batch, --layers and --heads keep their
              documented (or default) values: a dp, tp, number of stages or micro-batches that does
              not fit the documented numbers fails at the trainer's start-up as it would for the
              reader (docs/cluster.md's `--dp 3` on the default --batch 16);
            - build/PATH as written, in the build under test (a path that moved fails);
            - relative output paths (--metrics, --trace, --ckpt) landing in a temporary directory;
            - collectives_bench at sizes up to 64 KiB, 2 iterations (values replaced: it takes a
              flag once); pwm_sim on a synthetic profile in place of results/sim/profile.json
              (which sim_calibrate.sh measures);
            - a trailing `...` ("and your other flags") dropped.
  short     compare.sh on one host, also as `sbatch`/`salloc` of compare.sbatch call it (--np
            TASKS - 1, the script's arguments): the documented flags (--hostfile dropped: one
            island spans the hosts either way), then --rounds 1 --steps 2 (5 with --moe, its
            minimum) --out TMP and SHRINK's sizes after `--`.
  flags     not run, each --flag checked against what the program takes: measurement scripts that
            write the clone's results/ and run for minutes (MEASUREMENTS), compare.sh on emulated
            hosts (--palm, --hosts: network namespaces, the `cluster` label), usage synopses
            (placeholders: [--flag X], UPPER-CASE words, a|b) and prose mentions of a bare program
            with flags (`pathways_train --fsdp --dp D`). A flag must be in the program's --help
            (binaries, Python tools); a script with a flag loop must exit 0 on `SCRIPT ARGS --help`
            (every documented flag before it parsed, numbers checked where the loop checks them);
            a script without one must parse (`bash -n`) and name each flag in a case pattern.
  excused   listed with the reason: mpi_scripts/test.sh and ctest (the suite itself), sanitize.sh
            and build-fuzz/ (the sanitizer builds, minutes each: docs/sanitizers.md), cluster.sh
            (network namespaces; the `cluster` label runs it; the command inside `cluster.sh run --
            bash -c '...'` is extracted and run), sim/project*.py runs (projections at the paper's
            scale from a measured profile, minutes), ninja (its targets checked: ninja -n), Slurm
            allocations and launcher fragments naming an option but no program (`mpirun -n 3`),
            directories (`build/`).
Identical commands (after normalizing) run once; the others say which they are the same as.

Cases: inventory (classify every command, list every skip with its reason, check flags),
trainers (the `run` commands), scripts (the `short` ones). A failure names the doc file and
line, the command as documented and as run, and the output's last lines.
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import time

from harness import launch
from harness.launch import MPIRUN, NP_FLAG, case_main
from harness.workloads import TINY

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def tiny(flag):
    return TINY[TINY.index(flag) + 1]


# A trainer's sizes, appended after the documented flags (the last value wins).
# Not --layers, --heads nor --batch: they meet the configuration's own numbers (--stages, --tp,
# --dp), so the documented values (or the defaults) are kept.
SHRINK = ["--d-model", tiny("--d-model"), "--head-dim", tiny("--head-dim"), "--d-ff", tiny("--d-ff"),
          "--seq-len", tiny("--seq-len"), "--steps", "2", "--eval-batches", "1"]
TRAINERS = {"spmd_train": "spmd/spmd_train", "pathways_train": "mpmd/pathways_train", "mpmd_train": "mpmd/mpmd_train"}
BINARIES = dict(TRAINERS, collectives_bench="bench/collectives/collectives_bench",
                model_bench="bench/model/model_bench", dispatch_bench="bench/pathways/dispatch_bench",
                pwm_sim="sim/pwm_sim")
LAUNCHERS = {"mpirun", "mpiexec", "srun", "sbatch", "salloc"}
# Measurement scripts: not run (minutes; they write the clone's results/), their flags checked.
MEASUREMENTS = {"collectives_bench.sh", "model_bench.sh", "spmd_bench.sh", "scale_bench.sh", "moe_bench.sh",
                "dispatch_bench.sh", "pipeline_bench.sh", "sim_calibrate.sh", "sim_validate.sh", "failure_bench.sh",
                "survive_probe.sh", "supervise.sh", "straggler_bench.sh", "launch_watch.sh", "report.sh"}
# A synthetic profile for pwm_sim (every key it requires; the values need not be realistic).
PROFILE = """{"machine": "test", "kernels": {"fwd_us_per_gflop": 1000, "bwd_us_per_gflop": 2000,
 "opt_us_per_param": 0.001, "step_overhead_us": 10},
 "links": {"reduce_ns_per_byte": 0.2, "intra": {"latency_us": 1, "gbytes_per_s": 5},
           "inter": {"latency_us": 50, "gbytes_per_s": 1}},
 "dispatch": {"call_us": 10, "node_us": 5, "msg_us": 2, "exec_us": 3, "spmd_exec_us": 1, "fetch_rtt_us": 40},
 "static": {"node_us": 2, "step_us": 5, "exec_us": 1, "run_us": 3}}
"""
OPENMPI = "mpich" not in os.path.basename(MPIRUN[0])


def pages():
    """README.md and docs/*.md (not docs/results/)."""
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


class Cmd:
    def __init__(self, page, line, text, tokens, inline, heredocs):
        self.page, self.line, self.text, self.tokens, self.inline = page, line, text, tokens, inline
        self.heredocs = heredocs  # {file name: text} written by `cat > F <<EOF` earlier in the block

    def where(self):
        return f"{self.page}:{self.line}"


def strip_prefix(tokens):
    """(environment settings, the tokens after VAR=value words and `nice [-n N]`)."""
    env, i = {}, 0
    while i < len(tokens):
        t = tokens[i]
        if re.match(r"^[A-Z_][A-Z0-9_]*=", t):
            k, v = t.split("=", 1)
            env[k] = v
            i += 1
        elif t == "nice":
            i += 3 if i + 1 < len(tokens) and tokens[i + 1] == "-n" else 1
        else:
            break
    return env, tokens[i:]


def prog_name(word):
    return os.path.basename(word)


def is_command(tokens):
    _, rest = strip_prefix(tokens)
    if not rest:
        return False
    w = rest[0]
    if w in LAUNCHERS or w in BINARIES or w in ("ninja", "ctest"):
        return True
    if re.match(r"^(\./)?build[-\w]*/", w) and prog_name(w) in BINARIES:
        return True
    if re.match(r"^(\./)?(build[-\w]*|mpi_scripts|sim)/", w):
        return True
    if w in ("python3", "bash") and len(rest) > 1 and re.match(r"^(\./)?(mpi_scripts|sim)/", rest[1]):
        return True
    return False


def split_commands(tokens):
    out, cur = [], []
    for t in tokens:
        if t == "&&":
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return [c for c in out + [cur] if c]


def extract(page):
    """Every command of `page`: fenced blocks' lines and inline spans."""
    lines = open(os.path.join(ROOT, page)).read().split("\n")
    cmds, i = [], 0
    while i < len(lines):
        m = re.match(r"^\s*```\s*(\S*)", lines[i])
        if m:
            lang, i = m.group(1), i + 1
            shell = lang in ("", "bash", "sh", "shell", "console")
            heredocs = {}
            while i < len(lines) and not re.match(r"^\s*```", lines[i]):
                start, text = i + 1, lines[i].strip()
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                i += 1
                if not shell:
                    continue
                text = re.sub(r"^\$ ", "", text)
                h = re.search(r"^cat > (\S+) <<'?(\w+)'?$", text)
                if h:  # a here-document: the file a later line of the block reads
                    body = []
                    while i < len(lines) and lines[i].strip() != h.group(2):
                        body.append(lines[i])
                        i += 1
                    i += 1
                    heredocs[h.group(1)] = "\n".join(body) + "\n"
                    continue
                try:
                    tokens = shlex.split(text, comments=True)
                except ValueError:
                    continue  # unbalanced quotes: printed output, not a command
                for part in split_commands(tokens):
                    if is_command(part):
                        cmds.append(Cmd(page, start, " ".join(shlex.quote(t) for t in part), part, False, dict(heredocs)))
            i += 1
            continue
        for span in re.findall(r"`([^`]+)`", lines[i]):
            try:
                tokens = shlex.split(span)
            except ValueError:
                continue
            if len(strip_prefix(tokens)[1]) > 1 and is_command(tokens):  # (one word names, it does not run)
                cmds.append(Cmd(page, i + 1, span, tokens, True, {}))
        i += 1
    return cmds


def all_commands():
    return [c for p in pages() for c in extract(p)]


# ---- classification -------------------------------------------------------------------------

PLACEHOLDER = re.compile(r"^(\[.*|.*\]|[A-Z][A-Z_]*(\.\.\.)?|.*\|.*|\.\.\.|[A-Z]+/\S+|<.*>)$")


def placeholders(tokens):
    """The tokens of a usage synopsis: [--flag X], UPPER-CASE words, a|b, <x>."""
    return [t for t in tokens if PLACEHOLDER.match(t) and t != "..."]


def launcher_parts(rest):
    """(ranks, launcher flags kept, program and its arguments) of mpirun/mpiexec/srun, or None
    when no program follows (a fragment)."""
    n, keep, i = None, [], 1
    nodes = per_node = None
    while i < len(rest):
        t = rest[i]
        if t in ("-n", "-np", "--np", "-c"):
            n, i = int(rest[i + 1]), i + 2
        elif t in ("--hostfile", "-f", "--host", "-H", "-hostfile", "--machinefile"):
            i += 2
        elif t.startswith("--nodes="):
            nodes, i = int(t.split("=")[1]), i + 1
        elif t.startswith("--ntasks-per-node="):
            per_node, i = int(t.split("=")[1]), i + 1
        elif t.startswith("--ntasks="):
            n, i = int(t.split("=")[1]), i + 1
        elif t.startswith("--mpi=") or t in ("--oversubscribe",):
            i += 1
        elif t == "--bind-to":
            i += 2
        elif t == "--enable-recovery":
            if OPENMPI:
                keep.append(t)
            i += 1
        elif t.startswith("-"):
            raise ValueError(f"launcher flag {t} has no rule here")
        else:
            break
    if n is None and nodes and per_node:
        n = nodes * per_node
    if i >= len(rest):
        return None
    return n, keep, rest[i:]


def classify(c):
    """(action, detail): run / short / flags / excused, or ('fail', why) when no rule takes it."""
    env, rest = strip_prefix(c.tokens)
    w = rest[0]
    name = prog_name(w)
    if w == "ninja":
        return "excused", "a build command (its targets are checked: ninja -n)"
    if w == "ctest" or name == "test.sh":
        return "excused", "the test suite itself"
    if name == "sanitize.sh" or w.startswith("build-fuzz/"):
        return "excused", "the sanitizer builds (minutes each; docs/sanitizers.md, mpi_scripts/sanitize.sh)"
    if name == "cluster.sh":
        inner = inner_command(rest)
        return "excused", ("emulated hosts in network namespaces (the `cluster` label runs cluster.sh)"
                           + ("; the command inside is run" if inner else ""))
    if w in ("sbatch", "salloc"):
        if any(t.endswith("compare.sbatch") for t in rest):
            return "short", None
        return "excused", "a Slurm allocation, no program"
    if w in ("python3", "bash"):
        rest = rest[1:]
        w, name = rest[0], prog_name(rest[0])
    if w.startswith("sim/") and name.startswith("project"):
        if placeholders(rest[1:]):
            return "flags", ("a usage synopsis", name, rest[1:])
        return "excused", "a projection at the paper's scale from sim_calibrate.sh's measured profile (minutes)"
    if name == "compare.sh":
        args = rest[1:]
        if placeholders(args):
            return "flags", ("a usage synopsis", name, args)
        if any(a in ("--palm", "--palm-fsdp", "--hosts") for a in args):
            return "flags", ("emulated hosts in network namespaces (the `cluster` label)", name, args)
        return "short", None
    if name in MEASUREMENTS:
        return "flags", ("a measurement script (minutes; writes the clone's results/)", name, rest[1:])
    if w in ("mpirun", "mpiexec", "srun"):
        parts = launcher_parts(rest)
        if parts is None:
            return "excused", "a launcher fragment, no program"
        n, _, prog = parts
        pname = prog_name(prog[0])
        if pname not in BINARIES:
            return "fail", f"launches {prog[0]}, which is none of the project's programs this test knows"
        if n is None:
            return "fail", "no rank count (-n N)"
        if c.inline and placeholders(prog[1:]):
            return "flags", ("a usage synopsis", pname, prog[1:])
        return "run", None
    if name in BINARIES:
        if c.inline or placeholders(rest[1:]):
            return "flags", ("a mention of the program's flags in prose" if c.inline else "a usage synopsis",
                             name, rest[1:])
        if w.startswith("build/") and name == "pwm_sim":
            return "run", None
        return "fail", f"{w}: a program run without a launcher"
    if w.rstrip("/") in ("build", "build-mpich") or w.endswith("/"):
        return "excused", "a directory, not a command"
    return "fail", "no rule of command_cases.py takes it"


def inner_command(rest):
    """The command of `cluster.sh run ... -- bash -c 'CMD'`, with $PWM_CLUSTER_MPIRUN as mpirun."""
    if "-c" in rest and rest.index("-c") + 1 < len(rest):
        text = rest[rest.index("-c") + 1].replace("$PWM_CLUSTER_MPIRUN", "mpirun")
        return shlex.split(text)
    return None


# ---- running ----------------------------------------------------------------------------------

class Failures(list):
    def add(self, c, why, cmd=None, out=""):
        lines = out.strip().splitlines()
        errors = "\n".join([l for l in lines if ": error:" in l][:3])  # (the first: mpirun's banner follows)
        tail = "\n".join(lines[-12:])
        self.append(f"{c.where()}: {c.text}\n  {why}" + (f"\n  ran: {' '.join(cmd)}" if cmd else "")
                    + (f"\n  error lines:\n{errors}" if errors else "") + (f"\n  last lines:\n{tail}" if tail else ""))

    def check(self):
        if self:
            raise AssertionError(f"{len(self)} documented command(s) failed:\n\n" + "\n\n".join(self))


def tmpdir(c):
    d = os.path.join(launch.TMP, re.sub(r"\W", "_", c.where()))
    os.makedirs(d, exist_ok=True)
    for f, text in c.heredocs.items():
        with open(os.path.join(d, f), "w") as fh:
            fh.write(text)
    return d


def binary(word):
    """A bare program's path in the build; a documented build*/PATH as written, in this build
    (a path that moved fails: run_one reports it)."""
    if re.match(r"^(\./)?build[-\w]*/", word):
        return os.path.join(launch.BUILD, word.split("/", 1)[1] if not word.startswith("./") else word[2:].split("/", 1)[1])
    return os.path.join(launch.BUILD, BINARIES[prog_name(word)])


def program_args(pname, args, d):
    """The documented arguments of `pname`, shrunk (see the module's docstring)."""
    args = [a for a in args if a != "..."]
    if pname in TRAINERS:
        more = list(SHRINK)
        if "--coll-timeout" not in args:
            more += ["--coll-timeout", "60"]
        return args + more
    if pname == "collectives_bench":  # (it takes a flag once: values replaced)
        for flag, value in (("-e", "64K"), ("-n", "2"), ("-w", "1")):
            args = args[:args.index(flag)] + args[args.index(flag) + 2:] if flag in args else args
            args += [flag, value]
        return args
    if pname == "pwm_sim":
        prof = os.path.join(d, "profile.json")
        with open(prof, "w") as f:
            f.write(PROFILE)
        out = []
        for a in args:
            out.append(prof if a.endswith("results/sim/profile.json") else
                       os.path.join(ROOT, a) if a.startswith("sim/") else a)
        return out
    return args


def normalized(c):
    """The command to run for a `run` command, and its environment."""
    env, rest = strip_prefix(c.tokens)
    env.pop("PWM_MPI", None)  # the library is the build's
    if rest[0] in ("mpirun", "mpiexec", "srun"):
        n, keep, prog = launcher_parts(rest)
        d = tmpdir(c)
        return MPIRUN + keep + [NP_FLAG, str(n), binary(prog[0])] + program_args(prog_name(prog[0]), prog[1:], d), env
    d = tmpdir(c)
    return [binary(rest[0])] + program_args(prog_name(rest[0]), rest[1:], d), env


RAN = {}


def run_one(c, cmd, env, failures, timeout=300):
    key = (" ".join(cmd[:1] + [a for a in cmd[1:] if not a.startswith(launch.TMP)]), tuple(sorted(env.items())))
    if key in RAN:  # the same command on another page: run once
        print(f"  same as {RAN[key]}: {c.where()}: {c.text}")
        return
    RAN[key] = c.where()
    missing = [a for a in cmd if a.startswith(launch.BUILD + "/") and not os.path.exists(a)]
    if missing:
        failures.add(c, f"{missing[0]} does not exist: the documented path is not the program's", cmd)
        return
    d = tmpdir(c)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=d, env={**launch.ENV, **env}, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        failures.add(c, f"did not end in {timeout} s", cmd, (e.stdout or b"").decode(errors="replace"))
        return
    print(f"  {'ok  ' if p.returncode == 0 else 'FAIL'} {time.time() - t0:5.1f} s  {c.where()}: {c.text}", flush=True)
    if p.returncode != 0:
        failures.add(c, f"exit code {p.returncode}", cmd, p.stdout + p.stderr)


def commands(action):
    out = []
    for c in all_commands():
        a, _ = classify(c)
        if a == action:
            out.append(c)
        if c.tokens and prog_name(strip_prefix(c.tokens)[1][0]) == "cluster.sh":
            inner = inner_command(strip_prefix(c.tokens)[1])
            if inner and action == "run":
                out.append(Cmd(c.page, c.line, " ".join(inner), inner, False, {}))
    return out


def case_trainers():
    """Every `run` command: the project's programs under a launcher (or pwm_sim), shrunk."""
    failures = Failures()
    cmds = commands("run")
    assert cmds, "no documented launch of a trainer found: the extraction is broken"
    for c in cmds:
        cmd, env = normalized(c)
        run_one(c, cmd, env, failures)
    failures.check()


def build_env():
    """env.sh's settings for the build under test: its directory and MPI library."""
    return {"BUILD_DIR": launch.BUILD, "PWM_MPI": "openmpi" if OPENMPI else "mpich"}


def compare_args(rest):
    """compare.sh's arguments: its own, or (sbatch/salloc of compare.sbatch) --np TASKS - 1 and
    the script's arguments, as compare.sbatch passes them."""
    if rest[0] not in ("sbatch", "salloc"):
        return rest[2:] if rest[0] in ("python3", "bash") else rest[1:]
    i = next(i for i, t in enumerate(rest) if t.endswith("compare.sbatch"))
    opts = dict(t[2:].split("=", 1) for t in rest[1:i] if t.startswith("--") and "=" in t)
    tasks = int(opts["ntasks"]) if "ntasks" in opts else int(opts["nodes"]) * int(opts["ntasks-per-node"])
    return ["--np", str(tasks - 1)] + rest[i + 1:]


def case_scripts():
    """compare.sh on one host (also as compare.sbatch calls it), the documented flags then one
    round of two steps on SHRINK's sizes."""
    failures = Failures()
    cmds = commands("short")
    assert cmds, "no documented compare.sh run found: the extraction is broken"
    for c in cmds:
        env, rest = strip_prefix(c.tokens)
        env.pop("PWM_MPI", None)
        args = compare_args(rest)
        extra = []
        if "--" in args:
            extra, args = args[args.index("--") + 1:], args[:args.index("--")]
        if "--hostfile" in args:  # one host
            i = args.index("--hostfile")
            args = args[:i] + args[i + 2:]
        d = tmpdir(c)
        i = SHRINK.index("--steps")  # (compare.sh's own --steps)
        shrink = SHRINK[:i] + SHRINK[i + 2:]
        steps = "5" if "--moe" in args else "2"
        cmd = ["bash", os.path.join(ROOT, "mpi_scripts", "compare.sh")] + args + \
              ["--rounds", "1", "--steps", steps, "--out", os.path.join(d, "results"), "--"] + extra + shrink
        run_one(c, cmd, {**env, **build_env()}, failures, timeout=600)
    failures.check()


# ---- flag checks (inventory) --------------------------------------------------------------------

HELP = {}


def help_text(name):
    """The --help output of a program, Python tool or script (cached)."""
    if name not in HELP:
        if name in BINARIES:
            cmd = [os.path.join(launch.BUILD, BINARIES[name]), "--help"]
        elif name.endswith(".py"):
            path = os.path.join(ROOT, "sim", name)
            cmd = [sys.executable, path if os.path.exists(path) else os.path.join(ROOT, "mpi_scripts", name), "--help"]
        else:
            cmd = ["bash", os.path.join(ROOT, "mpi_scripts", name), "--help"]
        p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        HELP[name] = (p.returncode, p.stdout + p.stderr)
    return HELP[name]


def flag_words(args):
    return sorted({re.sub(r"[=\]].*", "", a.lstrip("[")) for a in args
                   if re.match(r"^\[?--?[a-z]", a) and not re.match(r"^\[?-\d", a)})


def check_flags(c, name, args, failures):
    """Every --flag of `args` is one `name` takes (see the module's docstring, `flags`)."""
    if "--" in args and name == "compare.sh":
        trainer_flags = args[args.index("--") + 1:]
        args = args[:args.index("--")]
        for t in TRAINERS:
            check_flags(c, t, trainer_flags, failures)
    if name.endswith(".sh"):
        src = open(os.path.join(ROOT, "mpi_scripts", name)).read()
        p = subprocess.run(["bash", "-n", os.path.join(ROOT, "mpi_scripts", name)], capture_output=True, text=True)
        if p.returncode != 0:
            failures.add(c, f"{name} does not parse (bash -n)", None, p.stderr)
        if re.search(r"^\s*-h\|--help\)", src, re.M) and not placeholders(args):
            cmd = ["bash", os.path.join(ROOT, "mpi_scripts", name)] + args + ["--help"]
            p = subprocess.run(cmd, env=launch.ENV, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                failures.add(c, f"{name} refuses the documented arguments", cmd, p.stdout + p.stderr)
            return
        for f in flag_words(args):
            if not re.search(re.escape(f) + r"[)|]", src):
                failures.add(c, f"{name} has no flag {f} (not in its source's flag patterns)")
        return
    if not flag_words(args):
        return
    rc, text = help_text(name)
    if rc != 0:
        failures.add(c, f"{name} --help failed ({rc})", None, text)
        return
    for f in flag_words(args):
        if not re.search(r"(^|[\s,])" + re.escape(f) + r"([\s,=]|$)", text, re.M):
            failures.add(c, f"{name} has no flag {f} (not in {name} --help)")


def case_inventory():
    """Classifies every documented command, prints the ones not run with their reason, checks the
    flags of the `flags` ones and fails on a command no rule takes."""
    failures = Failures()
    counts = {}
    cmds = all_commands()
    assert len(cmds) > 20, f"only {len(cmds)} documented commands found: the extraction is broken"
    for c in cmds:
        action, detail = classify(c)
        counts[action] = counts.get(action, 0) + 1
        if action == "fail":
            failures.add(c, f"no rule: {detail} (run it, or excuse it by a rule of command_cases.py)")
        elif action == "excused":
            print(f"  skipped  {c.where()}: {c.text}\n           reason: {detail}")
            if c.tokens[0] == "ninja" or strip_prefix(c.tokens)[1][0] == "ninja":
                _, rest = strip_prefix(c.tokens)
                targets = [t for t in rest[1:] if not t.startswith("-") and t != "build"]
                p = subprocess.run(["ninja", "-C", launch.BUILD, "-n"] + targets, capture_output=True, text=True)
                if p.returncode != 0:
                    failures.add(c, "ninja -n refuses its targets", None, p.stdout + p.stderr)
        elif action == "flags":
            why, name, args = detail
            print(f"  flags    {c.where()}: {c.text}\n           ({why})")
            check_flags(c, name, args, failures)
        else:
            print(f"  {action:8s} {c.where()}: {c.text}")
    print("commands: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    failures.check()


if __name__ == "__main__":
    case_main(globals(), "docs")
