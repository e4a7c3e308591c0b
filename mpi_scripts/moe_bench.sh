#!/usr/bin/env bash
# Mixture of Experts against the dense model with the same active FLOPs per token (issue 36):
# top-1, E experts of the dense model's d_ff split over P = 2 ranks (--expert-parallel 2), dropless
# and at capacity 1.25, against the dense model, all spmd_train at --dp 2 on the reference config.
# Top-1 routes each token through one expert MLP of the dense MLP's size, so the active FLOPs per
# token are the dense model's plus the router's (E x C per token); what the MoE runs pay beyond
# that (router, dispatch, AllToAll, padding rows computed, waiting for the busier rank) is the
# overhead the ratio measures.
# Rounds alternate the candidates' order (ABC, CBA, ...); each run's figure is its median step
# tokens/s over the steps after WARM (every candidate the same window); each ratio is the median
# over rounds of the round's MoE / dense, printed with the rounds' range. Why a warm-up of 10
# steps: at initialization the router sends the tokens unevenly (the load-balancing loss is ~1.3,
# 1 being even), and dropless expert parallelism waits at every AllToAll for the rank whose
# experts got more rows; the aux loss evens the load within ~10 steps (docs/results/moe.md), and a
# training run spends nearly all its steps there. Writes results/moe_bench.json.
# Usage: mpi_scripts/moe_bench.sh [ROUNDS] [STEPS] [WARM]   (PWM_MOE_EXPERTS=4, PWM_MOE_FLAGS=extra flags)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ROUNDS="${1:-3}"
STEPS="${2:-30}"
WARM="${3:-10}"
E="${PWM_MOE_EXPERTS:-4}"
pwm_count moe_bench.sh ROUNDS "$ROUNDS"; pwm_count moe_bench.sh STEPS "$STEPS" 2; pwm_count moe_bench.sh WARM "$WARM" 0
pwm_count moe_bench.sh PWM_MOE_EXPERTS "$E" 2 4096
[ "$WARM" -lt "$STEPS" ] || { echo "moe_bench.sh: error: WARM ($WARM) must be below STEPS ($STEPS): no step would be measured" >&2; exit 2; }
pwm_install_deps
pwm_build >/dev/null
pwm_warn_if_busy
OUT="$PWM_ROOT/results"; mkdir -p "$OUT"
TRAIN="$BUILD_DIR/spmd/spmd_train"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
COMMON=(--dp 2 --batch 16 --steps "$STEPS" --log-every 1000 --eval-batches 1 ${PWM_MOE_FLAGS:-})
declare -A FLAGS=(
  [dense]=""
  [dropless]="--experts $E --top-k 1 --expert-parallel 2 --capacity-factor 0"
  [capacity]="--experts $E --top-k 1 --expert-parallel 2 --capacity-factor 1.25"
)
ORDER=(dense dropless capacity)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc --all) cores); $ROUNDS rounds of ${ORDER[*]}, $STEPS steps each, measured after step $WARM"
for name in "${ORDER[@]}"; do
  echo "\$ $PWM_MPIRUN $PWM_MPIRUN_FLAGS -n 2 $TRAIN ${COMMON[*]} ${FLAGS[$name]} --metrics $OUT/moe_<round>_$name.jsonl"
done
for ((r = 0; r < ROUNDS; r++)); do
  order=("${ORDER[@]}")
  if ((r % 2)); then order=(capacity dropless dense); fi
  for name in "${order[@]}"; do
    # shellcheck disable=SC2086
    "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n 2 "$TRAIN" "${COMMON[@]}" ${FLAGS[$name]} \
      --metrics "$OUT/moe_${r}_$name.jsonl" >/dev/null
  done
  echo "round $((r + 1))/$ROUNDS done"
done
python3 "$PWM_ROOT/mpi_scripts/moe_report.py" "$OUT" "$ROUNDS" "$WARM" "${ORDER[@]}"
