#!/usr/bin/env bash
# Runs the real configurations that fit on this machine and compares each with the simulator's
# prediction from a profile (mpi_scripts/sim_calibrate.sh): predicted vs measured median step
# time (for dispatch_bench: us per computation, the lower quartile of the launches) and tokens/s, the error of each, a table on stdout,
# results/sim/validation.json and results/sim/validation.png (predicted vs measured). Beside each
# measured figure its order-statistic interval over the launches (mpi_scripts/measure.py) and
# whether the prediction lies inside it (sim_report.py).
#
#   mpi_scripts/sim_validate.sh [--profile results/sim/profile.json] [--quick] [--no-hosts]
#                               [--dcn-rate 200mbit] [--dcn-delay D (needs sch_netem)] [--out results/sim]
# --quick: SPMD dp 1-2, fused, and one shaped-DCN run (~2 minutes). Full: ~9-11 minutes (the size_*,
# moe_* and goodput_* rows ~6 of them; PWM_SIM_SIZE_LAUNCHES launches each, default 5).
# The shaping must be the one the profile was calibrated with (the defaults of both scripts).
# Exit code: 0 when every configuration is within 10% on its step time (or rate), else 1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
PROFILE="$PWM_ROOT/results/sim/profile.json"
OUT="$PWM_ROOT/results/sim"  # a folder (--out)
pwm_sim_args 2,11 1 "$@"
[ -f "$PROFILE" ] || { echo "sim_validate.sh: error: no profile $PROFILE: run mpi_scripts/sim_calibrate.sh first" >&2; exit 1; }
pwm_sim_binaries spmd/spmd_train mpmd/pathways_train mpmd/mpmd_train bench/pathways/dispatch_bench bench/model/model_bench sim/pwm_sim
# The speed probe the profile was calibrated with (pwm_step_probe, env.sh: model_bench's step of
# the calibration model).
read -r -a PROBE < <(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])).get("measured", {}).get("speed_probe", {}); print(" ".join(p["model"]) if p.get("kind") == "model_step" else "")' "$PROFILE")
[ ${#PROBE[@]} -gt 0 ] || { echo "sim_validate.sh: error: $PROFILE has no model-step speed probe (an older calibration): rerun mpi_scripts/sim_calibrate.sh" >&2; exit 1; }
CL="$PWM_ROOT/sim/clusters"
# PWM_SIM_KEEP=DIR keeps the raw measurements (traces, metrics, bench JSON) there (pwm_sim_workdir).
# PWM_SIM_REPLAY=DIR predicts a kept validation's measurements again (another profile, a changed
# simulator) without launching anything: its probes, metrics and bench JSON are reused.
pwm_sim_workdir
REPLAY=${PWM_SIM_REPLAY:-}
if [ -n "$REPLAY" ]; then
  [ -f "$REPLAY/list" ] || { echo "sim_validate.sh: error: PWM_SIM_REPLAY=$REPLAY holds no kept validation (no list): keep one with PWM_SIM_KEEP" >&2; exit 1; }
  cp -r "$REPLAY"/. "$W"/
fi
MPI=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD)
STEPS=${PWM_SIM_STEPS:-30}  # as the calibration's: past the Pathways launches' first, unsettled steps
# Each configuration is launched LAUNCHES times and the median launch compared: one launch's
# median step varies from the next by more than 5% on this VM (the "spread" column).
LAUNCHES=${PWM_SIM_LAUNCHES:-5}
# dispatch_bench at T = 0 as the calibration's: DLAUNCHES short launches (the launch varies, not
# the repetition), the lower quartile of the launches (the slow ones come in phases); at T = 100
# and 1000 us LAUNCHES launches, also their lower quartile.
DLAUNCHES=${PWM_SIM_DLAUNCHES:-11}
# The validation model: not the calibration one (other depth, micro-batches and batch).
MOD=(--d-model 128 --layers 4 --heads 2 --head-dim 64 --d-ff 512 --seq-len 64 --batch 8 --peak-gflops 10 --eval-batches 1)
echo -n >"$W/list"
# scaled_profile PROBES OUT [RANKS]: the profile with its costs scaled to the machine's speed at this
# configuration's launches. The VM's speed moves by 20-40% over minutes (docs/simulator_calibration.md,
# "Speed scaling"), so a probe (pwm_core_probes, model_bench's step on core 0 then core 1) runs
# before every launch, as in the calibration: kernels, the optimizer and the controller's costs
# by the rate (calibration / now; a launch of more than one rank at its slower core's). The 2-rank contention factors are the calibration's: a probe of both
# cores (two model_bench processes, then spmd_train --dp 2 for 10 steps) rescaling them made
# the predictions worse, not better (docs/simulator_calibration.md, "Speed scaling").
scaled_profile() {
  python3 "$PWM_ROOT/mpi_scripts/sim_report.py" scale "$PROFILE" "$1" "$2" "${3:-1}"
}
# run NAME NP CLUSTER(-|name) SIMFLAGS -- COMMAND...: one measured configuration.
run() {
  local name=$1 np=$2 cluster=$3; shift 3
  local sim=()
  while [ "$1" != "--" ]; do sim+=("$1"); shift; done
  shift
  echo "== $name" >&2
  local files=() r
  for r in $(seq 1 "$LAUNCHES"); do
    local m="$W/${name}_$r.jsonl"
    if [ -n "$REPLAY" ]; then [ -f "$m" ] && files+=("$m"); continue; fi
    pwm_core_probes "$B/bench/model/model_bench" "${PROBE[@]}" >>"$W/$name.probes"
    if [ "$cluster" = "-" ]; then
      # One rank: on core 0, the core whose speed the probe measures alone.
      local pin=()
      [ "$np" = 1 ] && pin=(taskset -c 0)
      "${pin[@]}" "${MPI[@]}" -n "$np" "$@" --metrics "$m" >"$W/$name.log" 2>&1 || { echo "   failed (see below)" >&2; tail -3 "$W/$name.log" >&2; return 0; }
    else
      local shape=()
      [ "$cluster" = "emu2_shaped" ] && shape=(--dcn-rate "$DCN_RATE")
      [ "$cluster" = "emu2_shaped" ] && [ -n "$DCN_DELAY" ] && shape+=(--dcn-delay "$DCN_DELAY")
      bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 "${shape[@]}" --timeout 600 -- \
        bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n "$np" "$@" --metrics "$m" >"$W/$name.log" 2>&1 ||
        { echo "   failed or skipped (emulated hosts need root)" >&2; tail -2 "$W/$name.log" >&2; return 0; }
    fi
    files+=("$m")
  done
  [ "$cluster" = "-" ] || sim+=(--cluster "$CL/$cluster.json")
  # moe_*: the device imbalance the launches' router produced (dropless rows compute and send the
  # busiest device's rows; a capacity's are fixed): the simulator costs routing, not predicts it.
  [[ $name == moe_* ]] && sim+=(--moe-imbalance "$(python3 "$PWM_ROOT/mpi_scripts/sim_report.py" imbalance "${files[@]}")")
  scaled_profile "$W/$name.probes" "$W/$name.profile.json" "$np"
  "$B/sim/pwm_sim" --profile "$W/$name.profile.json" "${sim[@]}" >"$W/$name.pred"
  echo "$name $W/$name.pred ${files[*]}" >>"$W/list"
}
SP="$B/spmd/spmd_train" PW="$B/mpmd/pathways_train" ST="$B/mpmd/mpmd_train"
run spmd_dp1 1 - --what step "${MOD[@]}" --microbatches 2 -- "$SP" "${MOD[@]}" --microbatches 2 --steps $STEPS
run spmd_dp2 2 - --what step "${MOD[@]}" --dp 2 -- "$SP" "${MOD[@]}" --dp 2 --steps $STEPS
run fused_dp2 3 - --what step --granularity fused "${MOD[@]}" --dp 2 -- "$PW" "${MOD[@]}" --dp 2 --granularity fused --steps $STEPS
if [ $QUICK = 0 ]; then
  run spmd_dp2_m2_nooverlap 2 - --what step "${MOD[@]}" --dp 2 --microbatches 2 --no-overlap -- \
    "$SP" "${MOD[@]}" --dp 2 --microbatches 2 --no-overlap --steps $STEPS
  run chained_dp2 3 - --what step --granularity chained "${MOD[@]}" --dp 2 -- "$PW" "${MOD[@]}" --dp 2 --granularity chained --steps $STEPS
  run opbyop_dp2 3 - --what step --granularity opbyop "${MOD[@]}" --dp 2 -- "$PW" "${MOD[@]}" --dp 2 --granularity opbyop --steps $STEPS
  run pipeline_s2_m4 3 - --what pipeline --stages 2 --schedule 1f1b "${MOD[@]}" --microbatches 4 -- \
    "$PW" "${MOD[@]}" --stages 2 --islands 2x1 --microbatches 4 --schedule 1f1b --steps $STEPS
  # The static model (mpmd_train): two processes, no controller.
  run static_fused_dp2 2 - --what step --mpmd static --granularity fused "${MOD[@]}" --dp 2 -- \
    "$ST" "${MOD[@]}" --dp 2 --granularity fused --steps $STEPS
  run static_chained_dp2 2 - --what step --mpmd static --granularity chained "${MOD[@]}" --dp 2 -- \
    "$ST" "${MOD[@]}" --dp 2 --granularity chained --steps $STEPS
  run static_pipeline_s2_m4 2 - --what pipeline --mpmd static --stages 2 --schedule 1f1b "${MOD[@]}" --microbatches 4 -- \
    "$ST" "${MOD[@]}" --stages 2 --microbatches 4 --schedule 1f1b --steps $STEPS
fi
if [ $HOSTS = 1 ]; then
  [ $QUICK = 0 ] && run spmd_dp2_hosts2 2 emu2 --what step "${MOD[@]}" --dp 2 -- "$SP" "${MOD[@]}" --dp 2 --steps $STEPS
  run spmd_dp2_hosts2_shaped 2 emu2_shaped --what step "${MOD[@]}" --dp 2 -- "$SP" "${MOD[@]}" --dp 2 --steps $STEPS
fi
# Rows the simulator was never fitted to (docs/simulator_calibration.md, "Rows it was not fitted
# to"), each configuration launched SLAUNCHES times (a launch of the largest takes ~25 s). Default 5,
# as the other rows: the range of 3 launches holds their median with a chance of 75% (1 - 2/2^3),
# of 5 94%, and these rows' launches spread 11-33% on a Zen 5 (docs/results/simulator.md, 2026-12-07).
SLAUNCHES=${PWM_SIM_SIZE_LAUNCHES:-5}
if [ $QUICK = 0 ]; then
  # size_*: the presets' shapes (train/presets.cc; up to GPT-2 small's) from the profile of the
  # 2-layer d-model 128 calibration model and the reference model's kernels (the width factor).
  # One micro-batch of 512 tokens (the calibration's largest kernel), few steps: the step's median
  # passes the first step's allocation.
  SZ=(--peak-gflops 10 --eval-batches 1)
  LAUNCHES=$SLAUNCHES run size_4m_dp1 1 - --what step --preset 4m --batch 4 -- "$SP" --preset 4m --batch 4 --steps 12 "${SZ[@]}"
  LAUNCHES=$SLAUNCHES run size_30m_dp1 1 - --what step --preset 30m --batch 2 -- "$SP" --preset 30m --batch 2 --steps 7 "${SZ[@]}"
  LAUNCHES=$SLAUNCHES run size_30m_dp2 2 - --what step --preset 30m --batch 4 --dp 2 -- "$SP" --preset 30m --batch 4 --dp 2 --steps 7 "${SZ[@]}"
  LAUNCHES=$SLAUNCHES run size_100m_dp1 1 - --what step --preset 100m --batch 1 -- "$SP" --preset 100m --batch 1 --steps 5 "${SZ[@]}"
  # moe_*: compare.sh --moe's rows at router skew 0 (the reference model, E = 4, top-2, an MoE layer
  # every 2nd block, expert-parallel over dp 2, 8 sequences per rank): SPMD under a capacity of
  # 1.25 and dropless; Pathways chained with the static (capacity), controller and worker
  # (dropless) routings. Each predicted at the device imbalance its launches measured (run above).
  MOE=(--preset 4m --batch 16 --dp 2 --experts 4 --top-k 2 --moe-every 2 --expert-parallel 2 --router-skew 0)
  for v in "spmd_capacity spmd --capacity-factor 1.25" "spmd_dropless spmd --capacity-factor 0" \
           "pw_static chained --capacity-factor 1.25 --moe-routing static" "pw_controller chained --capacity-factor 0 --moe-routing controller" \
           "pw_worker chained --capacity-factor 0 --moe-routing worker"; do
    read -r name g flags <<<"$v"
    if [ "$g" = spmd ]; then bin=$SP np=2 gflag=(); else bin=$PW np=3 gflag=(--granularity chained); fi
    # shellcheck disable=SC2086  # flags: the variant's words
    LAUNCHES=$SLAUNCHES run "moe_$name" $np - --what step "${MOE[@]}" "${gflag[@]}" $flags -- \
      "$bin" "${MOE[@]}" "${gflag[@]}" $flags --steps 12 "${SZ[@]}"
  done
  # goodput_*: a short failure_bench.sh (spmd_train dp 2 at batch 8, a SIGKILL every ~6 s on
  # average, a checkpoint every 5 steps) against the goodput model (sim/project_goodput.py) at that
  # run's own step, restart and detection times. Its own build check (pwm_build) runs first.
  echo "== goodput_spmd (failure_bench.sh)" >&2
  [ -n "$REPLAY" ] || bash "$PWM_ROOT/mpi_scripts/failure_bench.sh" --models spmd --steps 40 --mtbf 6 --ckpt-every 5 --seed 3 --out "$W/goodput" \
    -- --batch 8 >"$W/goodput.log" 2>&1 || { echo "   failed (see below)" >&2; tail -3 "$W/goodput.log" >&2; }
fi
# dispatch_bench Fig. 5 points (2 workers): computations per second per mode.
if [ $QUICK = 0 ] && [ -z "$REPLAY" ]; then
  echo "== dispatch_bench fig 5" >&2
  # Pinned as the calibration's (PWM_MPIRUN_PIN_FLAGS); T = 0 the best of 60 repetitions as
  # there (~2 s a launch), T = 100 and 1000 us of 3 (~13 and ~130 ms each; that launch's own
  # T = 0 rows only give dispatch_bench the effective compute, and are not compared).
  DMPI=("$PWM_MPIRUN" $PWM_MPIRUN_PIN_FLAGS $PWM_MPIRUN_YIELD)
  for r in $(seq 1 "$DLAUNCHES"); do
    pwm_step_probe "$B/bench/model/model_bench" "${PROBE[@]}" >>"$W/dispatch.probes"
    "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" --figs 5 --compute-us 0 --reps 60 --json "$W/dispatch_0_$r.json" >/dev/null 2>&1 || echo "   dispatch_bench failed" >&2
  done
  for r in $(seq 1 "$LAUNCHES"); do
    "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" --figs 5 --compute-us 0,100,1000 --reps 3 --json "$W/dispatch_T_$r.json" >/dev/null 2>&1 || echo "   dispatch_bench failed" >&2
  done
fi
[ $QUICK = 0 ] && [ -f "$W/dispatch.probes" ] && scaled_profile "$W/dispatch.probes" "$W/dispatch.profile.json"
mkdir -p "$OUT"
python3 "$PWM_ROOT/mpi_scripts/sim_report.py" report "$W" "$OUT" "$PROFILE" "$B/sim/pwm_sim"
