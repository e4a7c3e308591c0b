#!/usr/bin/env bash
# README's second command: install what is missing, build what is stale, run the whole suite.
# Extra arguments go to ctest (e.g. -R collectives, -L mpi). Cases run in parallel, -j
# $(pwm_test_jobs) rank slots (PWM_TEST_JOBS=1 runs them one at a time).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
pwm_install_deps
pwm_build
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 -j "$(pwm_test_jobs)" "$@"
