#!/usr/bin/env bash
# README's first command: the project's main job. Trains the same Transformer on the same
# built-in workload under the three execution models and prints them side by side:
#   spmd        spmd_train, dp = NP                         (mpirun -n NP)
#   fused       pathways_train --granularity fused, dp = NP (mpirun -n NP+1: controller + NP workers)
#   chained     pathways_train --granularity chained
#   static      mpmd_train --granularity chained, dp = NP (mpirun -n NP): the chained step's
#               program with no controller, every rank running its own part (docs/static_mpmd.md)
#   pipeline    pathways_train --stages NP (stages of dp=1 x tp=1 device), one stage per island,
#               GPipe, 8 micro-batches (the report prints the stage layout; more layouts and
#               1F1B: mpi_scripts/pipeline_bench.sh)
# then writes results/: compare.json, loss.png, throughput.png, timeline.png, the metrics and
# the merged Perfetto traces of every run.
#
# Usage: mpi_scripts/compare.sh [--np N] [--steps N] [--rounds R] [--hostfile FILE] [--out DIR] [-- TRAINER FLAGS...]
#   --np N          compute ranks (default 2); pathways runs use N+1 ranks
#   --steps N       optimizer steps per run (default 5: the first 2 are warm-up, reported apart)
#   --rounds R      run the five trainers R times, interleaved (every other round in reverse
#                   order), pool their step times and pair their ratios by round (default 5).
#                   Each ratio is the median of the rounds' ratios with an interval beside it;
#                   one that holds 1 reads "same within noise" (mpi_scripts/measure.py). The
#                   default takes a few minutes on 2 cores. Losses and weights
#                   come from round 1; later rounds evaluate one validation batch, not 4
#   --hostfile F    passed to mpirun (for a cluster, e.g. from compare.sbatch; docs/cluster.md):
#                   fused and chained then run on one island spanning the hosts (--islands 1xNP)
#   --hosts K       run everything on an emulated cluster of K hosts (mpi_scripts/cluster.sh):
#                   ranks go round-robin over the hosts, so every run crosses host boundaries;
#                   fused and chained use one island spanning the hosts (--islands 1xNP), the
#                   pipeline one island per stage
#   --dcn-rate R    with --hosts: shape every host's link to R (tc tbf, e.g. 1gbit)
#   --out DIR       results directory (default results/)
#   --precision P   fp32 (default) or bf16: both trainers' matrix products (bf16 operands, fp32
#                   sums, oneDNN); the trainers' GEMM peak for MFU is then the bf16 one, and the
#                   CPU's bf16 instructions are printed (docs/model_kernels.md, "bf16")
#   --palm          PaLM's layout instead (docs/results/palm.md): 2 replicas over an emulated
#                   cluster of 2 hosts, against SPMD dp=2 on one host, once unshaped and once at
#                   --dcn-rate 1gbit (or only at --dcn-rate R); rows: spmd_1host (the
#                   reference), spmd_flat and spmd_hier (spmd_train --replicas 2
#                   --replica-reduce flat|hierarchical), pw_fused and pw_chained
#                   (pathways_train --replicas 2), static (mpmd_train --replicas 2 --granularity
#                   chained); results in DIR/palm-unshaped, DIR/palm-RATE
#   --palm-fsdp     the same with sharded data parallelism inside each island (PaLM's own
#                   layout): 2 replicas of dp 2 --fsdp, 2 slots per host (4 compute ranks on
#                   this machine's cores, so slower than --palm); rows spmd_1host (spmd_train
#                   --replicas 2 --dp 2 --fsdp on one host, the reference), spmd_hier (over the 2
#                   hosts), pw_fused and pw_chained (pathways_train --replicas 2 --dp 2 --fsdp), static;
#                   results in DIR/palm-fsdp-unshaped, DIR/palm-fsdp-RATE
#   --tcp-eager B   with --palm or --palm-fsdp and OpenMPI: the TCP eager limit in bytes for every
#                   row (default 8388608, above a layer's gradient: the exchange overlaps the next
#                   kernel; 0: OpenMPI's own, 64 KiB). A piece sent eagerly lands in MPI's receive
#                   buffers first, so the default costs memory on the MPMD rows
#                   (docs/pathways_train.md, "Replicas")
#   --moe           the Mixture-of-Experts model instead (docs/results/moe.md): E = 4 experts,
#                   top-2, every other layer MoE, split over the NP devices (--expert-parallel NP),
#                   rows spmd_capacity and spmd_dropless (spmd_train at --capacity-factor 1.25 and
#                   0) and pw_static, pw_controller, pw_worker (pathways_train --granularity
#                   chained with --moe-routing static at 1.25, controller and worker dropless),
#                   and isl_static, isl_controller, isl_worker (the same with --expert-island:
#                   the experts on NP devices of their own, another island; with --hosts 2 the
#                   dense devices on one host and the experts on the other), each against the
#                   SPMD row of the same semantics; once at router skew 0 and
#                   once at --router-skew 3 (or only at --moe-skew S); --rounds defaults to 3,
#                   --steps to 16 and the batch to 8 sequences per rank here (medians from step
#                   4 on); with --hosts K the experts' AllToAll crosses the hosts; results in
#                   DIR/moe-skewS
#   --preset NAME   a model size for every run: 4m (the reference, the default), 30m or 100m
#                   (GPT-2 small's shape), each with its learning rate and warm-up (docs/model.md)
#   after --, flags for both trainers, e.g. -- --d-model 512 --layers 8 --batch 64
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
NP=2; STEPS=""; ROUNDS=""; HOSTFILE=""; OUT="$PWM_ROOT/results"; EXTRA=(); PRESET=""; HOSTS=0; DCN_RATE=""; PALM=0; PALM_FSDP=0; MOE=0
MOE_SKEW=
TCP_EAGER=
PRECISION=fp32
ME=compare.sh  # (flags read by env.sh's pwm_value, pwm_count, pwm_decimal: before anything is installed)
while [ $# -gt 0 ]; do
  case "$1" in
    --np) NP=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --np "$NP" 1 4096; shift 2 ;;
    --steps) STEPS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --steps "$STEPS"; shift 2 ;;
    --rounds) ROUNDS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --rounds "$ROUNDS"; shift 2 ;;
    --hostfile) HOSTFILE=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --out) OUT=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --precision) PRECISION=$(pwm_value "$ME" "$@") || exit 2
      [[ "$PRECISION" =~ ^(fp32|bf16)$ ]] ||
        { echo "compare.sh: error: --precision must be fp32 or bf16 (got '$PRECISION')" >&2; exit 2; }
      shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    # 0 hosts would read as "no cluster": --hosts takes 2 to 16 (mpi_scripts/cluster.sh's limit).
    --hosts) HOSTS=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --hosts "$HOSTS" 2 16; shift 2 ;;
    --dcn-rate) DCN_RATE=$(pwm_value "$ME" "$@") || exit 2; shift 2 ;;
    --palm) PALM=1; shift ;;
    --palm-fsdp) PALM=1; PALM_FSDP=1; shift ;;
    --moe) MOE=1; shift ;;
    --tcp-eager) TCP_EAGER=$(pwm_value "$ME" "$@") || exit 2; pwm_count "$ME" --tcp-eager "$TCP_EAGER" 0 1073741824; shift 2 ;;
    --moe-skew) MOE_SKEW=$(pwm_value "$ME" "$@") || exit 2
      pwm_decimal "$ME" --moe-skew "$MOE_SKEW" 0
      shift 2 ;;
    --preset) PRESET=$(pwm_value "$ME" "$@") || exit 2
      [[ "$PRESET" =~ ^[a-z0-9]+$ ]] ||
        { echo "compare.sh: error: --preset must name a preset such as 30m (got '$PRESET')" >&2; exit 2; }
      shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "compare.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$MOE" = 1 ]; then
  [ "$PALM" = 0 ] || { echo "compare.sh: error: --moe and --palm are two different jobs: choose one" >&2; exit 2; }
  STEPS=${STEPS:-16}; ROUNDS=${ROUNDS:-3}
  [ "$STEPS" -gt 4 ] || { echo "compare.sh: error: --moe measures from step 4 on: --steps must be at least 5" >&2; exit 2; }
elif [ -n "$MOE_SKEW" ]; then
  echo "compare.sh: error: --moe-skew needs --moe" >&2; exit 2
fi
[ -z "$TCP_EAGER" ] || [ "$PALM" = 1 ] || { echo "compare.sh: error: --tcp-eager needs --palm or --palm-fsdp (their hosts talk over TCP)" >&2; exit 2; }
TCP_EAGER=${TCP_EAGER:-8388608}
# --palm keeps its long runs (30 steps, one round unless asked: each round builds two clusters).
if [ "$PALM" = 1 ]; then STEPS=${STEPS:-30}; ROUNDS=${ROUNDS:-1}; fi
STEPS=${STEPS:-5}; ROUNDS=${ROUNDS:-5}
if [ "$PALM" = 1 ]; then
  [ "$HOSTS" = 0 ] && [ -z "$HOSTFILE" ] ||
    { echo "compare.sh: error: --palm makes its own cluster of 2 hosts: leave out --hosts and --hostfile" >&2; exit 2; }
  [ "$NP" = 2 ] || { echo "compare.sh: error: --palm runs 2 replicas of one device: leave out --np" >&2; exit 2; }
fi
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
mkdir -p "$OUT"
MPIRUN=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS)
ISLAND_SPAN=()
EXPERT_ISLANDS=(--islands "2x$NP")  # (--moe's isl_* rows: one island per host with --hosts)
CLUSTER_DESC=""
if [ "$PALM" = 1 ]; then
  : # palm_set makes its clusters
elif [ "$HOSTS" != 0 ]; then
  [ -z "$HOSTFILE" ] || { echo "compare.sh: error: --hosts and --hostfile exclude each other" >&2; exit 2; }
  # One slot per host: the launcher places ranks round-robin over the hosts.
  CLUSTER=$(bash "$PWM_ROOT/mpi_scripts/cluster.sh" up --hosts "$HOSTS" --slots 1 ${DCN_RATE:+--dcn-rate "$DCN_RATE"})
  trap 'bash "$PWM_ROOT/mpi_scripts/cluster.sh" down --name "$CLUSTER" >/dev/null' EXIT
  MPIRUN=(bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --name "$CLUSTER" --timeout 3600 -- bash -c '$PWM_CLUSTER_MPIRUN "$@"' _)
  ISLAND_SPAN=(--islands "1x$NP")
  EXPERT_ISLANDS=()
  CLUSTER_DESC="$HOSTS emulated hosts ($CLUSTER), ranks round-robin over them (spmd: $(( (NP + HOSTS - 1) / HOSTS )) per host at most, pathways: $(( (NP + HOSTS) / HOSTS ))), DCN ${DCN_RATE:-unshaped}"
  echo "cluster: $CLUSTER_DESC"
elif [ -n "$DCN_RATE" ] && [ "$PALM" = 0 ]; then
  echo "compare.sh: error: --dcn-rate needs --hosts K" >&2; exit 2
fi
# OpenMPI reads "host slots=N" lines with --hostfile, Hydra "host:N" lines with -f.
if [ -n "$HOSTFILE" ]; then
  [ -r "$HOSTFILE" ] || { echo "compare.sh: error: --hostfile '$HOSTFILE' cannot be read" >&2; exit 2; }
  if [ "$PWM_MPI" = openmpi ]; then MPIRUN+=(--hostfile "$HOSTFILE"); else MPIRUN+=(-f "$HOSTFILE"); fi
  # The runtime makes one island per host by default and a slice cannot span islands, so fused and
  # chained at dp = NP would not fit once the ranks are on 2 or more hosts: one island spanning
  # the hosts, as with --hosts (the pipeline's stages are islands of their own either way).
  ISLAND_SPAN=(--islands "1x$NP")
  NHOSTS=$(grep -cEv '^[[:space:]]*(#|$)' "$HOSTFILE" || true)
  CLUSTER_DESC="hostfile $HOSTFILE ($NHOSTS host$([ "$NHOSTS" = 1 ] || echo s)), fused and chained on one island spanning them, the pipeline one island per stage"
  echo "cluster: $CLUSTER_DESC"
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# The built-in workload: the reference model (d_model 256, 4 layers, 4 heads x 64, SwiGLU 1024,
# seq 128) on the default corpus, 16 sequences per data-parallel rank per step.
# MFU: every run measures its own GEMM peak, at the model's shapes, on every compute rank, at
# start-up and at every evaluation and after the last step, and keeps the highest (raised to a
# step's achieved rate if one is faster); each run's final metrics line says which peak it used
# (peak_gflops_per_rank, peak_source; docs/train.md, "MFU").
export PWM_COMPARE_PRECISION="$PRECISION"
PWM_COMPARE_MODEL="reference (d_model 256, 4 layers, 4 heads x 64 MQA, SwiGLU 1024, seq 128, vocab 256)"
[ -n "$PRESET" ] && PWM_COMPARE_MODEL="preset $PRESET (docs/model.md, \"Presets\")"
export PWM_COMPARE_MODEL
echo "precision $PRECISION | $("$BUILD_DIR/bench/model/model_bench" --bf16-info)"
BATCH_PER_RANK=16; [ "$MOE" = 1 ] && BATCH_PER_RANK=8  # (--moe: five rows, two skews, rounds)
BASE_WORKLOAD=(--steps "$STEPS" --batch $((BATCH_PER_RANK * NP)) --eval-every 10 --log-every 10 --precision "$PRECISION")
[ -n "$PRESET" ] && BASE_WORKLOAD+=(--preset "$PRESET")
WORKLOAD=("${BASE_WORKLOAD[@]}" "${EXTRA[@]}")
run() {  # run NAME NRANKS BINARY FLAGS...
  local name=$1 n=$2 bin=$3; shift 3
  local tag="$name"; [ "$ROUNDS" -gt 1 ] && tag="$name.r$ROUND"
  # Round 1 gives the losses and weights; later rounds only time the steps, so their final
  # evaluation is one batch (flags after -- still win: the last value of a flag counts).
  local eval=(); [ "$ROUND" -gt 1 ] && eval=(--eval-batches 1)
  local cmd=("${MPIRUN[@]}" -n "$n" "$BUILD_DIR/$bin" "${BASE_WORKLOAD[@]}" "${eval[@]}" "${EXTRA[@]}" "$@"
             --metrics "$OUT/$tag.jsonl" --trace "$OUT/$tag.trace.json")
  if [ "$ROUND" -le 1 ]; then echo "\$ ${cmd[*]}"; fi
  local o
  # The trainer's own error line when it wrote one (mpirun's banner follows it), else the tail.
  o=$("${cmd[@]}" 2>&1) || { grep -m1 ': error: ' <<<"$o" >&2 || tail -5 <<<"$o" >&2
                             echo "compare.sh: error: run '$name' failed" >&2; exit 1; }
  grep -E "done:|resumed" <<<"$o" | sed "s/^/r$ROUND /"
  METRICS[$name]+="${METRICS[$name]:+,}$OUT/$tag.jsonl"
  TRACES[$name]+="${TRACES[$name]:+,}$OUT/$tag.trace.json"
}
SECONDS=0
declare -A METRICS TRACES
# --palm: PaLM's layout (issue 15). Two replicas of one device each, one per emulated host (each
# host is its own Pathways island); the reference is one island of 2 devices: spmd_train --dp 2
# on one host (plain mpirun on this machine, same launcher flags as the cluster's). The
# Pathways controller is rank 0, placed round-robin on host 0 beside the worker of one island
# (rank 2); rank 1, the other island's worker, is alone on host 1. The controller only
# dispatches (docs/pathways_train.md: ~40 ms of CPU per 10 s), so it costs that island little.
palm_run() {  # palm_run NAME OPTIONAL NRANKS BINARY FLAGS... (launcher in PALM_LAUNCH)
  local name=$1 optional=$2 n=$3 bin=$4; shift 4
  local tag="$name"; [ "$ROUNDS" -gt 1 ] && tag="$name.r$ROUND"
  local cmd=("${PALM_LAUNCH[@]}" -n "$n" "$BUILD_DIR/$bin" "${WORKLOAD[@]}" "$@"
             --metrics "$PALM_DIR/$tag.jsonl" --trace "$PALM_DIR/$tag.trace.json")
  echo "\$ ${cmd[*]}"
  local cpu0
  cpu0=$(head -1 /proc/stat)
  if ! "${cmd[@]}" > "$PALM_DIR/$tag.log" 2>&1; then
    if [ "$optional" = 1 ]; then
      echo "compare.sh: '$name' did not run: $(grep -m1 error "$PALM_DIR/$tag.log")"; SKIPPED[$name]=1; return 0
    fi
    echo "compare.sh: error: run '$name' failed (log: $PALM_DIR/$tag.log)" >&2; exit 1
  fi
  grep -E "done:" "$PALM_DIR/$tag.log"
  # Where the machine's CPU went during the run (/proc/stat, every core, launch to exit): the
  # emulated hosts' network stacks (sys, softirq) run on the cores the kernels need.
  printf '%s\n%s\n' "$cpu0" "$(head -1 /proc/stat)" | awk -v t="$tag" '
    {for (i = 2; i <= 9; i++) v[NR, i] = $i}
    END {for (i = 2; i <= 9; i++) {d[i] = v[2, i] - v[1, i]; n += d[i]}
         printf "%s user %.1f%% sys %.1f%% softirq %.1f%% idle %.1f%%\n", t, 100 * (d[2] + d[3]) / n,
                100 * d[4] / n, 100 * d[8] / n, 100 * (d[5] + d[6]) / n}' >> "$PALM_DIR/cpu.txt"
  METRICS[$name]+="${METRICS[$name]:+,}$PALM_DIR/$tag.jsonl"
  TRACES[$name]+="${TRACES[$name]:+,}$PALM_DIR/$tag.trace.json"
}
palm_set() {  # palm_set RATE (empty: unshaped)
  local rate=$1 label=${1:-unshaped}
  # --palm-fsdp: 2 slots per host, filled in order: spmd_train's replica r (ranks 2r, 2r+1) on
  # host r; pathways_train's controller and first worker on host 0 with the fifth rank, its two
  # middle workers on host 1: each host's two workers are one island.
  local slots=1 mesh=() rows=(spmd_1host spmd_flat spmd_hier pw_fused pw_chained static) n_spmd=2 n_pw=3
  [ "$PALM_FSDP" = 1 ] && { slots=2; mesh=(--dp 2 --fsdp); rows=(spmd_1host spmd_hier pw_fused pw_chained static); n_spmd=4; n_pw=5
                            label="fsdp-$label"; }
  PALM_DIR="$OUT/palm-$label"; mkdir -p "$PALM_DIR"; : > "$PALM_DIR/cpu.txt"
  METRICS=(); TRACES=(); declare -gA SKIPPED=()
  local cluster
  cluster=$(bash "$PWM_ROOT/mpi_scripts/cluster.sh" up --hosts 2 --slots "$slots" ${rate:+--dcn-rate "$rate"}) || exit 1
  trap 'bash "$PWM_ROOT/mpi_scripts/cluster.sh" down --name "'"$cluster"'" >/dev/null' EXIT
  # OpenMPI's TCP transport sends a message above btl_tcp_eager_limit (64 KiB) by rendezvous: the
  # data moves only once the receiver has answered, and both answer only between kernels, so a
  # layer's gradient posted after its backward would wait a kernel or two before it starts. With
  # an eager limit above the largest piece (a layer's ~3.6 MB at the reference model) isend hands
  # the whole piece to the socket at once and the kernel moves it while the next layer computes.
  # Every row gets the same launcher flags (the SPMD rows' TCP messages too).
  # --tcp-eager sets the limit (0: OpenMPI's own); MPICH's TCP channel has no such setting here.
  local tcp=()
  [ "$PWM_MPI" = openmpi ] && [ "$TCP_EAGER" != 0 ] &&
    tcp=(--mca btl_tcp_eager_limit "$TCP_EAGER" --mca btl_tcp_rndv_eager_limit "$TCP_EAGER" --mca btl_tcp_max_send_size "$TCP_EAGER")
  local one_host=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS "${tcp[@]}")
  one_host+=($PWM_MPIRUN_YIELD)  # as the cluster's launcher
  local two_hosts=(bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --name "$cluster" --timeout 3600 -- bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ "${tcp[@]}")
  local desc="2 emulated hosts ($cluster), one replica per host (pathways: controller on host 0), DCN ${rate:-unshaped}; reference: spmd dp=2 on one host"
  [ "$PALM_FSDP" = 1 ] && desc="2 emulated hosts ($cluster) of 2 slots, one replica of dp 2 --fsdp per host (pathways: controller on host 0), DCN ${rate:-unshaped}; reference: spmd --replicas 2 --dp 2 --fsdp on one host"
  if [ "$PWM_MPI" = openmpi ]; then
    if [ "$TCP_EAGER" = 0 ]; then desc+="; TCP eager limit OpenMPI's"; else desc+="; TCP eager limit $TCP_EAGER bytes"; fi
  fi
  echo "palm: $desc"
  local one_ref=(--dp 2)
  [ "$PALM_FSDP" = 1 ] && one_ref=(--replicas 2 --dp 2 --fsdp)
  for ROUND in $(seq "$ROUNDS"); do
    local order=("${rows[@]}")
    [ $((ROUND % 2)) -eq 0 ] && order=($(printf '%s\n' "${rows[@]}" | tac))
    for r in "${order[@]}"; do
      case $r in
        spmd_1host) PALM_LAUNCH=("${one_host[@]}"); palm_run spmd_1host 0 "$n_spmd" spmd/spmd_train "${one_ref[@]}" ;;
        spmd_flat) PALM_LAUNCH=("${two_hosts[@]}"); palm_run spmd_flat 1 "$n_spmd" spmd/spmd_train --replicas 2 "${mesh[@]}" --replica-reduce flat ;;
        spmd_hier) PALM_LAUNCH=("${two_hosts[@]}"); palm_run spmd_hier 1 "$n_spmd" spmd/spmd_train --replicas 2 "${mesh[@]}" --replica-reduce hierarchical ;;
        pw_fused) PALM_LAUNCH=("${two_hosts[@]}"); palm_run pw_fused 0 "$n_pw" mpmd/pathways_train --replicas 2 "${mesh[@]}" --granularity fused ;;
        pw_chained) PALM_LAUNCH=("${two_hosts[@]}"); palm_run pw_chained 0 "$n_pw" mpmd/pathways_train --replicas 2 "${mesh[@]}" --granularity chained ;;
        # The static model: replica r on host r (ranks fill the hosts' slots in order), the
        # pieces sent between the replicas' ranks as the chained step's messages.
        static) PALM_LAUNCH=("${two_hosts[@]}"); palm_run static 0 "$n_spmd" mpmd/mpmd_train --replicas 2 "${mesh[@]}" --granularity chained ;;
      esac
    done
  done
  bash "$PWM_ROOT/mpi_scripts/cluster.sh" down --name "$cluster" >/dev/null; trap - EXIT
  local runs=()
  for r in "${rows[@]}"; do
    [ -n "${SKIPPED[$r]:-}" ] || runs+=("$r=${METRICS[$r]}:${TRACES[$r]}")
  done
  python3 - "$PALM_DIR/workload.json" "$n_spmd" "$STEPS" "$desc" "${EXTRA[@]}" <<'PY'
import json, sys
json.dump({"compute_ranks": int(sys.argv[2]), "steps": int(sys.argv[3]), "batch_per_rank": 32 // int(sys.argv[2]), "cluster": sys.argv[4],
           "model": __import__("os").environ["PWM_COMPARE_MODEL"],
           "data": "/usr/share/common-licenses", "extra_flags": sys.argv[5:],
           "precision": __import__("os").environ["PWM_COMPARE_PRECISION"]}, open(sys.argv[1], "w"))
PY
  echo
  python3 "$PWM_ROOT/mpi_scripts/compare_report.py" "$PALM_DIR" "$PALM_DIR/workload.json" "${runs[@]}"
  echo "              CPU of the whole machine during each run (/proc/stat, launch to exit; $PALM_DIR/cpu.txt):"
  sed 's/^/                /' "$PALM_DIR/cpu.txt"
}
if [ "$PALM" = 1 ]; then
  if [ -n "$DCN_RATE" ]; then palm_set "$DCN_RATE"; else palm_set ""; palm_set 1gbit; fi
  echo "compare.sh --palm$([ "$PALM_FSDP" = 1 ] && echo -fsdp): finished in ${SECONDS} s"
  exit 0
fi
PT=mpmd/pathways_train
# --moe (issue 41): the MoE model's five rows at one router skew, in interleaved rounds.
moe_set() {  # moe_set SKEW
  local skew=$1 dir="$OUT/moe-skew$1"
  mkdir -p "$dir"
  local moe=(--experts 4 --top-k 2 --moe-every 2 --expert-parallel "$NP" --router-skew "$skew")
  local order=(spmd_capacity spmd_dropless pw_static pw_controller pw_worker isl_static isl_controller isl_worker)
  echo "moe: router skew $skew, $ROUNDS rounds of ${order[*]}"
  for ROUND in $(seq "$ROUNDS"); do
    local o=("${order[@]}")
    if [ $((ROUND % 2)) -eq 0 ]; then  # (reversed: ABC CBA)
      o=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do o+=("${order[i]}"); done
    fi
    for r in "${o[@]}"; do
      local n=$NP bin=spmd/spmd_train flags=(--dp "$NP" "${moe[@]}")
      [[ $r == pw_* ]] && { n=$((NP + 1)); bin=$PT; flags+=(--granularity chained "${ISLAND_SPAN[@]}"); }
      # The experts on an island of their own: NP more devices, one island per host with --hosts
      # (the dense slice on one host, the experts on the other), else two islands of NP here.
      [[ $r == isl_* ]] && { n=$((2 * NP + 1)); bin=$PT; flags+=(--granularity chained --expert-island "${EXPERT_ISLANDS[@]}"); }
      case $r in
        spmd_capacity) flags+=(--capacity-factor 1.25) ;;
        spmd_dropless) flags+=(--capacity-factor 0) ;;
        pw_static | isl_static) flags+=(--capacity-factor 1.25 --moe-routing static) ;;
        pw_controller | isl_controller) flags+=(--capacity-factor 0 --moe-routing controller) ;;
        pw_worker | isl_worker) flags+=(--capacity-factor 0 --moe-routing worker) ;;
      esac
      local cmd=("${MPIRUN[@]}" -n "$n" "$BUILD_DIR/$bin" "${WORKLOAD[@]}" "${flags[@]}" --metrics "$dir/$r.r$ROUND.jsonl")
      [ "$ROUND" = 1 ] && echo "\$ ${cmd[*]}"
      "${cmd[@]}" > "$dir/$r.r$ROUND.log" 2>&1 ||
        { echo "compare.sh: error: run '$r' failed (log: $dir/$r.r$ROUND.log)" >&2; tail -3 "$dir/$r.r$ROUND.log" >&2; exit 1; }
    done
    echo "round $ROUND/$ROUNDS done (${SECONDS} s)"
  done
  python3 "$PWM_ROOT/mpi_scripts/moe_compare_report.py" "$dir" "$skew" 4 "$ROUNDS" \
    spmd_capacity=spmd_capacity spmd_dropless=spmd_dropless pw_static=spmd_capacity pw_controller=spmd_dropless \
    pw_worker=spmd_dropless isl_static=spmd_capacity isl_controller=spmd_dropless isl_worker=spmd_dropless
}
if [ "$MOE" = 1 ]; then
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc --all) cores)${CLUSTER_DESC:+; cluster: $CLUSTER_DESC}"
  if [ -n "$MOE_SKEW" ]; then moe_set "$MOE_SKEW"; else moe_set 0; echo; moe_set 3; fi
  echo "compare.sh --moe: finished in ${SECONDS} s"
  exit 0
fi
one() {
  case $1 in
    spmd) run spmd "$NP" spmd/spmd_train --dp "$NP" ;;
    fused) run fused $((NP + 1)) $PT --dp "$NP" --granularity fused "${ISLAND_SPAN[@]}" ;;
    chained) run chained $((NP + 1)) $PT --dp "$NP" --granularity chained "${ISLAND_SPAN[@]}" ;;
    static) run static "$NP" mpmd/mpmd_train --dp "$NP" --granularity chained ;;
    # The MPMD pipeline: NP stages of one device each, one stage per island.
    pipeline) run pipeline $((NP + 1)) $PT --stages "$NP" --islands "${NP}x1" --microbatches 8 --schedule gpipe ;;
  esac
}
# Odd rounds in one order, even rounds in the reverse (spmd fused chained static pipeline, then
# pipeline static chained fused spmd): a drift of the machine's speed within a pair of rounds then
# favours no trainer.
for ROUND in $(seq "$ROUNDS"); do
  for r in $(python3 "$PWM_ROOT/mpi_scripts/measure.py" order "$ROUND" spmd fused chained static pipeline); do one "$r"; done
  [ "$ROUNDS" -gt 1 ] && echo "round $ROUND/$ROUNDS done (${SECONDS} s)"
done
RUNS=()
for r in spmd fused chained static pipeline; do RUNS+=("$r=${METRICS[$r]}:${TRACES[$r]}"); done
python3 - "$OUT/workload.json" "$NP" "$STEPS" "$CLUSTER_DESC" "${EXTRA[@]}" <<'PY'
import json, sys
json.dump({"compute_ranks": int(sys.argv[2]), "steps": int(sys.argv[3]), "batch_per_rank": 16,
           "cluster": sys.argv[4] or "one host",
           "model": __import__("os").environ["PWM_COMPARE_MODEL"],
           "data": "/usr/share/common-licenses", "extra_flags": sys.argv[5:],
           "precision": __import__("os").environ["PWM_COMPARE_PRECISION"]},
          open(sys.argv[1], "w"))
PY
echo
python3 "$PWM_ROOT/mpi_scripts/compare_report.py" "$OUT" "$OUT/workload.json" "${RUNS[@]}"
echo "compare.sh: finished in ${SECONDS} s; open the *.trace.json files in ui.perfetto.dev"
