#!/usr/bin/env bash
# Goodput under random failures (issue 38; docs/failures.md): each trainer runs the same training
# twice under mpi_scripts/supervise.sh, once without faults and once while an injector SIGKILLs (or
# SIGSTOPs) a random rank of the job at exponentially distributed gaps (mean --mtbf seconds, seeded). The
# supervisor restarts the job from its newest checkpoint each time. Per trainer:
# - goodput: the fault-free run's wall time over the faulty run's, for the same steps (useful
#   steps per second against a run without failures);
# - the faults, the restarts, and per recovery: the time to detect (the kill to the supervisor's
#   line that the attempt ended), to restart (that line to the restarted job's first step), and
#   the steps replayed (done before the kill, done again after it);
# - whether the faulty run ended with the fault-free run's weights (it must: a restart replays the
#   lost steps with the same data; the script fails otherwise).
#
# Usage: mpi_scripts/failure_bench.sh [--mtbf SECS] [--steps N] [--ckpt-every K] [--seed S]
#                                     [--models "spmd pathways"] [--faults "kill stop"] [--out DIR]
#                                     [-- TRAINER FLAGS...]
#   --mtbf SECS      mean time between faults (default 60)
#   --steps N        the training's steps (default 120; about 2 minutes of the default workload
#                    without faults on 2 cores)
#   --ckpt-every K   checkpoint interval in steps (default 10): what a fault costs in replay
#   --models         spmd (spmd_train --dp 2, 2 ranks), pathways (pathways_train --dp 2
#                    --granularity chained, 3 ranks: its controller is a rank the injector may kill)
#                    and/or pathways_spare (pathways_train --replicas 2 --granularity chained
#                    --spare-workers 2 under mpirun --enable-recovery, 5 ranks: a lost worker is
#                    replaced in the job from a spare, restored from the other replica; a lost
#                    controller, or a worker lost with no spare left, ends the job and the
#                    supervisor restarts it with fresh spares; OpenMPI only), pathways_spare_dp2
#                    (the same with one slice of two devices, --dp 2 --spare-workers 2: the device
#                    left in the slice is interrupted inside its collectives, and the slice is
#                    restored from the checkpoint in the job, with a replay; OpenMPI only), and/or static
#                    (mpmd_train --dp 2 --granularity chained, 2 ranks: no controller, a lost rank
#                    ends the job and the supervisor restarts it, as spmd_train)
#   --faults         what the injector does to its rank, each fault one of these at random (seeded):
#                    kill (SIGKILL: a dead process; the default) and/or stop (SIGSTOP: a hung host;
#                    the job's liveness or watchdog sees the silence, and the launcher's abort ends
#                    the stopped process). With stop, every model runs at --coll-timeout 3 (as
#                    pathways_spare always does): a stop is seen only by that timeout, whose
#                    default (300 s) would make each one cost 5 minutes. A host cut off is tested over emulated hosts
#                    (tests/cluster), not injected here: this benchmark runs on one host.
# Results: DIR/failure_bench.json (default results/), the timestamped log of every run (and of
# its injector: DIR/failure_MODEL_faulty.inject.log).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
MTBF=60; STEPS=120; CKPT_EVERY=10; SEED=1; MODELS="spmd pathways"; FAULTS="kill"; OUT="$PWM_ROOT/results"; EXTRA=()
ME=failure_bench.sh  # (flags read by env.sh's pwm_value, pwm_count, pwm_decimal, pwm_words)
while [ $# -gt 0 ]; do
  case "$1" in
    --mtbf) MTBF=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --steps) STEPS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --ckpt-every) CKPT_EVERY=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --seed) SEED=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --models) MODELS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --faults) FAULTS=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "failure_bench.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
pwm_count "$ME" --steps "$STEPS" 2; pwm_count "$ME" --ckpt-every "$CKPT_EVERY" 1; pwm_count "$ME" --seed "$SEED" 0
pwm_decimal "$ME" --mtbf "$MTBF" 1
pwm_words "$ME" --models "$MODELS" spmd pathways pathways_spare pathways_spare_dp2 static
pwm_words "$ME" --faults "$FAULTS" kill stop
MODELS=${MODELS//,/ }; FAULTS=${FAULTS//,/ }
[[ " $MODELS " != *" pathways_spare"* || "$PWM_MPI" == openmpi ]] ||
  { echo "failure_bench.sh: error: pathways_spare and pathways_spare_dp2 need OpenMPI (mpirun --enable-recovery); MPICH ends the job when a rank dies" >&2; exit 2; }
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "failure_bench: $(getconf _NPROCESSORS_ONLN) cores; commit $(git -C "$PWM_ROOT" rev-parse --short HEAD 2>/dev/null); $(date -u '+%Y-%m-%d %H:%M UTC'); MTBF $MTBF s, $STEPS steps, a checkpoint every $CKPT_EVERY"
WORKLOAD=(--steps "$STEPS" --batch 32 --eval-every 0 --eval-batches 1 --log-every 1 --ckpt-every "$CKPT_EVERY" "${EXTRA[@]}")

# Prefixes every line of stdin with the time it was read (seconds since the epoch).
stamp() { local l; while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }

# run MODEL KIND: one supervised training (KIND: free or faulty), its timestamped log in
# $OUT/failure_MODEL_KIND.log.
run() {
  local model=$1 kind=$2 base="$OUT/failure_$1_$2"
  local n=2 bin="$BUILD_DIR/spmd/spmd_train" flags=(--dp 2) launch=() sup=()
  [ "$model" = pathways ] && { n=3 bin="$BUILD_DIR/mpmd/pathways_train" flags=(--dp 2 --granularity chained); }
  [ "$model" = static ] && { bin="$BUILD_DIR/mpmd/mpmd_train" flags=(--dp 2 --granularity chained); }
  # A stopped rank is seen only by the watchdog or the liveness: the same 3 s for every model.
  [[ " $FAULTS " == *" stop "* && "$model" != pathways_spare* ]] && { flags+=(--coll-timeout 3) launch=(-x PWM_COLL_TIMEOUT=3); }
  # In-job recovery: the loss is seen after --coll-timeout of silence (the liveness timeout), and
  # mpirun --enable-recovery exits 0 whatever its ranks' codes: the metrics file says it finished.
  # (PWM_COLL_TIMEOUT too: the start-up's first agreement, before the flags are read, has only
  # it; with --enable-recovery a rank killed then would keep the others waiting 300 s.)
  [ "$model" = pathways_spare ] && { n=5 bin="$BUILD_DIR/mpmd/pathways_train" launch=(-x PWM_COLL_TIMEOUT=3 --enable-recovery)
    flags=(--replicas 2 --granularity chained --spare-workers 2 --coll-timeout 3) sup=(--done-file "$base.jsonl"); }
  [ "$model" = pathways_spare_dp2 ] && { n=5 bin="$BUILD_DIR/mpmd/pathways_train" launch=(-x PWM_COLL_TIMEOUT=3 --enable-recovery)
    flags=(--dp 2 --granularity chained --spare-workers 2 --coll-timeout 3) sup=(--done-file "$base.jsonl"); }
  rm -f "$base.ckpt" "$base.jsonl" "$base.inject.log"
  local cmd=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD "${launch[@]}" -n "$n" "$bin" "${WORKLOAD[@]}" "${flags[@]}"
             --ckpt "$base.ckpt" --resume --metrics "$base.jsonl")
  echo "\$ supervise.sh --max-restarts 1000 ${sup[*]} -- ${cmd[*]}   ($kind)"
  { bash "$PWM_ROOT/mpi_scripts/supervise.sh" --max-restarts 1000 "${sup[@]}" -- "${cmd[@]}" 2>&1; echo "failure_bench: exit $?"; } |
    stamp > "$base.log" &
  local job=$!
  if [ "$kind" = faulty ]; then
    # The injector: after each gap, SIGKILL or SIGSTOP (--faults) one of the job's ranks at
    # random (a gap in which no rank runs, e.g. between two attempts, is logged and passes).
    # (The same seed for every trainer: the same gaps and faults.)
    python3 - "$MTBF" "$SEED" "$bin" "$base.ckpt" "$job" "$FAULTS" <<'EOF' | stamp > "$base.inject.log" &
import os, random, signal, subprocess, sys, time
mtbf, seed, binary, ckpt, job = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
faults = sys.argv[6].split()
rng = random.Random(seed)
while True:
    end = time.time() + rng.expovariate(1.0 / mtbf)
    while time.time() < end:
        try:
            os.kill(job, 0)  # (no process spawned while the job trains)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.2)
    # The ranks only: their command line starts with the trainer (the launcher's and the
    # supervisor's hold the same words after theirs).
    out = subprocess.run(["pgrep", "-r", "R,S,D", "-f", f"^{binary} .*--ckpt {ckpt}"], capture_output=True,
                         text=True).stdout  # (a stopped rank is not picked again)
    pids = sorted(int(p) for p in out.split())
    if not pids:
        print("failure_bench: inject: no rank running", flush=True)
        continue
    victim = rng.choice(pids)
    # (one kind of fault draws nothing more: the kill-only schedule of a seed is that of earlier runs)
    kind = rng.choice(faults) if len(faults) > 1 else faults[0]
    sig = signal.SIGSTOP if kind == "stop" else signal.SIGKILL
    try:
        os.kill(victim, sig)
        print(f"failure_bench: inject: {sig.name} pid {victim} of {len(pids)} ranks", flush=True)
    except ProcessLookupError:
        print("failure_bench: inject: the rank had ended", flush=True)
EOF
  fi
  wait "$job"
  wait
  if grep -q "failure_bench: exit 64$" "$base.log"; then  # (supervise.sh: refused at start-up)
    echo "failure_bench.sh: error: the $model trainer refused its flags: $(grep -m1 -o '[a-z_]*_train: error: .*' "$base.log")" >&2
    exit 2
  fi
  grep -q "failure_bench: exit 0$" "$base.log" ||
    { echo "failure_bench.sh: error: the $kind $model run did not finish (log: $base.log)" >&2; exit 1; }
}

ARGS=()
for model in $MODELS; do
  run "$model" free
  run "$model" faulty
  ARGS+=("$model" "$OUT/failure_${model}_free" "$OUT/failure_${model}_faulty")
done
python3 "$PWM_ROOT/mpi_scripts/failure_report.py" "$OUT/failure_bench.json" "$MTBF" "$STEPS" "$CKPT_EVERY" "${ARGS[@]}"
