#!/usr/bin/env bash
# README's second command: install what is missing, build what is stale, run the whole suite.
# Extra arguments go to ctest (e.g. -R collectives, -L mpi). `--build-only` (first argument):
# install and build, run nothing (CI builds the next configuration while a pass runs its tests).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
build_only=0
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi
pwm_install_deps
pwm_build
[ "$build_only" = 1 ] && exit 0
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 "$@"
