#!/usr/bin/env python3
"""The project under Slurm (Debian's slurmctld, slurmd and munge) on emulated hosts:
mpi_scripts/slurm_cluster.sh runs a Slurm cluster on the namespaces of mpi_scripts/cluster.sh for
one command and removes it.

    slurm_cases.py CASE BUILD_DIR

compare.sbatch on one node and on two (--ntasks-per-node, and --ntasks alone): the table has every
row, and the runs that should end with SPMD's weights do (the table's "same weights" and
compare.json); srun --mpi=pmix of spmd_train over two nodes, bitwise equal to mpirun on one host;
report.sbatch over two nodes: compare across both, the pipeline study on the first node only, one
page naming the hosts.
Every case then checks that no daemon, namespace or file of its Slurm cluster is left.
Exit 77 (skipped) where namespaces cannot be made, and under MPICH (below).
"""
import json
import os
import re
import subprocess
import sys

from harness import launch
from harness.compare import same_bits
from harness.launch import SKIP, case_main, trainer
from harness.outputs import metrics
from harness.workloads import TINY, train

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SLURM_CLUSTER = os.path.join(ROOT, "mpi_scripts", "slurm_cluster.sh")
# A tiny model for compare.sh (as the cluster label's compare_hostfile_two_hosts): one round of 4
# steps of every row.
COMPARE_FLAGS = ["--steps", "4", "--rounds", "1"]
MODEL = "--d-model 64 --layers 3 --heads 4 --head-dim 16 --d-ff 128 --seq-len 32 --batch 24 --eval-batches 1"
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")


def skip_under_mpich():
    if os.environ.get("PWM_MPI_FLAVOR", "openmpi") == "mpich":
        # Debian's MPICH launches with Hydra, whose proxies look the node names up (the emulated
        # hosts are in no name service), and has no PMIx for srun --mpi=pmix (docs/cluster.md).
        print("SKIP: the slurm label runs OpenMPI's launches (Hydra's proxies need the node names in a name service)")
        sys.exit(SKIP)


def slurm_run(hosts, command, timeout=300):
    """Runs `command` (bash) in host 0 of a Slurm cluster of `hosts` nodes; returns the
    CompletedProcess and the cluster's name, after checking that nothing of it is left."""
    env = dict(launch.ENV, PWM_MPI="openmpi", BUILD_DIR=os.path.abspath(launch.BUILD))
    p = subprocess.run(["bash", SLURM_CLUSTER, "run", "--hosts", str(hosts), "--timeout", str(timeout), "--",
                        "bash", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 120)
    if p.returncode == SKIP:
        print(p.stderr.strip())
        sys.exit(SKIP)
    m = re.search(r"Slurm up on (pwm\d+):", p.stderr)
    assert m, f"the Slurm cluster did not come up ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    name = m.group(1)
    assert_nothing_left(name)
    assert p.returncode == 0, f"failed ({p.returncode}) on {name}: {command}\n{p.stdout}\n{p.stderr}"
    return p, name


def assert_nothing_left(name):
    """No live Slurm or munge daemon of ours (each carries SLURM_CONF under the clusters' state
    directory), no namespace of cluster `name` and no file of it."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            if comm not in DAEMONS:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as f:
                ours = any(v.startswith(b"SLURM_CONF=/run/pwm-cluster/") for v in f.read().split(b"\0"))
        except OSError:
            continue
        if ours and state != "Z":
            left.append(f"{pid} {comm}")
    assert not left, f"daemons left after the Slurm cluster {name}: {left}"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not re.search(rf"^{name}-", netns, re.M), f"namespaces of {name} left:\n{netns}"
    assert not os.path.exists(f"/run/pwm-cluster/{name}"), f"/run/pwm-cluster/{name} was left"


def sbatch_compare(hosts, sbatch_flags, rows_expected):
    """sbatch --wait compare.sbatch with `sbatch_flags` on a Slurm cluster of `hosts` nodes; checks
    the hostfile Slurm's allocation gave, the table's rows and "same weights", and compare.json."""
    out, log = os.path.join(launch.TMP, "results"), os.path.join(launch.TMP, "job.out")
    cmd = (f"sbatch --wait --output={log} {sbatch_flags} mpi_scripts/compare.sbatch "
           f"{' '.join(COMPARE_FLAGS)} --out {out} -- {MODEL}")
    p, name = slurm_run(hosts, cmd)
    with open(log) as f:
        job = f.read()
    print(f"$ {cmd}\n{job}")
    hostfiles = [f for f in os.listdir(out) if f.startswith("hostfile.")]
    assert len(hostfiles) == 1, f"expected one hostfile in {out}: {os.listdir(out)}"
    with open(os.path.join(out, hostfiles[0])) as f:
        lines = f.read().split()
    table = re.findall(r"^\s*(spmd|fused|chained|static|pipeline)\s+\d+\s.*\s(yes|no\*?)\s*$", job, re.M)
    assert [r for r, _ in table] == rows_expected, f"the table's rows are {table}:\n{job}"
    for row, same in table:
        # The pipeline sums the tied embedding's gradient in another order, by design ("no*", the
        # table's footnote); every other row ends with SPMD's weights, bit for bit.
        want = ("no*", "yes") if row == "pipeline" else ("yes",)
        assert same in want, f"{row}: same weights '{same}' on {name}:\n{job}"
    with open(os.path.join(out, "compare.json")) as f:
        runs = json.load(f)["runs"]
    assert [r["name"] for r in runs] == rows_expected, [r["name"] for r in runs]
    for r in runs:
        if r["name"] != "pipeline":
            assert r["weights_identical"], f"compare.json: {r['name']} weights {r['weights_hash']} differ from spmd's"
    return name, lines, job, trace_hosts(os.path.join(out, "fused.trace.json"))


def trace_hosts(path):
    """The hosts a trace's rows name ("... on HOST"): where the run's ranks were."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    return {m.group(1) for n in names for m in [re.search(r" on (pwm\d+-h\d+)$", n)] if m}


def tasks_per_host(name, lines):
    """{host index: slots} of a hostfile in OpenMPI's format ("pwmN-hI slots=S")."""
    got = {}
    for host, slots in zip(lines[0::2], lines[1::2]):
        m = re.fullmatch(re.escape(name) + r"-h(\d+)", host)
        assert m and slots.startswith("slots="), f"hostfile line '{host} {slots}'"
        got[int(m.group(1))] = int(slots[len("slots="):])
    return got


ROWS = ["spmd", "fused", "chained", "static", "pipeline"]


def case_compare_sbatch_one_node():
    # One node of this machine's CPUs: 3 tasks (NP 2) need --overcommit on 2 CPUs (without it the
    # job stays pending: docs/cluster.md).
    name, lines, job, hosts = sbatch_compare(1, "--nodes=1 --ntasks=3 --overcommit", ROWS)
    assert tasks_per_host(name, lines) == {0: 3}, lines
    assert hosts == {f"{name}-h0"}, f"the fused run's ranks were on {hosts}"


def case_compare_sbatch_two_nodes_ntasks_per_node():
    # --ntasks-per-node=2 on 2 nodes: 4 tasks, NP 3, 2 on each node.
    name, lines, job, hosts = sbatch_compare(2, "--nodes=2 --ntasks-per-node=2", ROWS)
    assert tasks_per_host(name, lines) == {0: 2, 1: 2}, lines
    assert hosts == {f"{name}-h0", f"{name}-h1"}, f"the fused run's ranks were on {hosts}, not on both nodes"


def case_compare_sbatch_two_nodes_ntasks():
    # --ntasks alone: 3 tasks over 2 nodes, Slurm's SLURM_TASKS_PER_NODE "2,1" (no
    # SLURM_NTASKS_PER_NODE), NP 2.
    name, lines, job, hosts = sbatch_compare(2, "--nodes=2 --ntasks=3", ROWS)
    assert sorted(tasks_per_host(name, lines).values()) == [1, 2], lines
    assert hosts == {f"{name}-h0", f"{name}-h1"}, f"the fused run's ranks were on {hosts}, not on both nodes"


def case_srun_pmix_two_nodes():
    # srun --mpi=pmix starts the ranks itself (Debian's OpenMPI is built with PMIx): spmd_train
    # --dp 4 over 2 nodes of 2 tasks, bitwise equal to mpirun on one host, and the trainer's note
    # names the two nodes its replica spans.
    ref = train(4, "spmd_dp4_one_host", ["--dp", "4"])
    path = os.path.join(launch.TMP, "srun.jsonl")
    args = " ".join(TINY + ["--dp", "4", "--metrics", path])
    p, name = slurm_run(2, f"srun --mpi=pmix --nodes=2 --ntasks-per-node=2 {trainer('spmd')} {args}")
    print(p.stdout[-2000:])
    assert re.search(rf"not on one host: replica 0 \({name}-h0, {name}-h1\)", p.stdout), \
        f"no note that the ranks span {name}-h0 and {name}-h1:\n{p.stdout}"
    same_bits(ref, metrics(path), "srun --mpi=pmix over 2 nodes against mpirun on one host")


def case_report_sbatch_two_nodes():
    # report.sbatch --only compare,pipeline on a tiny model over 2 nodes of 1 task (--np 2: compare's
    # runs oversubscribe the hostfile's 2 slots): compare runs over the allocation's hosts (the
    # fused run's ranks on both), the pipeline study on the first node only. Its launcher must not
    # see the allocation (report.sh drops every SLURM_* variable for it): with it, its spmd_train
    # --dp 2 reference is spread over the 1-slot nodes and says so ("not on one host"; shown by
    # disabling the drop, 2026-12-06), and dispatch_bench's 2-device islands cannot be made.
    out, log = os.path.join(launch.TMP, "report"), os.path.join(launch.TMP, "job.out")
    cmd = (f"sbatch --wait --output={log} --nodes=2 --ntasks-per-node=1 mpi_scripts/report.sbatch --only compare,pipeline "
           f"--np 2 --rounds 1 --steps 4 --out {out} -- {MODEL}")
    p, name = slurm_run(2, cmd, timeout=600)
    with open(log) as f:
        job = f.read()
    print(f"$ {cmd}\n{job[-3000:]}")
    with open(os.path.join(out, "report.json")) as f:
        doc = json.load(f)
    assert [s["name"] for s in doc["studies"]] == ["compare", "pipeline"], doc["studies"]
    assert all(s["exit_code"] == 0 for s in doc["studies"]), [(s["name"], s["exit_code"]) for s in doc["studies"]]
    assert f"2 hosts ({name}-h0, {name}-h1)" in doc["meta"]["network"], doc["meta"]["network"]
    with open(os.path.join(out, "index.html")) as f:
        assert f"{name}-h0, {name}-h1" in f.read(), "the page does not name the hosts"
    hosts = trace_hosts(os.path.join(out, "compare", "fused.trace.json"))
    assert hosts == {f"{name}-h0", f"{name}-h1"}, f"compare's fused run was on {hosts}, not on both nodes"
    logs = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(out, "pipeline")) for f in fs if f.endswith(".log")]
    spmd = [p for p in logs if "spmd" in os.path.basename(p)]
    assert spmd, f"no spmd_train log in the pipeline study: {logs}"
    for path in spmd:
        with open(path) as f:
            text = f.read()
        assert "done:" in text and "not on one host" not in text, f"{path}: the pipeline study left the first node:\n{text}"


if __name__ == "__main__":
    skip_under_mpich()
    case_main(globals(), "slurm")
