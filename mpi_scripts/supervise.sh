#!/usr/bin/env bash
# Restarts a training job from its newest checkpoint when it fails, a bounded number of times
# (torchrun's --max-restarts for mpirun jobs; docs/failures.md).
#
#   supervise.sh [--max-restarts N] [--inject "FLAGS"] [--done-file FILE] -- COMMAND... [--- RESTART_COMMAND...]
#
# COMMAND starts the job with its launcher (mpirun, Hydra's mpiexec, cluster.sh run ...) and must
# pass the trainer --ckpt FILE and --resume: the trainer then starts from FILE when it exists,
# from step 0 otherwise, so the same command serves the first attempt and every restart, and
# what the failure lost is replayed from the checkpoint's step with the same data order (the
# batches are a function of the seed and the step; a resume on the same mesh is bitwise the run
# that did not fail).
# - Each attempt runs under launch_watch.sh: a job that reports its own end (a lost rank named by
#   the watchdog or the Pathways liveness) is ended even where the launcher's abort hangs, and
#   none of its processes is left. So an attempt always ends, and the next one starts clean.
# - Exit 64 is the trainers' refusal at start-up (a usage, configuration or input error,
#   train/bootstrap.h kExitRefused): no restart can fix it, so this script stops at once, says so
#   in one line after the trainer's own and exits 64. (Under OpenMPI's --enable-recovery mpirun
#   exits 0 whatever its ranks' codes, so there a refusal is seen as an attempt that did not
#   write --done-file and is restarted: check such a command without the flag first.)
# - On exit 0 this script exits 0. On any other exit it restarts, up to --max-restarts times
#   (default 3), with one line on stderr per restart naming the attempt, its exit code, its
#   time and the checkpoint; with no restart left it exits with the last attempt's code and says
#   so in one line.
# - --inject "FLAGS": words appended to COMMAND on the first attempt only: a fault to inject
#   (e.g. "--kill-step 5 --kill-rank 1"), which the restarts do not repeat.
# - --done-file FILE: an attempt has finished if and only if it wrote FILE (the trainer's
#   --metrics, which appears only when the run ends well), whatever its exit code. For launchers
#   whose exit code does not say: OpenMPI's mpirun --enable-recovery (pathways_train
#   --spare-workers) exits 0 whatever its ranks' exit codes, and a pathways_train that lost a rank
#   ends the job with MPI_Abort once FILE is written (a stopped or cut-off rank would keep the
#   launcher waiting). FILE is removed before each attempt.
# - --- RESTART_COMMAND: what the restarts run instead of COMMAND, e.g. the same trainer on fewer
#   ranks (a smaller mesh; checkpoints resume across meshes). It must pass --ckpt and --resume too.
# - SIGINT/SIGTERM end the running attempt (launch_watch.sh removes its processes) and this
#   script, without a restart.
set -uo pipefail

max_restarts=3 inject="" done_file=""
usage="usage: supervise.sh [--max-restarts N] [--inject \"FLAGS\"] [--done-file FILE] -- COMMAND... [--- RESTART_COMMAND...]"
die() { echo "supervise.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts) [ $# -ge 2 ] || die "--max-restarts needs a value ($usage)"; max_restarts=$2; shift 2 ;;
    --inject) [ $# -ge 2 ] || die "--inject needs a value ($usage)"; inject=$2; shift 2 ;;
    --done-file) [ $# -ge 2 ] || die "--done-file needs a value ($usage)"; done_file=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' ($usage)" ;;
  esac
done
# (Nine digits at most: a longer number would overflow the shell's arithmetic below. This script
# stands alone, without env.sh, so it checks by itself as env.sh's pwm_count does.)
[[ "$max_restarts" =~ ^[0-9]{1,9}$ ]] || die "--max-restarts must be a whole number from 0 to 999999999 (got '$max_restarts')"
first=() again=() seen_sep=0
for w in "$@"; do
  if [ "$w" = "---" ]; then seen_sep=1; continue; fi
  if [ "$seen_sep" = 1 ]; then again+=("$w"); else first+=("$w"); fi
done
[ ${#first[@]} -gt 0 ] || die "no command ($usage)"
[ "$seen_sep" = 0 ] || [ ${#again[@]} -gt 0 ] || die "nothing after ---: give the restart command or leave --- out"
[ ${#again[@]} -gt 0 ] || again=("${first[@]}")

# The checkpoint both commands name (--ckpt FILE or --ckpt=FILE), and their --resume.
ckpt_of() {
  local prev="" w
  for w in "$@"; do
    [ "$prev" = "--ckpt" ] && { echo "$w"; return; }
    case "$w" in --ckpt=*) echo "${w#--ckpt=}"; return ;; esac
    prev=$w
  done
}
has_resume() { local w; for w in "$@"; do [ "$w" = "--resume" ] && return 0; done; return 1; }
check_cmd() {  # check_cmd WHAT WORDS...
  local what=$1; shift
  [ -n "$(ckpt_of "$@")" ] && has_resume "$@" ||
    die "$what needs --ckpt FILE and --resume, so that a restart continues from the checkpoint"
}
check_cmd "the command" "${first[@]}"
check_cmd "the restart command" "${again[@]}"
ckpt=$(ckpt_of "${again[@]}")
[ "$ckpt" = "$(ckpt_of "${first[@]}")" ] || die "the command and the restart command name different --ckpt files"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; echo "supervise.sh: stopped by a signal; no restart" >&2; exit 130' INT TERM

attempt=0 restarts=0
while :; do
  attempt=$((attempt + 1))
  if [ "$attempt" = 1 ]; then
    # shellcheck disable=SC2206  # --inject is words, split on purpose
    words=("${first[@]}" ${inject})
  else
    words=("${again[@]}")
  fi
  t0=$(date +%s.%N)
  [ -z "$done_file" ] || rm -f "$done_file"
  bash "$here/launch_watch.sh" --who supervise.sh -- "${words[@]}" &
  child=$!
  wait "$child"
  rc=$?
  child=""
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  how="exit $rc"
  if [ -n "$done_file" ]; then
    if [ -e "$done_file" ]; then
      [ "$rc" = 0 ] || echo "supervise.sh: attempt $attempt ended with exit $rc after $secs s but wrote $done_file: it finished" >&2
      rc=0
    elif [ "$rc" = 0 ]; then
      rc=1 how="exit 0 but without writing $done_file (it did not finish)"
    fi
  fi
  [ "$rc" = 0 ] && exit 0
  if [ "$rc" = 64 ]; then
    echo "supervise.sh: attempt $attempt was refused at start-up (exit 64: a usage, configuration or input error, named above); no restart can fix it" >&2
    exit 64
  fi
  if [ "$restarts" -ge "$max_restarts" ]; then
    echo "supervise.sh: attempt $attempt ended with $how after $secs s; no restart left (--max-restarts $max_restarts)" >&2
    exit "$rc"
  fi
  restarts=$((restarts + 1))
  from="from $ckpt"
  [ -e "$ckpt" ] || from="from step 0 (no checkpoint $ckpt yet)"
  echo "supervise.sh: attempt $attempt ended with $how after $secs s; restart $restarts of at most $max_restarts, $from" >&2
done
