# Sourced by the other scripts: installs what is missing, configures and builds what is stale.
# Variables: PWM_MPI=openmpi (default) | mpich picks the MPI library (Debian's packages; both can
# be installed side by side); BUILD_DIR (default build/ for OpenMPI, build-mpich/ for MPICH);
# PWM_PORTABLE=1 for a build without -march=native.
# Sets PWM_MPIRUN (the launcher of the chosen library) and PWM_MPIRUN_FLAGS; scripts launch
# with `"$PWM_MPIRUN" $PWM_MPIRUN_FLAGS -n N ... $(pwm_mpirun_env VAR=VALUE)`.
set -euo pipefail

PWM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PWM_MPI="${PWM_MPI:-openmpi}"

# OpenMPI refuses to run as root without these; harmless otherwise (MPICH ignores them).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Quiet OpenMPI's warnings about missing high-speed NICs on laptops/containers.
export OMPI_MCA_btl_base_warn_component_unused=0

# Debian packages the project needs (names checked on Debian 12 / Ubuntu 22.04+).
# ocl-icd-opencl-dev: Debian's oneDNN CMake package requires OpenCL (find_package(OpenCL REQUIRED)
# in dnnl-config.cmake, a hard configure error without it), and --no-install-recommends skips it.
PWM_PACKAGES=(cmake ninja-build g++ make libeigen3-dev libfmt-dev
              libgtest-dev libcli11-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev gnuplot-nox
              python3 ccache)
case "$PWM_MPI" in
  openmpi)
    BUILD_DIR="${BUILD_DIR:-$PWM_ROOT/build}"
    PWM_PACKAGES+=(openmpi-bin libopenmpi-dev)
    PWM_MPICXX=/usr/bin/mpicxx.openmpi
    PWM_MPIRUN=/usr/bin/mpirun.openmpi
    # --oversubscribe: more ranks than cores; --bind-to none: OpenMPI binds to cores by default.
    PWM_MPIRUN_FLAGS="--oversubscribe --bind-to none"
    PWM_MPIRUN_PIN_FLAGS="--oversubscribe --bind-to core:overload-allowed --map-by core"
    PWM_MPIRUN_YIELD="--mca mpi_yield_when_idle 1" ;;
  mpich)
    BUILD_DIR="${BUILD_DIR:-$PWM_ROOT/build-mpich}"
    PWM_PACKAGES+=(mpich libmpich-dev)
    PWM_MPICXX=/usr/bin/mpicxx.mpich
    PWM_MPIRUN=/usr/bin/mpiexec.mpich
    PWM_MPIRUN_FLAGS=""  # Hydra oversubscribes and leaves ranks unbound by default
    PWM_MPIRUN_PIN_FLAGS="-bind-to core"
    PWM_MPIRUN_YIELD="" ;;
  *) echo "pathways-mpi: error: PWM_MPI='$PWM_MPI' is not a supported MPI library; use PWM_MPI=openmpi or PWM_MPI=mpich" >&2
     exit 2 ;;
esac
# PWM_MPIRUN_PIN_FLAGS: the same launch with rank i pinned to core i mod cores (ranks beyond the
# cores share them), for measurements that should not depend on where the scheduler puts ranks:
# the simulator scripts' dispatch_bench runs, whose microseconds at T = 0 spread 2x between
# unpinned launches of 3 ranks on 2 cores (docs/simulator_calibration.md, "Pinned dispatch launches").
# PWM_MPIRUN_YIELD: the flags that make a waiting rank yield its core instead of busy-polling,
# for measurements whose ranks share cores (OpenMPI's mpi_yield_when_idle; none for Hydra).
export PWM_MPIRUN PWM_MPIRUN_FLAGS PWM_MPIRUN_PIN_FLAGS PWM_MPIRUN_YIELD

# pwm_mpirun_env VAR=VALUE...: launcher flags that set VAR on every rank (-x for OpenMPI,
# -genv for MPICH's Hydra).
pwm_mpirun_env() {
  local kv
  for kv in "$@"; do
    if [ "$PWM_MPI" = openmpi ]; then printf -- '-x %s ' "$kv"; else printf -- '-genv %s %s ' "${kv%%=*}" "${kv#*=}"; fi
  done
}

# pwm_mpirun_bind_core: the launcher flags that bind each rank to a core of its own.
pwm_mpirun_bind_core() {
  if [ "$PWM_MPI" = openmpi ]; then echo "--bind-to core"; else echo "-bind-to core"; fi
}

pwm_install_deps() { pwm_install_packages "${PWM_PACKAGES[@]}"; }

# pwm_install_slurm: Debian's Slurm and munge, for the `slurm` test label only
# (mpi_scripts/slurm_cluster.sh). Their packages start the daemons when installed; a policy-rc.d
# that refuses (exit 101) is in place meanwhile (put there only if the machine has none), so
# nothing is left running.
pwm_install_slurm() {
  local pkgs=(slurmctld slurmd slurm-client munge) p missing=0 policy=/usr/sbin/policy-rc.d made=0 rc=0
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing=1
  done
  [ $missing = 0 ] && return 0
  if [ ! -e $policy ] && [ "$(id -u)" -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy && made=1
  fi
  pwm_install_packages "${pkgs[@]}" || rc=$?
  [ $made = 1 ] && rm -f $policy
  return $rc
}

# pwm_install_report_tools: what mpi_scripts/report.sh and the `report` test label need beyond
# the build: Debian's Chromium (the page is opened in it headless: mpi_scripts/report_check.py)
# and python3-jsonschema (report.json against mpi_scripts/report_schema.json).
pwm_install_report_tools() { pwm_install_packages chromium python3-jsonschema; }

# Flag parsing for the scripts, before anything is installed or built; each prints one line
# naming the script and the flag, and exits 2.
# pwm_value SCRIPT "$@" (the arguments from the flag on): the flag's value, or the error when
# there is none or it is another flag. Use as V=$(pwm_value "$ME" "$@") || exit 2.
pwm_value() {
  if [ $# -lt 3 ] || [[ "$3" == --* ]]; then
    echo "$1: error: $2 needs a value (see --help)" >&2; exit 2
  fi
  printf '%s' "$3"
}
# pwm_count SCRIPT FLAG VALUE [MIN [MAX]]: VALUE must be a whole number from MIN (default 1) to
# MAX (default 999999999: nine digits, so no shell arithmetic on it can overflow). No leading
# zero: the shell's $((...)) would read 08 as octal and fail.
pwm_count() {
  local min=${4:-1} max=${5:-999999999}
  if ! [[ "$3" =~ ^(0|[1-9][0-9]*)$ ]]; then
    echo "$1: error: $2 must be a whole number from $min to $max (got '$3')" >&2; exit 2
  fi
  if [ ${#3} -gt 9 ] || [ "$3" -lt "$min" ] || [ "$3" -gt "$max" ]; then
    echo "$1: error: $2 $3 is out of range: use a whole number from $min to $max" >&2; exit 2
  fi
}
# pwm_decimal SCRIPT FLAG VALUE MIN: VALUE must be a decimal number (digits, an optional
# fraction) of at least MIN and at most 999999999.
pwm_decimal() {
  [[ "$3" =~ ^(0|[1-9][0-9]{0,8})([.][0-9]+)?$ ]] && awk -v v="$3" -v m="$4" 'BEGIN { exit !(v + 0 >= m + 0) }' ||
    { echo "$1: error: $2 must be a number from $4 to 999999999 (got '$3')" >&2; exit 2; }
}
# pwm_words SCRIPT FLAG "VALUE" WORD...: VALUE, a list separated by spaces or commas, must name at
# least one of the WORDs and nothing else.
pwm_words() {
  local me=$1 flag=$2 value=$3 w a ok words
  shift 3
  [ -n "${value//[ ,]/}" ] || { echo "$me: error: $flag is empty: give one or more of $*" >&2; exit 2; }
  read -r -a words <<<"${value//,/ }"  # (no glob expansion of the words)
  for w in "${words[@]}"; do
    ok=0
    for a in "$@"; do [ "$w" = "$a" ] && ok=1; done
    [ "$ok" = 1 ] || { echo "$me: error: $flag takes $* (got '$w')" >&2; exit 2; }
  done
}

# pwm_install_packages PKG...: apt-get installs the ones not installed yet.
pwm_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "pathways-mpi: installing missing packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo="sudo"
    else
      echo "pathways-mpi: error: missing packages ${missing[*]}; install them with:" >&2
      echo "  sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

pwm_build() {
  local portable=OFF
  [ "${PWM_PORTABLE:-0}" = "1" ] && portable=ON
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    # ccache, with its cache in the clone (.ccache/): the translation units that include no MPI
    # header (model/, sim/, common/ and their tests) compile to the same objects for OpenMPI and
    # MPICH, so the second build of a CI run takes them from the first.
    cmake -S "$PWM_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPORTABLE=$portable \
          -DMPI_CXX_COMPILER="$PWM_MPICXX" -DMPIEXEC_EXECUTABLE="$PWM_MPIRUN" \
          -DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_DIR=$PWM_ROOT/.ccache;ccache" >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

# pwm_test_jobs: ctest's -j, in rank slots (every MPI case declares PROCESSORS = its ranks). Four
# times the cores by default (PWM_TEST_JOBS overrides): most of an MPI case's time is start-up,
# waiting for a watchdog to fire or a rank to be killed, so the suite leaves the cores idle at
# twice the cores (OpenMPI's whole suite on 2 vCPU, 2026-12-06: 484-522 s at -j4 with the cores
# busy 30% of the time, 326 s at -j8, the same 419 cases passing; earlier, the `mpi` label: 298 s
# at -j1, 204 s at -j4). The emulated-cluster cases stay RUN_SERIAL. getconf, not nproc (see
# pwm_gemm_peak).
pwm_test_jobs() {
  echo "${PWM_TEST_JOBS:-$(( 4 * $(getconf _NPROCESSORS_ONLN) ))}"
}

# The PyTorch peer (../shared/peers/torch_palm_bench.py next to this repository, or
# $PWM_TORCH_PEER): prints its median tokens/s at THREADS threads. Debian's python3-torch calls
# sgemm_ through libblas.so.3; the peer runs on the pthread OpenBLAS and on the OpenMP one
# (which honours torch's thread count), and the faster is the reference.
pwm_torch_peer() {
  local threads=$1 steps=${2:-20} warmup=${3:-5}
  local peer="${PWM_TORCH_PEER:-$PWM_ROOT/../shared/peers/torch_palm_bench.py}"
  [ -f "$peer" ] || { echo "pathways-mpi: error: the PyTorch peer $peer is missing (set PWM_TORCH_PEER)" >&2; return 1; }
  pwm_install_packages python3-torch libopenblas0-openmp >&2
  local a b
  a=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads /usr/bin/python3 "$peer" "$threads" "$steps" "$warmup" |
      tee /dev/stderr | grep -o 'tokens/s median=[0-9]*' | cut -d= -f2)
  b=$(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OMP_NUM_THREADS=$threads \
      /usr/bin/python3 "$peer" "$threads" "$steps" "$warmup" |
      tee /dev/stderr | grep -o 'tokens/s median=[0-9]*' | cut -d= -f2)
  echo $(( a > b ? a : b ))
}

# Warn when a compiler runs beside a benchmark (it halves the figures).
# A 1024^3 GEMM rate per core in GFLOP/s (precision $1: fp32 | bf16), measured with every core
# busy as a run uses them (getconf, not nproc: nproc honours an exported OMP_NUM_THREADS=1). The
# trainers measure their own MFU peak at the model's shapes (docs/train.md, "MFU"); this figure
# given as --peak-gflops fixes the peak to it instead (a step faster than it still raises it).
pwm_gemm_peak() {
  (for _ in $(seq "$(getconf _NPROCESSORS_ONLN)"); do "$BUILD_DIR/bench/model/model_bench" --peak-only --precision "$1" & done; wait) |
    awk '{s += $1; n++} END {printf "%.2f", s / n}'
}
# pwm_speed_probe [MODEL_BENCH]: "g1 g2", this machine's fp32 GEMM rate now (GFLOP/s, 1024^3 sgemm):
# one process alone, and per process with one on every core. The VM's speed moves by 20-40% over
# minutes (the host places its vCPUs); sim_validate.sh scales the profile's kernels by it.
pwm_speed_probe() {
  local mb=${1:-$BUILD_DIR/bench/model/model_bench} g1
  g1=$(OMP_NUM_THREADS=1 "$mb" --peak-only)
  echo "$g1 $( (for _ in $(seq "$(getconf _NPROCESSORS_ONLN)"); do OMP_NUM_THREADS=1 "$mb" --peak-only & done; wait) |
    awk '{s += $1; n++} END {printf "%.2f", s / n}')"
}
# pwm_step_probe MODEL_BENCH MODEL_FLAGS...: this machine's speed now on the work the simulator
# calibrates: the achieved GFLOP/s of model_bench's training step of that model on core 0 (one
# thread, 20 steps after 3 warm-up, no GEMM peak; ~0.3 s at the calibration model).
# sim_calibrate.sh and sim_validate.sh scale the profile by it and pin their one-rank launches to
# core 0.
# - A 1024^3 SGEMM (pwm_speed_probe) is not a stand-in: in one slow phase of this VM it measured
#   102 GFLOP/s against 180 a few minutes later, and the trainers' steps scaled by it came out
#   25-30% too fast.
# - On core 0, because this VM's two vCPUs differ by turns: the same step took 14.2-15.0 ms on
#   core 0 and 12.3-12.5 ms on core 1 in ten alternating runs, the reverse 20 minutes later, and
#   an unpinned process lands on either (docs/simulator_calibration.md, "Speed scaling").
pwm_step_probe() {
  local mb=$1
  shift
  PWM_MODEL_THREADS=1 OMP_NUM_THREADS=1 taskset -c "${PWM_PROBE_CORE:-0}" "$mb" "$@" --peak-reps 0 --steps 20 --warmup 3 |
    awk '/achieved GFLOP\/s=/ {sub(/.*achieved GFLOP\/s=/, ""); print $1}'
}
# pwm_core_probes MODEL_BENCH FLAGS...: "core0 core1", the step probe on each core in turn. A
# launch of two or more ranks runs at its slower core's pace (its ranks meet every step), which
# the core-0 probe alone does not see: one validation's dp 2 rows ran 20% slower than that probe
# predicted while its one-rank rows held (docs/simulator_calibration.md, "Speed within the
# calibration").
pwm_core_probes() {
  echo "$(pwm_step_probe "$@") $(PWM_PROBE_CORE=1 pwm_step_probe "$@")"
}
pwm_warn_if_busy() {
  if pgrep -x cc1plus >/dev/null; then
    echo "pathways-mpi: warning: a compiler is running; throughput figures will be low" >&2
  fi
}

# The simulator scripts' (sim_calibrate.sh, sim_validate.sh) shared flags, binaries and work
# directory.
# pwm_sim_args HELP_LINES WITH_PROFILE ARGS...: parses --out, --quick, --no-hosts, --dcn-rate,
# --dcn-delay and, with WITH_PROFILE = 1, --profile. Sets QUICK HOSTS DCN_RATE DCN_DELAY (defaults
# 0 1 200mbit and none), and OUT and PROFILE when given (the caller sets their defaults first:
# a file for one script, a folder for the other). -h prints the lines HELP_LINES (a sed range,
# 2,17) of the calling script; an unknown argument exits 2.
pwm_sim_args() {
  local help=$1 with_profile=$2 me
  me=$(basename "$0")
  shift 2
  QUICK=0 HOSTS=1 DCN_RATE=200mbit DCN_DELAY=
  while [ $# -gt 0 ]; do
    case "$1" in
      --profile) [ "$with_profile" = 1 ] || pwm_sim_unknown_arg "$me" "$1"; PROFILE=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --quick) QUICK=1; shift ;;
      --no-hosts) HOSTS=0; shift ;;
      --dcn-rate) DCN_RATE=$2; shift 2 ;;
      --dcn-delay) DCN_DELAY=$2; shift 2 ;;
      -h|--help) sed -n "${help}p" "$0"; exit 0 ;;
      *) pwm_sim_unknown_arg "$me" "$1" ;;
    esac
  done
}
pwm_sim_unknown_arg() {
  echo "$1: error: unknown argument '$2' (see --help)" >&2
  exit 2
}
# pwm_sim_binaries EXE...: sets B (PWM_SIM_BUILD, default BUILD_DIR) and exits 1 with the ninja
# command to run when one of the executables B/EXE is missing (sim/pwm_sim is target pwm_sim_cli).
pwm_sim_binaries() {
  B=${PWM_SIM_BUILD:-$BUILD_DIR}
  local exe targets=()
  for exe in "$@"; do
    case "$exe" in sim/pwm_sim) targets+=(pwm_sim_cli) ;; *) targets+=("${exe##*/}") ;; esac
  done
  for exe in "$@"; do
    [ -x "$B/$exe" ] || { echo "$(basename "$0"): error: $B/$exe is missing: ninja -C $B ${targets[*]}" >&2; exit 1; }
  done
}
# pwm_sim_workdir: W, a fresh temporary folder removed at exit; PWM_SIM_KEEP=DIR copies it there
# first (the raw measurements: traces, metrics, bench JSON, probes).
pwm_sim_workdir() {
  W=$(mktemp -d)
  trap '[ -n "${PWM_SIM_KEEP:-}" ] && mkdir -p "$PWM_SIM_KEEP" && cp -r "$W"/. "$PWM_SIM_KEEP"/; rm -rf "$W"' EXIT
}
