#!/usr/bin/env bash
# expect_failure.sh SECONDS REGEX -- COMMAND...
# Passes when COMMAND exits non-zero within SECONDS (a hang fails) and its output matches REGEX.
set -u
secs=$1; regex=$2; shift 3
out=$(timeout --kill-after=5 "$secs" "$@" 2>&1); rc=$?
echo "$out" | tail -n 30
if [ $rc -eq 0 ]; then echo "expect_failure: command succeeded but should have failed"; exit 1; fi
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "expect_failure: command hung (killed after ${secs}s)"; exit 1; fi
if ! echo "$out" | grep -Eq -- "$regex"; then echo "expect_failure: output does not match /$regex/"; exit 1; fi
echo "expect_failure: failed as expected (exit $rc)"
