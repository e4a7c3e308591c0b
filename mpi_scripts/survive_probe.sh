#!/usr/bin/env bash
# Can a job outlive one of its ranks under this MPI (issue 38; docs/failures.md, "What the MPI
# libraries here allow")? Runs collectives/tools/survive_probe (3 ranks; rank 2 SIGKILLs itself
# in round 5, rank 0 goes on with rank 1 after noticing by its own timeout) under the launcher
# with each set of options that could keep the job alive, and prints one line per set: whether
# the survivors went on (and how many of the 19 exchanges after the loss they made), whether
# MPI_Finalize returned, the launcher's exit code, and its seconds (limit 60 s).
#
#   mpi_scripts/survive_probe.sh          (PWM_MPI=mpich for MPICH's Hydra)
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
[ $# -eq 0 ] || { echo "survive_probe.sh: error: no arguments (PWM_MPI=openmpi|mpich picks the MPI)" >&2; exit 2; }
pwm_install_deps
pwm_build >/dev/null
probe="$BUILD_DIR/collectives/survive_probe"
if [ "$PWM_MPI" = openmpi ]; then
  sets=("" "--enable-recovery" "--mca orte_abort_on_non_zero_status 0" "--enable-recovery --mca btl tcp,self")
else
  sets=("" "-disable-auto-cleanup")
fi
echo "survive_probe: $PWM_MPI ($("$PWM_MPIRUN" --version 2>&1 | grep -m1 -iE 'version|openrte' | sed 's/^ *//'))"
for s in "${sets[@]}"; do
  t0=$SECONDS
  # shellcheck disable=SC2086  # (the option sets are words)
  rc=0
  out=$(timeout 60 "$PWM_MPIRUN" $PWM_MPIRUN_FLAGS $s -n 3 "$probe" 2>&1) || rc=$?
  line=$(grep -m1 '^survived:' <<<"$out" || echo "the job ended before rank 0 finished")
  fin=$(grep -q 'MPI_Finalize returned' <<<"$out" && echo "MPI_Finalize returned" || echo "no MPI_Finalize")
  [ $rc = 124 ] && fin="$fin; the launcher hung (killed after 60 s)"
  printf '%-45s %s; %s; exit %s, %s s\n' "${s:-(defaults)}" "$line" "$fin" "$rc" "$((SECONDS - t0))"
done
