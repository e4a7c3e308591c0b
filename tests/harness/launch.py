"""Launching ranks: the MPI launcher's command and environment, the trainers' paths in the build
directory, a case's build and temporary directories, and the main() every case file ends with.

BUILD (the build directory), TMP (this case's temporary directory) and ENV (the ranks'
environment; a case may replace it for a while) are set per case: read them as launch.TMP,
launch.BUILD, launch.ENV, not imported by name.

Also here: jobs of several programs (mpmd), jobs under mpi_scripts/supervise.sh, jobs whose rank
stops itself (watch_a_stop), a tiny full filesystem (small_tmpfs) and the skip code 77.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

# ctest's skip code here (SKIP_RETURN_CODE of pwm_add_python_cases, tests/CMakeLists.txt).
SKIP = 77

BUILD = None
TMP = None


def set_build(build, tmp=None):
    """Sets the build directory (and this case's temporary directory): case_main does, or a case
    file's own main()."""
    global BUILD, TMP
    BUILD = build
    if tmp:
        TMP = tmp


# The launcher of the MPI library the build found (cmake/mpi_launcher.cmake passes it through
# the test environment); OpenMPI's mpirun with its flags when run by hand.
MPIRUN = [os.environ.get("PWM_MPIEXEC", "mpirun")] + os.environ.get(
    "PWM_MPIEXEC_FLAGS", "--oversubscribe --bind-to none").split()
NP_FLAG = os.environ.get("PWM_MPIEXEC_NUMPROC_FLAG", "-n")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_base_warn_component_unused="0")


PROGRAMS = {"spmd": "spmd_train", "pathways": "pathways_train", "static": "mpmd_train"}


def trainer(exe="spmd"):
    """The path of trainer `exe` (spmd, pathways, static) in the build directory."""
    if exe == "spmd":
        return os.path.join(BUILD, "spmd", "spmd_train")
    if exe == "static":
        return os.path.join(BUILD, "mpmd", "mpmd_train")
    return os.path.join(BUILD, "mpmd", "pathways_train")


def run(n, args, expect_ok=True, timeout=240, exe="spmd"):
    """Runs trainer `exe` on n ranks with `args` (ENV, at most `timeout` s); fails on a non-zero
    exit unless expect_ok is False. Returns the CompletedProcess."""
    cmd = MPIRUN + [NP_FLAG, str(n), trainer(exe)] + args
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if expect_ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def mpmd(parts, timeout=120, exe="spmd"):
    """One job of several programs: parts = [(ranks, args), ...] joined by ':'."""
    cmd = list(MPIRUN)
    for i, (n, args) in enumerate(parts):
        cmd += ([":"] if i else []) + [NP_FLAG, str(n), trainer(exe)] + args
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def small_tmpfs(name, kb=64):
    """A tiny tmpfs under TMP (unmounted by case_main()), or exit 77 (skip) where mounting is not allowed."""
    d = os.path.join(TMP, name)
    os.makedirs(d)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", d], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP: cannot mount a tmpfs here ({r.stderr.strip()})")
        sys.exit(SKIP)
    MOUNTS.append(d)
    return d


MOUNTS = []


# Issue 38: mpi_scripts/supervise.sh restarts a failed job from its checkpoint.
SUPERVISE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi_scripts", "supervise.sh")


def supervised(sup_args, n, args, exe="spmd", restart=None):
    """mpi_scripts/supervise.sh SUP_ARGS -- mpirun -n N TRAINER ARGS [--- mpirun -n N2 TRAINER ARGS2]."""
    cmd = ["bash", SUPERVISE] + sup_args + ["--"] + MPIRUN + [NP_FLAG, str(n), trainer(exe)] + args
    if restart:
        cmd += ["---"] + MPIRUN + [NP_FLAG, str(restart[0]), trainer(exe)] + restart[1]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def supervisor_lines(p):
    """supervise.sh's own lines in the output of `p`."""
    return [l for l in p.stderr.splitlines() if l.startswith("supervise.sh:")]


# Issue 38: a rank stopped (SIGSTOP: a hung host).

def stopped_processes(root):
    """The pids of the stopped (state T) descendants of process `root`."""
    parent, state = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state[int(pid)], parent[int(pid)] = fields[0], int(fields[1])
    def under(p):
        while p in parent and p > 1:
            p = parent[p]
            if p == root:
                return True
        return False
    return [p for p, s in state.items() if s == "T" and under(p)]


def watch_a_stop(cmd, on_line=None, timeout=180):
    """Runs `cmd`, whose ranks stop one of themselves (--kill-signal stop); returns (return code,
    output, when the stopped process was first seen, when the job ended, {line: when it was read}).
    on_line(line, stopped pids) is called for every line as it is read."""
    import threading
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen = [], {}
    stopped_at, stopped = None, []

    def read():
        for line in proc.stdout:
            lines.append(line)
            seen.setdefault(line.strip(), time.time())
            if on_line:
                on_line(line, stopped)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if stopped_at is None:
            stopped[:] = stopped_processes(proc.pid)
            if stopped:
                stopped_at = time.time()
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        raise AssertionError(f"the job with a stopped rank did not end in {timeout} s:\n" + "".join(lines)[-3000:])
    ended = time.time()
    reader.join(timeout=10)
    return proc.returncode, "".join(lines), stopped_at, ended, seen


def case_main(cases, prefix):
    """The main() of a case file that runs one case of `cases` (its globals()) in a fresh TMP:
    `SCRIPT CASE BUILD_DIR`. Unmounts what small_tmpfs mounted."""
    case, build = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix=f"{prefix}_{case}_")
    set_build(build, tmp)
    try:
        cases["case_" + case]()
        print(f"PASS {case}")
    finally:
        for d in MOUNTS:
            subprocess.run(["umount", d], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
