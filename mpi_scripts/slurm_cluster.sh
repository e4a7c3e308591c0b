#!/usr/bin/env bash
# A Slurm cluster on emulated hosts (mpi_scripts/cluster.sh), for one command: Debian's slurmctld
# in host 0, a slurmd in every host, one munged with a key of its own; the command runs in host 0
# with SLURM_CONF set (sbatch, srun, salloc, sinfo reach this cluster's slurmctld), and then
# everything is removed: the daemons, the namespaces and the files.
#
#   slurm_cluster.sh run --hosts K [--timeout SECS] -- COMMAND...
#
# Each node declares this machine's CPUs (getconf _NPROCESSORS_ONLN): the hosts share them, so a
# job of more tasks than that on one node needs --overcommit (docs/cluster.md, "With Slurm").
# The files (slurm.conf, the munge key and socket, state, spool, logs) live in the cluster's state
# directory, which `cluster.sh down` removes; the daemons run inside the hosts' namespaces, where
# `down` kills them, and listen on Slurm's default ports there, which nothing else in those
# namespaces uses. Each slurmd has a spool and a TmpFS of its own (%n): the hosts share one file
# system, and Slurm's PMIx plugin makes its client directory under TmpFS, named by job and step
# only. Nodes need no name service: every daemon is reached by its NodeAddr.
# The packages are installed the first time (env.sh's pwm_install_slurm). The exit code is
# COMMAND's; 124 when --timeout (default 600 s) ended it; 77 where namespaces cannot be made (not
# root); non-zero when the cluster did not come up, with the daemons' logs (PWM_SLURM_DEBUG=1
# prints them in any case).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ME=slurm_cluster.sh
CLUSTER="$PWM_ROOT/mpi_scripts/cluster.sh"

die() { echo "$ME: error: $*" >&2; exit 2; }

verb=${1:-}
[ $# -gt 0 ] && shift
case "$verb" in
  run) ;;
  ""|-h|--help) sed -n '2,20p' "$0"; exit 0 ;;
  *) die "unknown command '$verb' (run; see --help)" ;;
esac
hosts=""; timeout_s=600; CMD=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --hosts "$hosts" 1 16; shift 2 ;;
    --timeout) timeout_s=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --timeout "$timeout_s"; shift 2 ;;
    --) shift; CMD=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$hosts" ] || die "run needs --hosts K"
[ ${#CMD[@]} -gt 0 ] || die "run needs a command after --"

if [ "$(id -u)" -ne 0 ]; then
  echo "$ME: cannot run Slurm's daemons on emulated hosts: not root" >&2
  exit 77
fi
name=$(bash "$CLUSTER" up --hosts "$hosts" --slots 1) || exit $?  # (77 where namespaces cannot be made)
dir=/run/pwm-cluster/$name/slurm
started=0 up=0
# On the way out, whatever the way: the daemons' logs if the cluster did not come up (or with
# PWM_SLURM_DEBUG=1), then `down` kills every process in the hosts' namespaces and removes them
# and the state directory, $dir with it.
finish() {
  if { [ $started = 1 ] && [ $up = 0 ]; } || [ -n "${PWM_SLURM_DEBUG:-}" ]; then
    [ $up = 1 ] || echo "$ME: error: the Slurm cluster did not come up; the daemons' logs:" >&2
    tail -n 20 "$dir"/log/*.log >&2 2>/dev/null || true
  fi
  bash "$CLUSTER" down --name "$name" >/dev/null
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
pwm_install_slurm
mkdir -p "$dir/state" "$dir/log" "$dir/node"
started=1
chmod 755 "$dir"
on() { local h=$1; shift; bash "$CLUSTER" exec --name "$name" --host "$h" -- "$@"; }

# munge: a key of its own and a socket in $dir (munged checks that neither is open to others).
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge.key"
socket=$dir/munge.socket
# Every daemon carries SLURM_CONF (their environment names this cluster, as the tests look for).
export SLURM_CONF=$dir/slurm.conf PWM_CLUSTER_NAME=$name
on 0 munged --origin=169.254.1.1 --key-file="$dir/munge.key" --socket="$socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed"

cpus=$(getconf _NPROCESSORS_ONLN)
{
  echo "# Slurm on emulated cluster $name (mpi_scripts/slurm_cluster.sh); removed with it."
  echo "ClusterName=$name"
  echo "SlurmctldHost=$name-h0(169.254.1.1)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$socket"
  echo "StateSaveLocation=$dir/state"
  echo "SlurmctldPidFile=$dir/slurmctld.pid"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdSpoolDir=$dir/node/%n/spool"
  echo "SlurmdPidFile=$dir/node/%n/slurmd.pid"
  echo "SlurmdLogFile=$dir/log/slurmd.%n.log"
  echo "TmpFS=$dir/node/%n/tmp"
  # No cgroup plugins (the emulated hosts share the machine's cgroups): process groups track a
  # step's processes, and tasks are not bound to CPUs.
  echo "ProctrackType=proctrack/pgid"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "MpiDefault=none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "ReturnToService=2"
  echo "KillWait=5"
  echo "MinJobAge=10"
  for ((i = 0; i < hosts; i++)); do
    echo "NodeName=$name-h$i NodeAddr=169.254.1.$((i + 1)) CPUs=$cpus State=UNKNOWN"
    mkdir -p "$dir/node/$name-h$i/spool" "$dir/node/$name-h$i/tmp"
  done
  echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$dir/slurm.conf"

for ((i = 0; i < 50; i++)); do [ -S "$socket" ] && break; sleep 0.1; done
on 0 slurmctld
for ((i = 0; i < hosts; i++)); do on "$i" slurmd; done

# Up when every node is idle (up to 30 s).
for ((i = 0; i < 150; i++)); do
  idle=$(on 0 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" -eq "$hosts" ] && { up=1; break; }
  sleep 0.2
done
if [ $up = 0 ]; then
  echo "$ME: error: the Slurm nodes were not idle within 30 s: $(on 0 sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')" >&2
  exit 1
fi

echo "$ME: Slurm up on $name: nodes $name-h[0-$((hosts - 1))] of $cpus CPUs, slurmctld on $name-h0, SLURM_CONF=$SLURM_CONF" >&2
set +e
# In the background, so that a signal is handled at once (bash runs traps only between foreground
# commands): `down` then kills the command with the daemons.
timeout --kill-after=10 "$timeout_s" bash "$CLUSTER" exec --name "$name" --host 0 -- "${CMD[@]}" &
wait $!
rc=$?
if [ $rc = 124 ]; then
  echo "$ME: error: the command did not end in $timeout_s s (--timeout); its cluster is removed" >&2
fi
exit $rc
