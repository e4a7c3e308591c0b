#!/usr/bin/env bash
# Measures this machine for the simulator (docs/simulator_calibration.md) and writes a profile (JSON):
#   kernels   spmd_train --trace at dp 1 (the forward/backward/optimizer spans per GFLOP; the
#             reference model's against them: the width factor) and at dp 2 (the slowdown when
#             two ranks share the cores: "contention")
#   links     collectives_bench AllReduce of 2 ranks (ring and hd, the faster per size): in one
#             host (shared memory), across two emulated hosts (mpi_scripts/cluster.sh, TCP)
#             unshaped and with a shaped DCN; the emulated network's CPU per byte from
#             spmd_train dp 2 across the hosts vs in one
#   dispatch  dispatch_bench Fig. 5 with 1 and 2 workers (controller costs per call, node,
#             worker message; the fetch round trip; the SPMD loop's own cost)
#   static    mpmd_train dp 2 chained at 1 and 2 micro-batches (the static model's executor cost
#             per node and its per-step constant)
#
#   mpi_scripts/sim_calibrate.sh [--out results/sim/profile.json] [--quick] [--no-hosts]
#                                [--dcn-rate 200mbit] [--dcn-delay D (needs sch_netem)]
# Binaries come from $BUILD_DIR (mpi_scripts/env.sh; build spmd_train pathways_train mpmd_train
# collectives_bench dispatch_bench model_bench pwm_sim_cli first). Without root (no emulated hosts) the cross-host links are
# left at the in-host ones and the profile says so. Takes ~4 minutes (--quick: ~1); PWM_SIM_LAUNCHES
# (default 5) launches of each configuration, PWM_SIM_DLAUNCHES (default 11) of dispatch_bench.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
OUT="$PWM_ROOT/results/sim/profile.json"
pwm_sim_args 2,17 0 "$@"
pwm_sim_binaries spmd/spmd_train mpmd/pathways_train mpmd/mpmd_train bench/collectives/collectives_bench bench/pathways/dispatch_bench bench/model/model_bench sim/pwm_sim
# PWM_SIM_KEEP=DIR keeps the raw measurements (traces, metrics, bench JSON) there (pwm_sim_workdir).
pwm_sim_workdir
MPI=("$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $PWM_MPIRUN_YIELD)
# 30 steps: a Pathways launch takes 4-6 steps to settle (one chained launch: 84, 22, 21, 16, 18,
# 28 and then 8 ms steps; fresh buffers and the completion predictor's first runs are likely, not
# measured), and the median of 10 steps fell between the two regimes, 8.7 or 19.2 ms by launch.
STEPS=${PWM_SIM_STEPS:-30}; ITERS=30; DREPS=60; LAUNCHES=${PWM_SIM_LAUNCHES:-5}; DLAUNCHES=${PWM_SIM_DLAUNCHES:-11}
[ $QUICK = 1 ] && { STEPS=6; ITERS=10; DREPS=10; LAUNCHES=1; DLAUNCHES=1; }
# dispatch_bench at T = 0: DLAUNCHES launches of the best of DREPS repetitions (~2 s each), the
# lower quartile of the launches (the 3rd fastest of 11). What varies is the launch, not the
# repetition: a launch's best of 300 spread as much between launches as its best of 30 (spmd
# 0.65-1.48 us over 24 launches of chain 64), so the launches are many and short; and the slow
# launches come in phases, so their median moved by 48% between blocks of 11 launches run back to
# back where the lower quartile moved by 15% (docs/simulator_calibration.md, "The T = 0 rows").
# dispatch_bench calibrates on chains of DCHAIN and DCHAIN2 computations (2 workers; 1 worker at
# DCHAIN only), the validation runs its default 128: between the two, not at either. One chain
# length put the validation's T = 0 rows 10-16% off in one direction for a whole phase (the
# per-computation times do not follow the model's a + b / k from one k: OpByOp's grows from 64
# to 256; docs/simulator_calibration.md, "The T = 0 rows").
DCHAIN=64 DCHAIN2=256
# The calibration model (the validation uses other shapes, sim_validate.sh).
CAL=(--d-model 128 --layers 2 --heads 2 --head-dim 64 --d-ff 512 --seq-len 64 --batch 8 --peak-gflops 10 --eval-batches 1)
# The reference model (train/presets.cc's 4m, spelled out: the fit reads its width) at the
# calibration's largest kernel, 512 tokens: its rate against the calibration model's at one
# micro-batch is the kernels' width factor (Profile::width_scales). d-model 128's rate alone put
# the one-rank size_* rows (d-model 256-768, 512 tokens) 3-12% slow on a Zen 5 in every run
# (docs/results/simulator.md, 2026-12-07): wider matrices run nearer the core's peak.
WIDE=(--d-model 256 --layers 4 --heads 4 --head-dim 64 --d-ff 1024 --seq-len 128 --batch 4 --peak-gflops 10 --eval-batches 1)
# The speed probe (pwm_step_probe, env.sh): model_bench's step of the calibration model. The
# profile records these flags, and sim_validate.sh probes with them.
PROBE=(--d-model 128 --layers 2 --heads 2 --head-dim 64 --d-ff 512 --seq 64 --batch 8)

# Every trainer configuration is launched LAUNCHES times and its median taken: one launch's
# step_ms_p50 varies by 5-20% from the next on this VM (page placement, the scheduler), more
# than the steps of one launch do.
echo "== kernels: spmd_train dp 1 at 1, 2 and 4 micro-batches, the reference model, and dp 2 (${CAL[*]}; $LAUNCHES launches each)" >&2
# The machine's speed right before each trainer launch (pwm_step_probe, env.sh), in NAME.probe
# beside the launch's files and in `probes`: the profile keeps their median as its reference, every
# launch is brought to it by its own probe (sim_fit.py, Measurements.factor), and sim_validate.sh
# scales the profile to the speed at its own launches. One-rank launches run on core 0, whose
# speed the first probe measures (this VM's two vCPUs differ, by turns); launches of more ranks
# go at the slower core's (pwm_core_probes). The speed moves within seconds: a probe per round of
# launches missed a launch slowed 40% beside its round's probe.
probe() { pwm_core_probes "$B/bench/model/model_bench" "${PROBE[@]}" | tee -a "$W/probes" >"$W/$1.probe"; }
# kernels NAME_r MODEL_FLAGS...: one rank on core 0, traced; its kernels' costs in k<NAME>_r.json.
kernels() {
  local n=$1; shift
  probe "m$n"
  taskset -c 0 "${MPI[@]}" -n 1 "$B/spmd/spmd_train" "$@" --steps $STEPS --trace "$W/t$n.json" --metrics "$W/m$n.jsonl" >/dev/null
  "$B/sim/pwm_sim" --what kernels "$@" --sim-trace "$W/t$n.json" --sim-metrics "$W/m$n.jsonl" >"$W/k$n.json"
}
for r in $(seq 1 $LAUNCHES); do
  kernels "1_1_$r" "${CAL[@]}" --microbatches 1
  # The reference model at the same tokens a kernel, right after (paired): the rates' width factor.
  kernels "w_$r" "${WIDE[@]}"
  for mb in 2 4; do kernels "1_${mb}_$r" "${CAL[@]}" --microbatches $mb; done
  probe "m2_$r"
  "${MPI[@]}" -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/m2_$r.jsonl" >/dev/null
done

echo "== kernels: pathways_train dp 2, fused, chained and opbyop (the trainers' per-step, per-node and per-call costs)" >&2
for r in $(seq 1 $LAUNCHES); do
  for v in "mf --granularity fused" "mfs --batch 4 --granularity fused" "mc --granularity chained" \
           "mc2 --granularity chained --microbatches 2" "mo --granularity opbyop"; do
    read -r pre flags <<<"$v"
    probe "${pre}_$r"
    # shellcheck disable=SC2086  # flags: the variant's words
    "${MPI[@]}" -n 3 "$B/mpmd/pathways_train" "${CAL[@]}" --dp 2 $flags --steps $STEPS --metrics "$W/${pre}_$r.jsonl" >/dev/null
  done
done

echo "== kernels: mpmd_train dp 2 chained at 1 and 2 micro-batches (the static model's per-node and per-step costs)" >&2
# As the Pathways chained pair above: the units' nodes double, the compute stays; two processes on
# the two cores (no controller), so the 2-rank contention factor applies.
for r in $(seq 1 $LAUNCHES); do
  probe "ms_$r"
  "${MPI[@]}" -n 2 "$B/mpmd/mpmd_train" "${CAL[@]}" --dp 2 --granularity chained --steps $STEPS --metrics "$W/ms_$r.jsonl" >/dev/null
  probe "ms2_$r"
  "${MPI[@]}" -n 2 "$B/mpmd/mpmd_train" "${CAL[@]}" --dp 2 --granularity chained --microbatches 2 --steps $STEPS --metrics "$W/ms2_$r.jsonl" >/dev/null
done

# Dispatch before the emulated hosts: tearing their namespaces down keeps the cores busy for a
# while, which the microsecond costs at T = 0 would take in.
echo "== dispatch: dispatch_bench Fig. 5, 1 and 2 workers, chains of $DCHAIN and $DCHAIN2 ($DLAUNCHES launches each)" >&2
# Ranks pinned (PWM_MPIRUN_PIN_FLAGS, as sim_validate.sh's dispatch launches): unpinned, one
# command's per-computation times at T = 0 spread 2x between launches (docs/simulator_calibration.md,
# "Pinned dispatch launches").
DB=(--figs 5 --compute-us 0 --reps $DREPS)
DMPI=("$PWM_MPIRUN" $PWM_MPIRUN_PIN_FLAGS $PWM_MPIRUN_YIELD)
for r in $(seq 1 $DLAUNCHES); do
  "${DMPI[@]}" -n 2 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN --json "$W/d1_$r.json" >/dev/null
  "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN --json "$W/d2_$r.json" >/dev/null
  "${DMPI[@]}" -n 3 "$B/bench/pathways/dispatch_bench" "${DB[@]}" --chain $DCHAIN2 --json "$W/d3_$r.json" >/dev/null
done

COLL=(-b 4 -e 16M -f 4 --algo ring,hd,auto -n $ITERS -w 3)
echo "== links: collectives_bench, 2 ranks in one host" >&2
"${MPI[@]}" -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_intra.json" >/dev/null
CLUSTER_NOTE="none"
if [ $HOSTS = 1 ]; then
  echo "== links: collectives_bench, 2 emulated hosts, unshaped and shaped (${DCN_RATE}${DCN_DELAY:+, $DCN_DELAY})" >&2
  SHAPE=(--dcn-rate "$DCN_RATE")
  [ -n "$DCN_DELAY" ] && SHAPE+=(--dcn-delay "$DCN_DELAY")
  if bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 --timeout 600 -- \
       bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_inter.json" >/dev/null; then
    CLUSTER_NOTE="2 hosts unshaped"
    # The emulated network's CPU (Link::cpu_ns_per_byte): the calibration model's dp 2 step
    # across the two hosts, each launch beside the same step in one host (paired, so the VM's
    # drift over the run cancels).
    for r in $(seq 1 $LAUNCHES); do
      "${MPI[@]}" -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/m2b_$r.jsonl" >/dev/null
      bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 --timeout 600 -- \
        bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/spmd/spmd_train" "${CAL[@]}" --dp 2 --steps $STEPS --metrics "$W/mh_$r.jsonl" >/dev/null
    done
    if bash "$PWM_ROOT/mpi_scripts/cluster.sh" run --hosts 2 --slots 1 "${SHAPE[@]}" --timeout 600 -- \
         bash -c '$PWM_CLUSTER_MPIRUN "$@"' _ -n 2 "$B/bench/collectives/collectives_bench" "${COLL[@]}" --json "$W/c_shaped.json" >/dev/null; then
      CLUSTER_NOTE="$CLUSTER_NOTE; shaped: ${SHAPE[*]}"
    else
      echo "sim_calibrate.sh: the shaped run failed: inter_shaped = inter" >&2
    fi
  else
    echo "sim_calibrate.sh: emulated hosts unavailable: cross-host links = in-host ones" >&2
  fi
fi

mkdir -p "$(dirname "$OUT")"
PWM_PROBE="${PROBE[*]}" PWM_WIDE="${WIDE[*]}" PWM_EMU2="$PWM_ROOT/sim/clusters/emu2.json" python3 "$PWM_ROOT/mpi_scripts/sim_fit.py" "$W" "$OUT" "$CLUSTER_NOTE" "$B/sim/pwm_sim" "$LAUNCHES" "$DCHAIN" "$DCHAIN2" "$DLAUNCHES" "${CAL[@]}"
echo "wrote $OUT" >&2
