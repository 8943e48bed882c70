#!/usr/bin/env bash
# One command for a GPU machine (issue 41): the pool on a real device.
#
#   benchmarks/gpu/check.sh            # on a GPU machine: everything below
#   DRY_RUN=1 benchmarks/gpu/check.sh  # or on a machine without a GPU: the
#                                      # build steps and the host async backend
#
# Needs: CMake >= 3.18, a C++17 compiler, Python 3 (standard library only);
# for the device steps nvcc and a GPU; optionally PyTorch (its C++ caching
# allocator is the comparison) and compute-sanitizer. No TensorFlow.
# Builds, under $BUILD (default benchmarks/gpu/.build):
#   pool_replay (the pool, its host backends, the CUDA backend where CUDA is
#   found, the replay harness, cudaMallocAsync / cudaMalloc baselines) and
#   torch_caching_replay (where PyTorch is found).
# Then, each step under a time limit (all of it in under 5 minutes):
#   1. the race test on the async host backend (lockstep), rule on and off;
#   2. the race test on real CUDA streams, rule on and off (a slow stream on
#      purpose: stream s spins s * 20 us before each kernel);
#   3. compute-sanitizer memcheck and racecheck on a short CUDA replay;
#   4. ns per allocate/free pair, 1 job (ResNet50) and 2 jobs (two copies on
#      two streams): the pool (host backend; CUDA backend, event per free and
#      event at sync), cudaMallocAsync, cudaMalloc, PyTorch's caching allocator;
#   5. two jobs' traces (ResNet50 + Transformer) concurrently: the smallest
#      arena serving both against the sum of their own, and PyTorch's reserved
#      peak with one stream per job.
# Writes every figure as one JSON line to $OUT/check.jsonl (when OUT is set;
# else $BUILD/check.jsonl) and prints the table (summarize.py).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$HERE/.build}
RESULTS_DIR=${OUT:-$BUILD}
RESULTS=$RESULTS_DIR/check.jsonl
TRACES=$REPO/benchmarks/traces
RESNET=$TRACES/resnet50_64px_b8.replay
TRANSFORMER=$TRACES/transformer_encoder_b32.replay
SMALL=$TRACES/small_cnn_b64.replay
mkdir -p "$BUILD" "$RESULTS_DIR"
: > "$RESULTS"
START=$(date +%s)

GPU=0
if [ "${DRY_RUN:-0}" != 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
fi
PYTHON=$(command -v python3 || command -v python)

note() {  # note STEP STATUS DETAIL: one JSON line for a step's outcome
  "$PYTHON" -c 'import json,sys; print(json.dumps({"kind": "step", "step": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3]}))' \
    "$1" "$2" "$3" >> "$RESULTS"
  echo "[$(($(date +%s) - START)) s] $1: $2 ${3:0:300}"
}

run_step() {  # run_step NAME LIMIT_S CMD...: CMD's JSON lines go to RESULTS
  local name=$1 limit=$2; shift 2
  local log=$BUILD/$name.log
  if timeout "$limit" "$@" > "$log.out" 2> "$log"; then
    grep '^{' "$log.out" >> "$RESULTS"
    note "$name" ok "$(wc -l < "$log.out") lines"
  else
    local rc=$?
    grep '^{' "$log.out" >> "$RESULTS" 2>/dev/null
    note "$name" "failed (exit $rc)" "$(tail -c 600 "$log" | tr '\n' ' ')"
  fi
}

# ---- build
CMAKE_ARGS=(-S "$HERE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release)
if [ "$GPU" = 1 ]; then
  # The GPU's own architecture ("9.0" -> 90), which any CMake >= 3.18 accepts ("native" needs 3.24).
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$ARCH" ] && CMAKE_ARGS+=(-DCMAKE_CUDA_ARCHITECTURES="$ARCH")
fi
TORCH_ROOT=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
if [ -n "$TORCH_ROOT" ]; then
  ABI=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
  CMAKE_ARGS+=(-DTORCH_ROOT="$TORCH_ROOT" -DTORCH_CXX11_ABI="$ABI")
fi
run_step configure 120 cmake "${CMAKE_ARGS[@]}"
run_step build 240 cmake --build "$BUILD" --target pool_replay -j "$(nproc)"
CUDA_BUILT=0
grep -q "CUDA backend ON" "$BUILD/configure.log.out" && CUDA_BUILT=1
note cuda_backend "$([ $CUDA_BUILT = 1 ] && echo built || echo 'not built')" "$(grep 'tensile:' "$BUILD/configure.log.out" | tr '\n' ' ')"
TORCH_BUILT=0
if grep -q "PyTorch comparison ON" "$BUILD/configure.log.out"; then
  run_step build_torch 240 cmake --build "$BUILD" --target torch_caching_replay -j "$(nproc)"
  [ -x "$BUILD/torch_caching_replay" ] && TORCH_BUILT=1
fi
REPLAY=$BUILD/pool_replay
if [ ! -x "$REPLAY" ]; then
  note summary failed "pool_replay did not build; see $BUILD/build.log"
  "$PYTHON" "$HERE/summarize.py" "$RESULTS"
  exit 1
fi

# ---- 1. race test, host async backend (lockstep: deterministic)
run_step race_async_host 60 "$REPLAY" --mode race --backend async-host "$RESNET" "$TRANSFORMER"
# ---- 5. footprint (placement only: host)
run_step arena 60 "$REPLAY" --mode arena "$RESNET" "$TRANSFORMER"

if [ "$GPU" = 1 ] && [ "$CUDA_BUILT" = 1 ]; then
  # ---- 2. race test on real streams
  run_step race_cuda 60 "$REPLAY" --mode race --backend cuda --spin-ns 20000 "$RESNET" "$TRANSFORMER"
  # ---- 3. sanitizers on a short replay
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      run_step "sanitizer_$tool" 90 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$REPLAY" --mode race --backend cuda --rules on --passes 1 --spin-ns 0 "$TRANSFORMER" "$SMALL"
    done
  else
    note sanitizers skipped "compute-sanitizer not found"
  fi
fi

# ---- 4. pair cost (the CUDA rows only where built and a GPU is present)
PAIR_ARGS=(--mode pairs --samples 11 --min-sample-ms 100)
if [ "$GPU" = 1 ]; then
  run_step pairs_1job 90 "$REPLAY" "${PAIR_ARGS[@]}" "$RESNET"
  run_step pairs_2jobs 90 "$REPLAY" "${PAIR_ARGS[@]}" "$RESNET" "$RESNET"
  if [ "$TORCH_BUILT" = 1 ]; then
    run_step torch_1job 60 "$BUILD/torch_caching_replay" --samples 11 --min-sample-ms 100 "$RESNET"
    run_step torch_2jobs 60 "$BUILD/torch_caching_replay" --samples 11 --min-sample-ms 100 "$RESNET" "$RESNET"
    run_step torch_footprint 60 "$BUILD/torch_caching_replay" --samples 1 --min-sample-ms 1 "$RESNET" "$TRANSFORMER"
  fi
else
  # Host only (no CUDA device): the pool's own rows, to show the harness runs.
  run_step pairs_1job 60 "$REPLAY" "${PAIR_ARGS[@]}" --capacity 1073741824 "$RESNET"
  run_step pairs_2jobs 60 "$REPLAY" "${PAIR_ARGS[@]}" --capacity 1073741824 "$RESNET" "$RESNET"
fi

note total ok "$(($(date +%s) - START)) s, gpu=$GPU cuda_backend=$CUDA_BUILT torch=$TORCH_BUILT"
"$PYTHON" "$HERE/summarize.py" "$RESULTS"
