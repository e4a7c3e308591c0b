#!/usr/bin/env bash
# The suite under sanitizers, and the fuzz targets (docs/sanitizers.md).
#   mpi_scripts/sanitize.sh [asan] [tsan] [fuzz] [-- CTEST_ARGS...]     (no pass named: all three)
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/), the whole suite
#   tsan  ThreadSanitizer build (build-tsan/), the pathways labels (pathways, pathways_train)
#   fuzz  the libFuzzer build (build-fuzz/, clang, ASan + UBSan): each target FUZZ_SECONDS
#         (default 60) from its seeds and regressions; a finding is left in build-fuzz/findings/
# CTEST_ARGS replace a pass's default test selection (e.g. `asan -- -L model`);
# PWM_SAN_TARGETS="t1 t2" builds only those targets (CI builds what its subset runs).
# The reports' options and the suppressions (tests/sanitizers/*.supp, OpenMPI's own internals
# only) reach every rank: mpirun passes its environment to the ranks it starts on its host
# (OpenMPI and MPICH alike). The MPI library is OpenMPI unless PWM_MPI=mpich.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

passes=() ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    asan|tsan|fuzz) passes+=("$1") ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "pathways-mpi: error: sanitize.sh: unknown pass '$1' (asan, tsan, fuzz; ctest arguments after --)" >&2
       exit 2 ;;
  esac
  shift
done
[ ${#passes[@]} -gt 0 ] || passes=(asan tsan fuzz)
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"

SUPP="$PWM_ROOT/tests/sanitizers"
# fast_unwind_on_malloc=0: the slow unwinder reaches the frames of OpenMPI (built without frame
# pointers), which the leak suppressions match. halt_on_error: the first UBSan report fails the
# test (UBSan only warns by default).
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="suppressions=$SUPP/tsan.supp:print_suppressions=0:second_deadlock_stack=1:history_size=4"

pwm_install_deps

declare -A seconds
timed() {  # timed NAME COMMAND...: runs COMMAND, records its wall time under NAME
  local name=$1 t0=$SECONDS; shift
  "$@"
  seconds[$name]=$((SECONDS - t0))
}

# san_build DIR SANITIZERS [cmake args...]: configure once, then build PWM_SAN_TARGETS (or all).
san_build() {
  local dir=$1 san=$2; shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S "$PWM_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPWM_SANITIZE="$san" \
          -DMPI_CXX_COMPILER="$PWM_MPICXX" -DMPIEXEC_EXECUTABLE="$PWM_MPIRUN" "$@" >/dev/null
  fi
  # shellcheck disable=SC2086
  cmake --build "$dir" -j "$(nproc)" ${PWM_SAN_TARGETS:+--target $PWM_SAN_TARGETS}
}

san_ctest() {  # san_ctest DIR DEFAULT_ARGS...: the suite, or CTEST_ARGS when given
  local dir=$1; shift
  [ ${#ctest_args[@]} -gt 0 ] && set -- "${ctest_args[@]}"
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j "$(pwm_test_jobs)" "$@")
}

sfx=""; [ "$PWM_MPI" = mpich ] && sfx="-mpich"

pass_asan() {
  timed asan-build san_build "$PWM_ROOT/build-asan$sfx" address,undefined
  timed asan-test san_ctest "$PWM_ROOT/build-asan$sfx"
}

pass_tsan() {
  # What the pathways labels run, unless PWM_SAN_TARGETS says otherwise.
  PWM_SAN_TARGETS="${PWM_SAN_TARGETS:-pathways_unit_tests pathways_mpi_tests dispatch_bench fuzz_wire_replay
    pathways_train_inproc_tests pathways_train_mpi_tests pathways_train spmd_train}" \
    timed tsan-build san_build "$PWM_ROOT/build-tsan$sfx" thread
  timed tsan-test san_ctest "$PWM_ROOT/build-tsan$sfx" -L pathways
}

pass_fuzz() {
  local dir="$PWM_ROOT/build-fuzz$sfx" t t0
  local targets=(wire checkpoint config)
  pwm_install_packages clang libclang-rt-14-dev  # Debian 12's clang and its libFuzzer
  PWM_SAN_TARGETS="$(printf 'fuzz_%s fuzz_%s_replay ' "${targets[@]}" "${targets[@]}")" \
    timed fuzz-build san_build "$dir" address,undefined -DCMAKE_CXX_COMPILER=clang++ -DPWM_FUZZ=ON
  mkdir -p "$dir/findings"
  for t in "${targets[@]}"; do
    "$dir/tests/fuzz/fuzz_${t}_replay" --write-seeds "$dir/corpus/$t" >/dev/null
    t0=$SECONDS
    # -timeout: an input that takes 10 s is a finding (a hang); -rss_limit_mb: so is one that
    # makes a reader allocate 2 GB. New inputs go to the first corpus folder (build-fuzz/).
    if ! "$dir/tests/fuzz/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
           -print_final_stats=1 -artifact_prefix="$dir/findings/$t-" \
           "$dir/corpus/$t" "$PWM_ROOT/tests/fuzz/regressions/$t" >"$dir/findings/$t.log" 2>&1; then
      tail -n 60 "$dir/findings/$t.log" >&2
      echo "pathways-mpi: error: fuzz_$t found an input that fails (saved in $dir/findings/, the" \
           "log in $dir/findings/$t.log): fix it and add the input to tests/fuzz/regressions/$t/" >&2
      exit 1
    fi
    seconds[fuzz-$t]=$((SECONDS - t0))
    echo "fuzz_$t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/findings/$t.log" | grep -o '[0-9]*$') inputs in ${seconds[fuzz-$t]} s, no finding"
  done
}

for p in "${passes[@]}"; do "pass_$p"; done
echo "sanitize.sh: passed (${passes[*]}); wall seconds:"
for k in "${!seconds[@]}"; do echo "  $k ${seconds[$k]}"; done | sort
