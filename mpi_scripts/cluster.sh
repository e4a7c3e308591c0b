#!/usr/bin/env bash
# An emulated multi-host cluster on this machine: each host is a Linux network namespace with a
# UTS namespace of its own (its own host name, so MPI sees distinct nodes), linked by a veth into
# a bridge that lives in a switch namespace of its own. Addresses are link-local (169.254.1.0/24)
# and exist only inside the cluster's namespaces: no default route, no NAT, nothing attached to the
# machine's own interfaces. MPI then uses shared memory within a host and TCP between hosts, and
# a token bucket (tc tbf) on every host link can shape the "datacenter network" between them.
#
#   cluster.sh up --hosts K [--slots S] [--dcn-rate RATE] [--dcn-delay D] [--name NAME]
#   cluster.sh run [--name NAME] [--timeout SECS] -- COMMAND...
#   cluster.sh run --hosts K [up options] [--timeout SECS] -- COMMAND...   (up, run, down)
#   cluster.sh exec [--name NAME] --host I -- COMMAND...   (COMMAND in host I, unwatched: daemons)
#   cluster.sh status [--name NAME]
#   cluster.sh down [--name NAME | --all]
#
# `run` executes COMMAND inside host 0 (mpirun must start on one of the hosts) with:
#   PWM_HOSTFILE          the hostfile, in the launcher's format (PWM_MPI=openmpi|mpich)
#   PWM_CLUSTER_MPIRUN    the launcher and the flags that start ranks on the hosts: use it as
#                         $PWM_CLUSTER_MPIRUN -n N prog ...
#   PWM_CLUSTER_NAME, PWM_CLUSTER_HOSTS, PWM_CLUSTER_DCN (the shaping, or "none")
#   and the launchers' variables for the launch agent (OMPI_MCA_plm_rsh_agent, HYDRA_LAUNCHER_EXEC),
#   so `mpirun --hostfile $PWM_HOSTFILE ...` works too (as over ssh: compare.sh --hostfile)
# Names are unique per cluster (pwm<pid>), so two clusters never collide; `up` undoes what it made
# if it fails or is interrupted, a one-shot `run --hosts` tears its cluster down on exit, error
# and signal, and every launch is bounded by --timeout (default 600 s, then exit 124).
# Every launch is watched (mpi_scripts/launch_watch.sh): once the job reports its end (a lost rank
# or host: "...; aborting the job"), the launcher gets a grace (PWM_LAUNCH_GRACE, default half the
# --coll-timeout within [5, 30] s) and, if still there, is ended with its daemons on every host,
# one line saying so (exit 3); no process of a launch outlives `run` (docs/cluster.md).
# `exec` runs COMMAND in host I's namespaces as it is, with no launcher variables, no watch and no
# timeout: for daemons (mpi_scripts/slurm_cluster.sh starts Slurm's this way), which `down` kills.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); without it, one line says so and the exit code is 77.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

STATE_ROOT=/run/pwm-cluster
SUBNET=169.254.1   # link-local; .0/24 and .255/24 of 169.254/16 are reserved (RFC 3927)

die() { echo "cluster.sh: error: $*" >&2; exit 2; }

usage() { sed -n '2,32p' "$0"; }

# The one-line refusal where namespaces cannot be made (exit 77: ctest's skip code here).
check_permitted() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then
    why="not root"
  elif ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v tc >/dev/null; then
    why="ip, tc or nsenter missing (packages iproute2, util-linux)"
  elif ! unshare --net --uts true 2>/dev/null; then
    why="network/UTS namespaces are not permitted here (no CAP_NET_ADMIN/CAP_SYS_ADMIN)"
  fi
  if [ -n "$why" ]; then
    echo "cluster.sh: cannot emulate hosts on this machine: $why" >&2
    exit 77
  fi
}

# ---- up -------------------------------------------------------------------------------------

hosts=0; slots=2; rate=""; delay=""; name=""; timeout_s=600; all=0; host=""

parse_opts() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=${2:-}; shift 2 ;;
      --slots) slots=${2:-}; shift 2 ;;
      --dcn-rate) rate=${2:-}; shift 2 ;;
      --dcn-delay) delay=${2:-}; shift 2 ;;
      --name) name=${2:-}; shift 2 ;;
      --host) host=${2:-}; shift 2 ;;
      --timeout) timeout_s=${2:-}; shift 2 ;;
      --all) all=1; shift ;;
      --) shift; CMD=("$@"); return 0 ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
  CMD=()
}

up() {
  pwm_count cluster.sh --hosts "$hosts" 1 16
  pwm_count cluster.sh --slots "$slots" 1 64
  if [ -n "$rate" ] && ! [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]]; then
    die "--dcn-rate '$rate' is not a tc rate (e.g. 1gbit, 500mbit)"
  fi
  if [ -n "$delay" ]; then
    [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--dcn-delay '$delay' is not a time (e.g. 100us, 1ms)"
    if ! unshare --net sh -c 'ip link set lo up && tc qdisc add dev lo root netem delay 1ms' 2>/dev/null; then
      die "--dcn-delay needs the netem qdisc, which this kernel does not have (sch_netem); run without it"
    fi
  fi
  check_permitted
  [ -n "$name" ] || name="pwm$$"
  [[ "$name" =~ ^[a-z][a-z0-9]{0,8}$ ]] || die "--name must be 1-9 lower-case letters and digits, starting with a letter"
  local dir="$STATE_ROOT/$name"
  [ -e "$dir" ] && die "a cluster named '$name' exists already (cluster.sh down --name $name)"
  mkdir -p "$dir"
  # Undo everything made so far if anything below fails or we are interrupted.
  trap "teardown $name >/dev/null 2>&1; exit 130" INT TERM
  trap "teardown $name >/dev/null 2>&1" ERR
  set -E
  ip netns add "$name-sw"
  ip -n "$name-sw" link set lo up
  ip -n "$name-sw" link add br0 type bridge
  ip -n "$name-sw" link set br0 up
  local i
  for ((i = 0; i < hosts; i++)); do
    local ns="$name-h$i"
    ip netns add "$ns"
    ip link add "$name-v$i" type veth peer name "$name-p$i"
    ip link set "$name-v$i" netns "$ns"
    ip link set "$name-p$i" netns "$name-sw"
    ip -n "$name-sw" link set "$name-p$i" master br0
    ip -n "$name-sw" link set "$name-p$i" up
    ip -n "$ns" link set "$name-v$i" name eth0
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # The DCN: every host's egress shaped by a token bucket (so a transfer between two hosts
    # crosses one shaper), and the optional delay.
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: tbf rate "$rate" burst 64kb latency 100ms
    fi
    if [ -n "$delay" ]; then
      if [ -n "$rate" ]; then
        ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: netem delay "$delay"
      else
        ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$delay"
      fi
    fi
    touch "$dir/h$i.uts"
    unshare --uts="$dir/h$i.uts" hostname "$ns"
  done
  # The launch agent: OpenMPI (plm_rsh_agent) and Hydra (-launcher-exec) call it as they would
  # call ssh: [options] HOST COMMAND...; it runs COMMAND inside HOST's namespaces.
  {
    echo '#!/bin/bash'
    echo "# Launch agent of emulated cluster $name (mpi_scripts/cluster.sh)."
    echo 'while [[ "${1:-}" == -* ]]; do shift; done'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for ((i = 0; i < hosts; i++)); do echo "  $SUBNET.$((i + 1))|$name-h$i) i=$i ;;"; done
    echo '  *) echo "cluster agent: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo "exec ip netns exec $name-h\$i nsenter --uts=$dir/h\$i.uts /bin/sh -c \"\$*\""
  } > "$dir/agent"
  chmod +x "$dir/agent"
  for ((i = 0; i < hosts; i++)); do echo "$SUBNET.$((i + 1)) slots=$slots"; done > "$dir/hostfile.openmpi"
  for ((i = 0; i < hosts; i++)); do echo "$SUBNET.$((i + 1)):$slots"; done > "$dir/hostfile.mpich"
  printf 'hosts=%s\nslots=%s\nrate=%s\ndelay=%s\n' "$hosts" "$slots" "${rate:-}" "${delay:-}" > "$dir/config"
  set +E
  trap - ERR INT TERM
  echo "$name"
}

# ---- run ------------------------------------------------------------------------------------

pick_name() {
  if [ -z "$name" ]; then
    local n
    n=$(ls "$STATE_ROOT" 2>/dev/null | head -2)
    [ -n "$n" ] || die "no cluster is up (cluster.sh up --hosts K)"
    [ "$(echo "$n" | wc -l)" -eq 1 ] || die "several clusters are up; pick one with --name ($(echo $n))"
    name=$n
  fi
  [ -f "$STATE_ROOT/$name/config" ] || die "no cluster named '$name' (cluster.sh status)"
}

run_in() {
  local dir="$STATE_ROOT/$name"
  # shellcheck disable=SC1091
  source "$dir/config"
  pwm_count cluster.sh --timeout "$timeout_s" 0
  [ ${#CMD[@]} -gt 0 ] || die "run needs a command after --"
  local launcher
  # The launch agent and the yield also go into the launchers' own environment variables, so that
  # a plain `mpirun --hostfile $PWM_HOSTFILE` (mpiexec -f) reaches the hosts as it would over ssh
  # on a real cluster: a script written for one (compare.sh --hostfile) runs here unchanged.
  if [ "$PWM_MPI" = openmpi ]; then
    # mpi_yield_when_idle: every emulated host shares this machine's cores.
    launcher="$PWM_MPIRUN --hostfile $dir/hostfile.openmpi --mca plm_rsh_agent $dir/agent --oversubscribe --bind-to none --mca mpi_yield_when_idle 1"
    export PWM_HOSTFILE="$dir/hostfile.openmpi"
    export OMPI_MCA_plm_rsh_agent="$dir/agent" OMPI_MCA_mpi_yield_when_idle=1
  else
    launcher="$PWM_MPIRUN -f $dir/hostfile.mpich -launcher ssh -launcher-exec $dir/agent"
    export PWM_HOSTFILE="$dir/hostfile.mpich"
    export HYDRA_LAUNCHER=ssh HYDRA_LAUNCHER_EXEC="$dir/agent"
  fi
  export PWM_CLUSTER_MPIRUN="$launcher" PWM_CLUSTER_NAME="$name" PWM_CLUSTER_HOSTS="$hosts"
  export PWM_CLUSTER_DCN="${rate:-none}${delay:+, delay $delay}"
  # The launch is watched (launch_watch.sh): its output passes through as it comes; once the job
  # reports its end (a lost rank or host, an error), the launcher gets a grace period and is then
  # ended with its daemons on every host, with one line saying so (exit 3); and no process of the
  # launch outlives it, whichever way it ends.
  exec bash "$PWM_ROOT/mpi_scripts/launch_watch.sh" --who cluster.sh -- \
    timeout --kill-after=10 "$timeout_s" ip netns exec "$name-h0" nsenter --uts="$dir/h0.uts" "${CMD[@]}"
}

# exec_in: COMMAND in host $host's network and UTS namespaces.
exec_in() {
  local dir="$STATE_ROOT/$name"
  # shellcheck disable=SC1091
  source "$dir/config"
  [[ "$host" =~ ^(0|[1-9][0-9]?)$ ]] && [ "$host" -lt "$hosts" ] ||
    die "--host must be a host of cluster $name, 0 to $((hosts - 1)) (got '$host')"
  [ ${#CMD[@]} -gt 0 ] || die "exec needs a command after --"
  # nsenter, not `ip netns exec`: that remounts /sys for the namespace, hiding the machine's cgroup
  # mounts under /sys/fs/cgroup, which slurmd needs to start.
  exec nsenter --net="/run/netns/$name-h$host" --uts="$dir/h$host.uts" "${CMD[@]}"
}

# ---- status / down --------------------------------------------------------------------------

status() {
  local names
  if [ -n "$name" ]; then names=$name; else names=$(ls "$STATE_ROOT" 2>/dev/null || true); fi
  [ -n "$names" ] || { echo "no emulated cluster is up"; return 0; }
  local n
  for n in $names; do
    [ -f "$STATE_ROOT/$n/config" ] || { echo "$n: no such cluster"; continue; }
    # shellcheck disable=SC1090
    (source "$STATE_ROOT/$n/config"
     echo "$n: $hosts hosts x $slots slots, DCN ${rate:-unshaped}${delay:+, delay $delay}"
     for ((i = 0; i < hosts; i++)); do
       echo "  $n-h$i  $SUBNET.$((i + 1))  processes: $(ip netns pids "$n-h$i" 2>/dev/null | wc -l)"
     done)
  done
}

# teardown NAME: kills what runs in the cluster's namespaces and removes them, the UTS files
# and the state directory. Safe on a half-made cluster.
teardown() {
  local n=$1 dir="$STATE_ROOT/$1" ns pids all=""
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$n-(h[0-9]+|sw)$"); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    all="$all $pids"
  done
  # Gone before the namespaces are (up to 5 s): no daemon outlives the script.
  local i p s alive
  for ((i = 0; i < 50; i++)); do
    alive=0
    for p in $all; do
      s=$(cat "/proc/$p/stat" 2>/dev/null) && s=${s##*) } && [ "${s%% *}" != Z ] && alive=1
    done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$n-(h[0-9]+|sw)$"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -d "$dir" ]; then
    local f
    for f in "$dir"/*.uts; do
      [ -e "$f" ] || continue
      umount "$f" 2>/dev/null || true
    done
    rm -rf "$dir"
  fi
}

down() {
  if [ "$all" = 1 ]; then
    local n
    for n in $(ls "$STATE_ROOT" 2>/dev/null || true); do teardown "$n"; echo "removed $n"; done
    # Namespaces of clusters whose state directory is gone (a killed `up`).
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^pwm[a-z0-9]*-(h[0-9]+|sw)$' | sed 's/-.*//' | sort -u); do
      teardown "$n"; echo "removed $n"
    done
    return 0
  fi
  pick_name
  teardown "$name"
  echo "removed $name"
}

# ---- main -----------------------------------------------------------------------------------

verb=${1:-}
[ $# -gt 0 ] && shift
case "$verb" in
  up) parse_opts "$@"; [ ${#CMD[@]} -eq 0 ] || die "up takes no command"; up ;;
  run)
    parse_opts "$@"
    if [ "$hosts" != 0 ]; then
      # One-shot: a cluster of our own for this command, removed however the command ends.
      name=$( (CMD=(); up) ) || exit $?
      trap 'teardown "$name"' EXIT
      # The command runs in the background so that a signal is handled at once (bash runs traps
      # only between foreground commands): the watch gets the signal and ends the launch, then
      # the EXIT trap's teardown kills whatever still runs in the cluster's namespaces.
      run_in &
      child=$!
      trap 'kill -TERM $child 2>/dev/null; wait $child; exit 130' INT TERM
      set +e
      wait $child
      exit $?
    fi
    pick_name
    run_in ;;
  exec) parse_opts "$@"; [ "$hosts" = 0 ] || die "exec runs in a cluster that is up (--name), not --hosts"
    pick_name; exec_in ;;
  status) parse_opts "$@"; status ;;
  down) parse_opts "$@"; down ;;
  ""|-h|--help) usage ;;
  *) die "unknown command '$verb' (up, run, exec, status, down; see --help)" ;;
esac
