#!/usr/bin/env bash
# Model throughput, side by side with the PyTorch peer (/work/shared/peers/torch_palm_bench.py or
# $PWM_TORCH_PEER), both on ONE thread, same reference config, same machine, one after the other.
# Prints model_bench's figures, the peer's, and the ratio (issue 3 accepts >= 1.2x and MFU >= 50%).
#
# The peer's BLAS: Debian's python3-torch calls sgemm_ from libblas.so.3. With the default
# pthread OpenBLAS, torch.set_num_threads(1) does not reach OpenBLAS, which then runs 2 threads;
# so the peer is run (a) on the pthread OpenBLAS with OPENBLAS_NUM_THREADS=1 and (b) on the OpenMP
# OpenBLAS (libopenblas0-openmp, which honours torch's thread count), and the FASTER of the two is
# the reference. Both sides inherit the same OPENBLAS_* environment (e.g. OPENBLAS_CORETYPE).
# Usage: mpi_scripts/model_bench.sh [extra model_bench flags]
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
pwm_install_deps
pwm_build >/dev/null

PEER="${PWM_TORCH_PEER:-/work/shared/peers/torch_palm_bench.py}"
STEPS="${PWM_BENCH_STEPS:-20}"
WARMUP="${PWM_BENCH_WARMUP:-5}"
OUT="${PWM_BENCH_OUT:-$BUILD_DIR/model_bench.json}"

pwm_install_torch() {
  local missing=()
  for p in python3-torch libopenblas0-openmp; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "model_bench.sh: installing ${missing[*]} for the PyTorch peer"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo="sudo"
    else
      echo "model_bench.sh: error: install them with: sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if pgrep -x cc1plus >/dev/null; then
  echo "model_bench.sh: warning: a compiler is running; throughput figures will be low" >&2
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset: autodetect>}"

echo "== model_bench (C++, 1 thread)"
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PWM_MODEL_THREADS=1 \
  "$BUILD_DIR/bench/model/model_bench" --steps "$STEPS" --warmup "$WARMUP" --json "$OUT" "$@"
ours=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['tokens_per_s']))" "$OUT")
mfu=$(python3 -c "import json,sys; print(round(100*json.load(open(sys.argv[1]))['mfu'],1))" "$OUT")

pwm_install_torch
run_peer() {  # prints the peer's median tokens/s
  "$@" /usr/bin/python3 "$PEER" 1 "$STEPS" "$WARMUP" | tee /dev/stderr |
    grep -o 'tokens/s median=[0-9]*' | cut -d= -f2
}
echo "== torch peer, pthread OpenBLAS, OPENBLAS_NUM_THREADS=1"
t_pthread=$(run_peer env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
echo "== torch peer, OpenMP OpenBLAS (libopenblas0-openmp), OMP_NUM_THREADS=1"
t_openmp=$(run_peer env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OMP_NUM_THREADS=1)
peer=$(( t_pthread > t_openmp ? t_pthread : t_openmp ))

python3 - "$ours" "$peer" "$mfu" <<'EOF'
import sys
ours, peer, mfu = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ratio = ours / peer
print(f"== summary: model_bench {ours:.0f} tokens/s, torch peer {peer:.0f} tokens/s (best single-thread "
      f"BLAS), ratio {ratio:.2f}x (bar 1.2x: {'PASS' if ratio >= 1.2 else 'FAIL'}), "
      f"MFU {mfu:.1f}% (bar 50%: {'PASS' if mfu >= 50 else 'FAIL'})")
EOF
