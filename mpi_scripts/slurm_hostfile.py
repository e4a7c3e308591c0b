#!/usr/bin/env python3
"""A Slurm job's hostfile for mpirun (compare.sbatch): one line per node with the tasks Slurm
placed there, in the launcher's format.

    scontrol show hostnames "$SLURM_JOB_NODELIST" | slurm_hostfile.py FLAVOR "$SLURM_TASKS_PER_NODE"

FLAVOR is openmpi ("host slots=N") or mpich (Hydra's "host:N"). SLURM_TASKS_PER_NODE lists the
tasks per node in node-list order, runs of equal counts compressed: "2(x3),1" is 2, 2, 2, 1. It is
set for every allocation (sbatch, salloc), where SLURM_NTASKS_PER_NODE is set only with
--ntasks-per-node. Errors are one line and exit 2.
"""
import re
import sys


def expand_tasks_per_node(spec):
    """"2(x3),1" -> [2, 2, 2, 1]. Raises ValueError on anything else."""
    counts = []
    for item in spec.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ValueError(f"SLURM_TASKS_PER_NODE '{spec}': expected counts like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def hostfile_lines(hosts, spec, flavor):
    """The hostfile's lines for `hosts` (the node list, in order) and their tasks per node."""
    counts = expand_tasks_per_node(spec)
    if len(counts) != len(hosts):
        raise ValueError(f"SLURM_TASKS_PER_NODE '{spec}' gives {len(counts)} nodes but the node list has {len(hosts)}")
    if flavor == "openmpi":
        return [f"{h} slots={n}" for h, n in zip(hosts, counts)]
    if flavor == "mpich":
        return [f"{h}:{n}" for h, n in zip(hosts, counts)]
    raise ValueError(f"unknown MPI flavor '{flavor}' (openmpi or mpich)")


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: scontrol show hostnames \"$SLURM_JOB_NODELIST\" | slurm_hostfile.py openmpi|mpich "
                 "\"$SLURM_TASKS_PER_NODE\"")
    hosts = [h.strip() for h in sys.stdin if h.strip()]
    try:
        print("\n".join(hostfile_lines(hosts, argv[2], argv[1])))
    except ValueError as e:
        print(f"slurm_hostfile.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
