#!/usr/bin/env bash
# Runs a command that starts an MPI launcher (mpirun, Hydra's mpiexec) and makes sure the job
# ends once it has reported its own end, even where the launcher's abort hangs.
#
#   launch_watch.sh [--who NAME] [--grace SECS] -- COMMAND...
#
# Why: when a host becomes unreachable (its link down), the project's watchdog reports the lost
# rank after --coll-timeout and calls MPI_Abort, but OpenMPI's mpirun then waits for the
# unreachable host's orted ("abort is already in progress") for minutes, and that orted is left
# behind. So:
# - COMMAND's stdout and stderr pass through as they come (tee: byte for byte, each to its own
#   stream); its exit code is this script's when nothing had to be ended.
# - Both are watched for the line of a job that is ending itself: the project's reports ("...;
#   aborting the job": the collectives watchdog, the Pathways liveness, start-up, a transfer
#   mismatch; "error: [rank N] ...": an error that ends the job) and the launchers' own MPI_Abort
#   notices ("MPI_ABORT was invoked", "application called MPI_Abort").
# - From the first such line the launcher gets a grace period to end the job by itself. The
#   launchers and daemons (mpirun, mpiexec, orted, prted, hydra_pmi_proxy) of this command that
#   were running at the report and still are after the grace are killed (SIGKILL) with every
#   process they started and every rank left orphaned, and one line on stderr says so; the exit
#   code is then 3, the project's own code for an aborted job (MPI_Abort(..., 3): what mpirun
#   returns when its abort completes), whatever the launcher's end left COMMAND to return.
# - However this script ends (COMMAND done, a signal), no process of COMMAND's is left: each
#   carries PWM_LAUNCH_ID=<unique id> in its environment (passed on by the launchers to their
#   daemons and ranks, including those in other network namespaces of an emulated cluster), and
#   whatever still carries it is killed. Nothing else is touched, so other jobs' processes, even
#   on the same emulated hosts, are safe. (A launcher that strips its environment before
#   starting remote daemons, e.g. over a real ssh, leaves those out of reach: only this
#   machine's processes can be ended.)
#
# The grace: --grace SECS, or PWM_LAUNCH_GRACE; else half the job's watchdog timeout, within
# [5, 30] s. The timeout is the last --coll-timeout N or PWM_COLL_TIMEOUT N|=N in COMMAND's words,
# else $PWM_COLL_TIMEOUT, else the project's default (300 s: a grace of 30 s). A healthy abort
# needs ~2 s after the report here (the project's 1 s for the other ranks' lines, then MPI's);
# 5 s leaves room on a loaded machine, and the job still ends within ~2x a timeout of 5 s.
set -uo pipefail

who=launch_watch.sh grace=""
while [ $# -gt 0 ]; do
  case "$1" in
    --who) who=$2; shift 2 ;;
    --grace) grace=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "launch_watch.sh: error: unknown argument '$1' (usage: launch_watch.sh [--who NAME] [--grace SECS] -- COMMAND...)" >&2
       exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "launch_watch.sh: error: no command" >&2; exit 2; }

# ---- the grace ------------------------------------------------------------------------------
number='^[0-9]+([.][0-9]+)?$'
timeout_src="" timeout_s=""
words=" $* "
if [[ "$words" =~ .*(--coll-timeout[=[:space:]]+([0-9.]+)) ]]; then
  timeout_s=${BASH_REMATCH[2]} timeout_src="--coll-timeout $timeout_s"
elif [[ "$words" =~ .*(PWM_COLL_TIMEOUT[=[:space:]]+([0-9.]+)) ]]; then
  timeout_s=${BASH_REMATCH[2]} timeout_src="PWM_COLL_TIMEOUT=$timeout_s"
elif [ -n "${PWM_COLL_TIMEOUT:-}" ]; then
  timeout_s=$PWM_COLL_TIMEOUT timeout_src="PWM_COLL_TIMEOUT=$timeout_s"
fi
[[ "$timeout_s" =~ $number ]] || timeout_s=300 timeout_src="the default watchdog timeout, 300 s"
grace=${grace:-${PWM_LAUNCH_GRACE:-}}
if [ -n "$grace" ]; then
  [[ "$grace" =~ $number ]] || { echo "$who: error: the launch grace must be a number of seconds (got '$grace')" >&2; exit 2; }
  grace_src="set"
else
  grace=$(awk -v t="$timeout_s" 'BEGIN {g = t / 2; if (g < 5) g = 5; if (g > 30) g = 30; printf "%g", g}')
  grace_src="from $timeout_src"
fi

# ---- the processes of the job ---------------------------------------------------------------
id="$$.$RANDOM$RANDOM"
LAUNCHERS='^(mpirun|orterun|mpiexec|prterun|orted|prted|hydra_pmi_proxy)'

job_pids() {  # every live process carrying this job's PWM_LAUNCH_ID
  grep -lzxF "PWM_LAUNCH_ID=$id" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
# stat_of PID: sets PPID_OF, START_OF (clock ticks since boot) and COMM_OF; fails if PID is gone
# or a zombie.
stat_of() {
  local s rest f
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  COMM_OF=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
  rest=${s##*) }
  read -r -a f <<<"$rest"
  [ "${f[0]}" != Z ] || return 1
  PPID_OF=${f[1]} START_OF=${f[19]}
}
# The launchers and daemons of the job now, as PID:STARTTIME:COMM.
launchers_now() {
  local p
  for p in $(job_pids); do
    stat_of "$p" && [[ "$COMM_OF" =~ $LAUNCHERS ]] && echo "$p:$START_OF:$COMM_OF"
  done
}
# host_of PID: the emulated host (named network namespace) PID runs in, or this machine's name.
host_of() {
  local h
  h=$(ip netns identify "$1" 2>/dev/null) || h=""
  echo "${h:-$(hostname)}"
}
# kill_set ROOTS...: the ROOTS (pids), every process of the job below them, and the job's
# orphans (reparented away from the job: ranks and daemons whose launcher is gone), except
# COMMAND itself.
kill_set() {
  local -A parent=() in_job=() out=()
  local p q
  for p in $(job_pids); do stat_of "$p" && parent[$p]=$PPID_OF in_job[$p]=1; done
  for p in "$@"; do out[$p]=1; done
  for p in "${!parent[@]}"; do
    [ "$p" = "$cmd" ] && continue
    [ -z "${in_job[${parent[$p]}]:-}" ] && { out[$p]=1; continue; }
    q=$p
    while [ -n "${parent[$q]:-}" ]; do
      q=${parent[$q]}
      [ -n "${out[$q]:-}" ] && { out[$p]=1; break; }
    done
  done
  echo "${!out[@]}"
}
# wait_gone PIDS...: up to 5 s for the PIDS to be gone (or zombies).
wait_gone() {
  local i p alive
  for ((i = 0; i < 50; i++)); do
    alive=0
    for p in "$@"; do stat_of "$p" && alive=1; done
    [ $alive = 0 ] && return 0
    read -r -t 0.1 -u "$tick" _ || true
  done
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/pwm_launch.XXXXXX")
mkfifo "$dir/tick"
exec {tick}<>"$dir/tick"  # read -t on it: a sleep without a process
cmd=""
# Whatever ends this script: no process of the job is left.
cleanup() {
  local left i
  if [ -n "$cmd" ]; then  # a signal: COMMAND gets 2 s to end by itself
    kill -TERM "$cmd" 2>/dev/null
    for ((i = 0; i < 20; i++)); do kill -0 "$cmd" 2>/dev/null || break; read -r -t 0.1 -u "$tick" _ || true; done
  fi
  left=$(job_pids | tr '\n' ' ')
  if [ -n "$left" ]; then
    kill -KILL $left 2>/dev/null
    wait_gone $left
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the command, its output passed through and watched ---------------------------------------
REPORT='; aborting the job|^error: \[rank [0-9]+\] |MPI_ABORT was invoked|application called MPI_Abort'
: > "$dir/reports"
exec {out}> >(tee -p >(grep -E --line-buffered "$REPORT" >> "$dir/reports"))
tee_out=$!
exec {err}> >(tee -p >(grep -E --line-buffered "$REPORT" >> "$dir/reports") >&2)
tee_err=$!
PWM_LAUNCH_ID=$id "$@" <&0 >&$out 2>&$err &
cmd=$!
exec {out}>&- {err}>&-

seen=0 t_report="" hung=() ended=0
while kill -0 "$cmd" 2>/dev/null; do
  read -r -t 0.2 -u "$tick" _
  if [ -z "$t_report" ]; then
    n=$(wc -l < "$dir/reports")
    if [ "$n" -gt "$seen" ]; then
      t_report=$EPOCHREALTIME
      first=$(sed -n "$((seen + 1))p" "$dir/reports")
      seen=$n
      mapfile -t hung < <(launchers_now)
    fi
  elif awk -v a="$t_report" -v b="$EPOCHREALTIME" -v g="$grace" 'BEGIN {exit !(b - a >= g)}'; then
    # The grace is over: the launchers and daemons of the report's time that are still there.
    roots=() names=() comms=()
    for h in "${hung[@]}"; do
      IFS=: read -r p start comm <<<"$h"
      if stat_of "$p" && [ "$START_OF" = "$start" ]; then roots+=("$p"); comms+=("$comm"); fi
    done
    if [ ${#roots[@]} -gt 0 ]; then
      victims=$(kill_set "${roots[@]}")
      hosts=$(for p in $victims; do host_of "$p"; done | sort -u | paste -sd, -)
      kill -KILL $victims 2>/dev/null
      wait_gone $victims
      launcher=$(printf '%s\n' "${comms[@]}" | grep -vE '^(orted|prted|hydra_pmi_proxy)' | sort -u | paste -sd/ -)
      daemons=$(printf '%s\n' "${comms[@]}" | grep -E '^(orted|prted|hydra_pmi_proxy)' | sort -u | paste -sd/ -)
      [ ${#first} -le 90 ] || first="${first:0:87}..."
      echo "$who: the job reported its end at $(date -d "@$t_report" +%T) ($first); ${launcher:-the launcher} had" \
           "not ended ${grace} s later (grace $grace_src): ended it${daemons:+ and its daemons ($daemons)} and" \
           "what they still ran on hosts $hosts; exit code 3" >&2
      ended=1
    fi
    t_report="" hung=() seen=$(wc -l < "$dir/reports")
  fi
done
wait "$cmd"
rc=$?
cmd=""
# The job is over: whatever of it is left goes, then the last of its output.
left=$(job_pids | tr '\n' ' ')
if [ -n "$left" ]; then
  kill -KILL $left 2>/dev/null
  wait_gone $left
fi
for p in $tee_out $tee_err; do
  for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; read -r -t 0.1 -u "$tick" _ || true; done
done
[ $ended = 1 ] && exit 3
exit $rc
