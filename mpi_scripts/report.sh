#!/usr/bin/env bash
# One report of the project's studies (issue 60; docs/report.md): runs a chosen set of the
# benchmark scripts, each into a folder of its own under DIR, then builds DIR/index.html (one
# self-contained page: inline CSS and images, no script, no network) and DIR/report.json (every
# figure of the page, validated against mpi_scripts/report_schema.json) with
# mpi_scripts/report_page.py, and opens the page in headless Chromium (mpi_scripts/report_check.py:
# no missing image, no empty table, no script error, no link to a missing file; DIR/screenshot.png).
# The studies and what each runs (the default, quick settings; --full: the script's own defaults):
#   compare    compare.sh: spmd, fused, chained, static, pipeline   (--rounds 3 --steps 5)
#   moe        compare.sh --moe at router skew 0                    (--moe-skew 0 --rounds 2 --steps 6;
#              --full: skews 0 and 3, 3 rounds of 16 steps)
#   pipeline   pipeline_bench.sh, S = 2                             (--stages 2 --micro 8 --rounds 2 --steps 8)
#   failure    failure_bench.sh, spmd_train under random kills      (--models spmd --steps 40 --mtbf 20)
#   dispatch   dispatch_bench.sh at 2 and 4 workers, Fig. 5-8       (NPS="3 5" HOSTS="" --reps 3 --fig8-reps 2)
#   sim        sim_calibrate.sh, sim_validate.sh, sim/project.py    (calibrate --quick --no-hosts; validate
#              --no-hosts with PWM_SIM_SIZE_LAUNCHES=1: its dispatch rows give the projection its band)
#   size       scale_bench.sh: the models at each size preset and    (--sizes 4m,30m --rounds 2;
#              PyTorch DDP (fp32, bf16; --no-ddp when the peer        --full: 4m,30m,100m, 3 rounds)
#              ../shared/peers/torch_ddp_bench.py is missing)
# The default set takes ~20 minutes on 2 cores; the run prints which study runs and the time left.
# Exit status: 0 when every study and the page's checks passed; 1 when a study failed (the page
# is still written and says which; the line "report.sh: ... failed" names them); 2 on bad flags.
#
# Usage: mpi_scripts/report.sh [--full] [--dry-run] [--only LIST] [--skip LIST] [--out DIR] [--rounds R]
#                              [--steps N] [--np N] [--hosts K | --hostfile FILE] [-- TRAINER FLAGS...]
#   --full          every study at its script's documented default (an hour or more)
#   --dry-run       print each study's command and stop (nothing installed, built or run)
#   --only LIST     these studies only (names above, comma or space separated)
#   --skip LIST     every study but these
#   --out DIR       the report's folder (default results/report); each study in DIR/STUDY
#   --rounds R      rounds of the studies that take rounds (compare, moe, pipeline, size)
#   --steps N       steps of compare, moe and pipeline (moe needs 5 or more)
#   --np N          compute ranks of compare and moe (default 2; their Pathways runs use N + 1)
#   --hosts K       compare, moe and pipeline on an emulated cluster of K hosts
#                   (mpi_scripts/cluster.sh, as compare.sh --hosts; the pipeline also on one host);
#                   the simulator's calibration measures its links across emulated hosts too
#   --hostfile F    compare and moe over the hosts of F (a cluster; mpi_scripts/report.sbatch
#                   writes it under Slurm); the other studies run on the first host
#   after --, trainer flags for compare, moe, pipeline and failure (e.g. a smaller model)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ME=report.sh
INVOKED="mpi_scripts/report.sh $*"
ALL=(compare moe pipeline failure dispatch sim size)
DRY=0; NP=""; FULL=0; ONLY=""; SKIP=""; OUT="$PWM_ROOT/results/report"; ROUNDS=""; STEPS=""; HOSTS=0; HOSTFILE=""; EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --full) FULL=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --only) ONLY=$(pwm_value "$ME" "$@") || exit 2; pwm_words "$ME" --only "$ONLY" "${ALL[@]}"; shift 2 ;;
    --skip) SKIP=$(pwm_value "$ME" "$@") || exit 2; pwm_words "$ME" --skip "$SKIP" "${ALL[@]}"; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --rounds) ROUNDS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --rounds "$ROUNDS"; shift 2 ;;
    --steps) STEPS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --steps "$STEPS" 3; shift 2 ;;
    --np) NP=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --np "$NP" 1 4096; shift 2 ;;
    --hosts) HOSTS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --hosts "$HOSTS" 2 16; shift 2 ;;
    --hostfile) HOSTFILE=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "$ME: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -z "$ONLY" ] || [ -z "$SKIP" ] || { echo "$ME: error: --only and --skip exclude each other" >&2; exit 2; }
[ "$HOSTS" = 0 ] || [ -z "$HOSTFILE" ] || { echo "$ME: error: --hosts and --hostfile exclude each other" >&2; exit 2; }
[ -z "$HOSTFILE" ] || [ -r "$HOSTFILE" ] || { echo "$ME: error: --hostfile '$HOSTFILE' cannot be read" >&2; exit 2; }
STUDIES=()
for s in "${ALL[@]}"; do
  if [ -n "$ONLY" ]; then [[ " ${ONLY//,/ } " == *" $s "* ]] || continue; fi
  if [ -n "$SKIP" ]; then [[ " ${SKIP//,/ } " == *" $s "* ]] && continue; fi
  STUDIES+=("$s")
done
[ ${#STUDIES[@]} -gt 0 ] || { echo "$ME: error: --skip leaves no study to run" >&2; exit 2; }
if [[ " ${STUDIES[*]} " == *" moe "* ]] && [ -n "$STEPS" ] && [ "$STEPS" -lt 5 ]; then
  echo "$ME: error: the moe study measures from step 4 on: --steps must be at least 5 (or --skip moe)" >&2; exit 2
fi

S="$PWM_ROOT/mpi_scripts"
OUT=$(realpath -m "$OUT")
WHERE=(${NP:+--np "$NP"}); [ "$HOSTS" != 0 ] && WHERE+=(--hosts "$HOSTS"); [ -n "$HOSTFILE" ] && WHERE+=(--hostfile "$HOSTFILE")
TRAIN=(); [ ${#EXTRA[@]} -gt 0 ] && TRAIN=(-- "${EXTRA[@]}")
# quick Q [FULL]: Q's words in the quick set, FULL's (default none) with --full; rounds/steps D:
# --rounds/--steps as given, else D. (Each prints and returns 0: a command substitution's status
# would be the array assignment's under set -e.)
quick() { if [ "$FULL" = 0 ]; then echo "$1"; else echo "${2:-}"; fi; }
rounds() { if [ -n "$ROUNDS" ]; then echo "--rounds $ROUNDS"; else quick "$1"; fi; }
steps() { if [ -n "$STEPS" ]; then echo "--steps $STEPS"; else quick "$1"; fi; }
hosts() { if [ "$HOSTS" != 0 ]; then echo "--hosts $HOSTS"; fi; return 0; }
# shown: the study's command as a shell line (quoted where needed: pasted, it runs the same).
shown() { local w out=""; for w in "${ENVS[@]}" "${CMD[@]}"; do out+="$(printf '%q' "$w") "; done; echo "${out% }"; }
# The command of each study (an array CMD; ENVS: variables set for it).
study_command() {
  ENVS=()
  case $1 in
    compare) CMD=(bash "$S/compare.sh" --out "$OUT/compare" $(rounds "--rounds 3") $(steps "--steps 5") "${WHERE[@]}" "${TRAIN[@]}") ;;
    moe) CMD=(bash "$S/compare.sh" --moe --out "$OUT/moe" $(quick "--moe-skew 0") $(rounds "--rounds 2") $(steps "--steps 6")
              "${WHERE[@]}" "${TRAIN[@]}") ;;
    pipeline) CMD=(bash "$S/pipeline_bench.sh" --out "$OUT/pipeline" $(quick "--stages 2 --micro 8") $(rounds "--rounds 2")
                   $(steps "--steps 8") $(hosts) "${TRAIN[@]}") ;;
    failure) CMD=(bash "$S/failure_bench.sh" --out "$OUT/failure" $(quick "--models spmd --steps 40 --mtbf 20") "${TRAIN[@]}") ;;
    dispatch) ENVS=(PWM_DISPATCH_OUT="$OUT/dispatch"); [ "$FULL" = 1 ] || ENVS+=(NPS="3 5" HOSTS="")
              CMD=(bash "$S/dispatch_bench.sh" $(quick "--reps 3 --fig8-reps 2")) ;;
    # The validation in full (its fig5_* dispatch rows give the projection its band; --quick has
    # none), one launch of each size_*/moe_* row in the quick set.
    sim) local nh=(); [ "$HOSTS" = 0 ] && nh=(--no-hosts); [ "$FULL" = 1 ] || ENVS=(PWM_SIM_SIZE_LAUNCHES=1)
         CMD=(bash -c 'set -e; mkdir -p "$1"; bash "$2/sim_calibrate.sh" --out "$1/profile.json" $3 ${4:-}
                       bash "$2/sim_validate.sh" --profile "$1/profile.json" --out "$1" ${4:-} || echo "sim_validate.sh: exit $? (a configuration off by more than 10%: in the table)"
                       python3 "$2/../sim/project.py" "$5" "$1/profile.json" "$1"' _
              "$OUT/sim" "$S" "$(quick --quick)" "${nh[*]}" "$BUILD_DIR") ;;
    # Its sizes are presets with workloads of its own: no trainer flags, one host.
    # Without the PyTorch peer (../shared/peers beside the clone, or PWM_TORCH_DDP_PEER) the sweep
    # runs without its DDP rows, and the page says so.
    size) local peer="${PWM_TORCH_DDP_PEER:-$PWM_ROOT/../shared/peers/torch_ddp_bench.py}" nd=()
          [ -f "$peer" ] || nd=(--no-ddp)
          CMD=(bash "$S/scale_bench.sh" --out "$OUT/size" $(quick "--sizes 4m,30m") $(rounds "--rounds 2") "${nd[@]}") ;;
  esac
  return 0
}
if [ "$DRY" = 1 ]; then
  for s in "${STUDIES[@]}"; do study_command "$s"; echo "$s: $(shown)"; done
  exit 0
fi
trap 'echo "report.sh: error: line $LINENO exited $?" >&2' ERR
pwm_install_deps
pwm_install_report_tools
pwm_build >/dev/null
mkdir -p "$OUT"
: > "$OUT/commands.txt"
# Time estimates for the progress line (seconds on 2 cores; quick, full): the previous report's
# measured times win when DIR/report.json has them.
declare -A EST=([compare]="70 600" [moe]="80 1500" [pipeline]="70 900" [failure]="60 600" [dispatch]="130 900" [sim]="420 900"
                [size]="240 1200")
if [ -f "$OUT/timings.json" ]; then
  while read -r s t; do EST[$s]="$t $t"; done < <(python3 -c 'import json,sys; [print(k, int(v["seconds"])) for k, v in json.load(open(sys.argv[1])).items() if v.get("full") == int(sys.argv[2])]' "$OUT/timings.json" "$FULL" 2>/dev/null || true)
fi
est() { local e=(${EST[$1]}); echo "${e[$FULL]}"; }
python3 - "$OUT/meta.json" "$FULL" "$HOSTS" "$HOSTFILE" "$PWM_MPIRUN" "$PWM_ROOT" "$INVOKED" "${STUDIES[@]}" <<'PY'
import json, os, subprocess, sys, time
out, full, hosts, hostfile, mpirun, root, invoked, studies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8:]
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, cwd=root).stdout.strip()
    except OSError:
        return ""
lscpu = dict(l.split(":", 1) for l in sh("lscpu").splitlines() if ":" in l)
lscpu = {k.strip(): v.strip() for k, v in lscpu.items()}
mem = next((int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
ver = sh(mpirun, "--version").splitlines()
network = "one host"
if hosts:
    network = f"{hosts} emulated hosts (mpi_scripts/cluster.sh: network namespaces on this machine, TCP over a bridge, unshaped)"
elif hostfile:
    names = [l.split()[0].split(":")[0] for l in open(hostfile) if l.strip() and not l.startswith("#")]
    network = f"hostfile {hostfile}: {len(names)} hosts ({', '.join(names)})"
    ip = sh("ip", "-o", "-4", "addr", "show", "scope", "global")
    if ip:
        network += "; this host's interfaces: " + "; ".join(" ".join(l.split()[1:4:2]) for l in ip.splitlines())
json.dump({"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "full": bool(full), "studies": studies,
           "commit": sh("git", "rev-parse", "HEAD"), "commit_subject": sh("git", "log", "-1", "--format=%s"),
           "dirty": bool(sh("git", "status", "--porcelain", "--untracked-files=no")),
           "cpu": {"model": lscpu.get("Model name", "?"), "flags": lscpu.get("Flags", "").split(),
                   "cores": os.cpu_count(), "threads_per_core": lscpu.get("Thread(s) per core", "?")},
           "memory_bytes": mem, "mpi": {"launcher": mpirun, "version": ver[0] if ver else "?"},
           "hosts": hosts, "hostfile": hostfile, "network": network,
           "command": invoked.strip()},
          open(out, "w"), indent=1)
PY
TOTAL=0; for s in "${STUDIES[@]}"; do TOTAL=$((TOTAL + $(est "$s"))); done
SECONDS=0
declare -A TOOK RC
i=0
for s in "${STUDIES[@]}"; do
  i=$((i + 1))
  study_command "$s"
  left=0; for t in "${STUDIES[@]:i-1}"; do left=$((left + $(est "$t"))); done
  echo "report.sh: [$i/${#STUDIES[@]}] $s (estimate $(( ($(est "$s") + 59) / 60 )) min; about $(( (left + 59) / 60 )) min left; ${SECONDS} s so far; log $OUT/$s/log.txt)"
  mkdir -p "$OUT/$s"
  echo "$s: $(shown)" >> "$OUT/commands.txt"
  t0=$SECONDS
  set +e; trap - ERR
  # Inside a Slurm allocation only compare and moe run over its nodes (WHERE); the other studies
  # run on this node, so their launcher must not see the allocation (mpirun would spread their
  # ranks over every node): no SLURM_* variable in their environment.
  UNSET=(); if [ "$s" != compare ] && [ "$s" != moe ]; then for v in ${!SLURM_*}; do UNSET+=(-u "$v"); done; fi
  env "${UNSET[@]}" "${ENVS[@]}" "${CMD[@]}" 2>&1 | tee "$OUT/$s/log.txt" | sed -u "s/^/  $s| /"
  RC[$s]=${PIPESTATUS[0]}
  set -e; trap 'echo "report.sh: error: line $LINENO exited $?" >&2' ERR
  TOOK[$s]=$((SECONDS - t0))
  shown > "$OUT/$s/command.txt"
  echo "${RC[$s]} ${TOOK[$s]}" > "$OUT/$s/status.txt"
  [ "${RC[$s]}" = 0 ] || echo "report.sh: study $s exited ${RC[$s]} (its log: $OUT/$s/log.txt); the page says so"
done
python3 - "$OUT/timings.json" "$FULL" "${STUDIES[@]}" <<PY
import json, os, sys
p, full = sys.argv[1], int(sys.argv[2])
t = json.load(open(p)) if os.path.exists(p) else {}
took = {$(for s in "${STUDIES[@]}"; do printf '"%s": %s, ' "$s" "${TOOK[$s]}"; done)}
for s, v in took.items():
    t[s] = {"seconds": v, "full": full}
json.dump(t, open(p, "w"), indent=1)
PY
python3 "$S/report_page.py" "$OUT"
/usr/bin/python3 "$S/report_page.py" --validate "$OUT/report.json" "$S/report_schema.json"
python3 "$S/report_check.py" "$OUT/index.html" "$OUT/screenshot.png"
echo "report.sh: finished in ${SECONDS} s: $OUT/index.html (screenshot $OUT/screenshot.png)"
FAILED=(); for s in "${STUDIES[@]}"; do [ "${RC[$s]}" = 0 ] || FAILED+=("$s (exit ${RC[$s]})"); done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "report.sh: ${#FAILED[@]} of ${#STUDIES[@]} studies failed: ${FAILED[*]}; the page says so, their logs are in $OUT/STUDY/log.txt" >&2
  exit 1
fi
