#!/usr/bin/env bash
# One command for a GPU machine (issues 41 and 44): the pool on a real device.
#
#   benchmarks/gpu/check.sh            # on a GPU machine: everything below
#   DRY_RUN=1 benchmarks/gpu/check.sh  # or on a machine without a GPU: the
#                                      # build steps and the host async backend
#
# Needs: a C++17 compiler and Python 3 (standard library only); CMake >= 3.18
# with Ninja or make if there (CMake's and Ninja's pip packages count);
# without CMake, or without a generator, a plain compiler line builds
# pool_replay and the C ABI library (nvcc where found, else g++). For the
# device steps nvcc and a GPU; optionally PyTorch (its caching allocator is
# the comparison, and it trains through the pool) and compute-sanitizer.
# No TensorFlow.
# Builds, under $BUILD (default benchmarks/gpu/.build):
#   pool_replay (the pool, its host backends, the CUDA backend where CUDA is
#   found, the replay harness, cudaMallocAsync / cudaMalloc baselines),
#   libtensile_pool_c.so (the pool behind a C ABI, pool_c_abi.h) and
#   torch_caching_replay (where PyTorch is found).
# Then, each step under its own time limit and all under TOTAL_LIMIT
# seconds (default 290; a step that would pass it is cut short, the rest are
# listed as skipped):
#   1. the race test on the async host backend (lockstep), rule on and off;
#   2. two jobs' traces (ResNet50 + Transformer) concurrently: the smallest
#      arena serving both against the sum of their own, with and without
#      stitching, on the host (4 KiB and 2 MiB pieces) and on the CUDA arena;
#   3. the race test on real CUDA streams, rule on and off (a slow stream on
#      purpose: stream s spins s * 20 us before each kernel);
#   4. two models training at once on two streams through the pool against
#      PyTorch's caching allocator (torch_training.py);
#   5. ns per allocate/free pair, 1 job (ResNet50) and 2 jobs: the pool (host
#      backend; CUDA backend, event per free and event at sync),
#      cudaMallocAsync, cudaMalloc, PyTorch's caching allocator, and
#      PyTorch's reserved peak with one stream per job;
#   6. compute-sanitizer memcheck and racecheck on a short CUDA replay.
# Environment: OUT, BUILD, DRY_RUN=1, TOTAL_LIMIT (seconds), CUDA=OFF (host
# backends only, even where nvcc is), BUILD_TYPE (Release, the default, or
# Debug: -O0, the suite's quicker build), CMAKE / NINJA (a path, or empty:
# none; unset: found on PATH or in Python's cmake / ninja packages).
# Writes every figure as one JSON line to $OUT/check.jsonl (when OUT is set;
# else $BUILD/check.jsonl), every step's log to $OUT/logs/ (there from the
# start, so a killed run leaves them), a line for everything not built or
# not run and why, and prints the table (summarize.py).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$HERE/.build}
RESULTS_DIR=${OUT:-$BUILD}
RESULTS=$RESULTS_DIR/check.jsonl
LOGS=$RESULTS_DIR/logs
TOTAL_LIMIT=${TOTAL_LIMIT:-290}
TRACES=$REPO/benchmarks/traces
RESNET=$TRACES/resnet50_64px_b8.replay
TRANSFORMER=$TRACES/transformer_encoder_b32.replay
SMALL=$TRACES/small_cnn_b64.replay
PYTHON=$(command -v python3 || command -v python)

# The hard overall limit: the script runs again under timeout, which signals
# the whole process group when the limit passes; the trap below still writes
# the summary. The per-step limits are clamped so that normally it never fires.
if [ -z "${TENSILE_CHECK_INNER:-}" ] && command -v timeout >/dev/null; then
  TENSILE_CHECK_INNER=1 exec timeout --kill-after 15 "$((TOTAL_LIMIT + 10))" bash "$0" "$@"
fi
mkdir -p "$BUILD" "$RESULTS_DIR" "$LOGS"
: > "$RESULTS"
START=$(date +%s)
DEADLINE=$((START + TOTAL_LIMIT))

note() {  # note STEP STATUS DETAIL: one JSON line for a step's outcome
  "$PYTHON" -c 'import json,sys; print(json.dumps({"kind": "step", "step": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3]}))' \
    "$1" "$2" "$3" >> "$RESULTS"
  echo "[$(($(date +%s) - START)) s] $1: $2 ${3:0:300}"
}

finish() {
  local rc=$?
  trap - EXIT TERM INT HUP
  # CMake's own record of a failed configure, beside the step logs.
  for f in CMakeFiles/CMakeConfigureLog.yaml CMakeFiles/CMakeError.log; do
    [ -f "$BUILD/$f" ] && cp "$BUILD/$f" "$LOGS/" 2>/dev/null
  done
  [ "$rc" -ge 128 ] && note total "killed (exit $rc)" "at $(($(date +%s) - START)) s of ${TOTAL_LIMIT} s"
  "$PYTHON" "$HERE/summarize.py" "$RESULTS"
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM INT HUP

run_step() {  # run_step NAME LIMIT_S CMD...: CMD's JSON lines go to RESULTS
  local name=$1 limit=$2; shift 2
  local log=$LOGS/$name.log left=$((DEADLINE - $(date +%s) - 5))
  if [ "$left" -le 1 ]; then
    note "$name" skipped "overall limit of ${TOTAL_LIMIT} s reached"
    return 1
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  if timeout "$limit" "$@" > "$log.out" 2> "$log"; then
    grep '^{' "$log.out" >> "$RESULTS"
    note "$name" ok "$(wc -l < "$log.out") lines"
  else
    local rc=$?
    grep '^{' "$log.out" >> "$RESULTS" 2>/dev/null
    [ "$rc" = 124 ] && rc="$rc: over its ${limit} s"
    note "$name" "failed (exit $rc)" "$(tail -c 600 "$log" | tr '\n' ' ')"
    return 1
  fi
}

GPU=0
if [ "${DRY_RUN:-0}" != 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
fi

# ---- tools: CMake and a generator (pip's packages count), or a plain compiler line
tool() {  # tool NAME PYMODULE ATTR: on PATH, else inside the Python package
  command -v "$1" 2>/dev/null && return
  "$PYTHON" -c "import os, $2; p = os.path.join($2.$3, '$1'); print(p) if os.access(p, os.X_OK) else None" 2>/dev/null
}
# CMAKE= or NINJA= set (even empty) wins: CMAKE= forces the plain compiler line.
CMAKE=${CMAKE-$(tool cmake cmake CMAKE_BIN_DIR)}
NINJA=${NINJA-$(tool ninja ninja BIN_DIR)}
MAKE=$(command -v make || command -v gmake || true)
NVCC=$(command -v nvcc || { [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ] && echo "$CUDA_HOME/bin/nvcc"; } || true)
ARCH=""
if [ "$GPU" = 1 ]; then
  # The GPU's own architecture ("9.0" -> 90), which any CMake >= 3.18 accepts ("native" needs 3.24).
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
TORCH_ROOT=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
[ -z "$TORCH_ROOT" ] && note torch "not found" "python3 -c 'import torch' failed: no PyTorch comparison, no training through the pool"

# ---- the C++ compiler: one whose shared libraries load the process's libstdc++
# libtensile_pool_c.so is loaded into processes with a C++ runtime of their own (PyTorch's
# CUDAPluggableAllocator). Built by the H200 machine's /opt/gcc g++, which links libstdc++
# statically (the library needed no libstdc++.so), its iostreams broke there: once torch
# was imported, tensile_pool_stats_json segfaulted inside std::ostream (2026-12-04; with
# /usr/bin/g++ the same training passed, bit for bit). So the first compiler on offer
# whose shared libraries need libstdc++.so builds everything.
shared_libstdcxx() {  # shared_libstdcxx COMPILER
  printf '#include <sstream>\nstd::string tensile_probe(int i) { std::ostringstream o; o << i; return o.str(); }\n' \
    > "$BUILD/cxx_probe.cc"
  "$1" -shared -fPIC -o "$BUILD/cxx_probe.so" "$BUILD/cxx_probe.cc" 2>/dev/null \
    && readelf -d "$BUILD/cxx_probe.so" 2>/dev/null | grep -q 'NEEDED.*libstdc++'
}
PICKED_CXX=""
for c in ${CXX:-} $(command -v c++ || true) $(command -v g++ || true) /usr/bin/c++ /usr/bin/g++; do
  if [ -x "$c" ] && shared_libstdcxx "$c"; then PICKED_CXX=$c; break; fi
done
if [ -n "$PICKED_CXX" ]; then
  note "C++ compiler" "$PICKED_CXX" "its shared libraries need libstdc++.so (the process's C++ runtime)"
else
  note "C++ compiler" "static libstdc++" "no compiler on offer links libstdc++ shared: the C ABI library may crash in PyTorch"
fi

# ---- build
CUDA_BUILT=0
TORCH_BUILT=0
if [ -n "$CMAKE" ] && { [ -n "$NINJA" ] || [ -n "$MAKE" ]; }; then
  if [ -n "$NINJA" ]; then GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA"); GEN_NAME=Ninja
  else GEN=(-G "Unix Makefiles" -DCMAKE_MAKE_PROGRAM="$MAKE"); GEN_NAME="Unix Makefiles"; fi
  # A build folder configured by another generator cannot be reused.
  if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=$GEN_NAME\$" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  fi
  CMAKE_ARGS=(-S "$HERE" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DTENSILE_CUDA="${CUDA:-ON}")
  [ -n "$NVCC" ] && [ -z "${CUDACXX:-}" ] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
  [ -n "$PICKED_CXX" ] && CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER="$PICKED_CXX" -DCMAKE_CUDA_HOST_COMPILER="$PICKED_CXX")
  [ -n "$ARCH" ] && CMAKE_ARGS+=(-DCMAKE_CUDA_ARCHITECTURES="$ARCH")
  if [ -n "$TORCH_ROOT" ]; then
    ABI=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
    CMAKE_ARGS+=(-DTORCH_ROOT="$TORCH_ROOT" -DTORCH_CXX11_ABI="$ABI")
  fi
  note generator "$GEN_NAME" "cmake $CMAKE; make ${MAKE:-absent}; ninja ${NINJA:-absent}"
  run_step configure 120 "$CMAKE" "${CMAKE_ARGS[@]}"
  # Every part the configure did not turn on says why.
  while IFS= read -r line; do
    what=${line#*tensile: }
    note "${what%% OFF*}" "not built" "${what#*OFF: }"
  done < <(grep -h 'tensile: .* OFF: ' "$LOGS/configure.log.out" 2>/dev/null)
  run_step build 240 "$CMAKE" --build "$BUILD" --target pool_replay tensile_pool_c -j "$(nproc)"
  grep -q "CUDA backend ON" "$LOGS/configure.log.out" 2>/dev/null && CUDA_BUILT=1
  if grep -q "PyTorch comparison ON" "$LOGS/configure.log.out" 2>/dev/null; then
    run_step build_torch 240 "$CMAKE" --build "$BUILD" --target torch_caching_replay -j "$(nproc)" \
      && [ -x "$BUILD/torch_caching_replay" ] && TORCH_BUILT=1
  fi
else
  # No CMake or no generator: the compiler lines test_cuda_backend_builds.py proves.
  note generator "plain compiler" "cmake ${CMAKE:-absent}; make ${MAKE:-absent}; ninja ${NINJA:-absent}"
  CORE=("$REPO/tf_plugin/allocator/stream_aware_pool.cc" "$REPO/tf_plugin/allocator/async_host_backend.cc")
  OPT=-O2
  [ "${BUILD_TYPE:-Release}" = Debug ] && OPT=-O0
  if [ -n "$NVCC" ] && [ "${CUDA:-ON}" != OFF ]; then
    CXX=("$NVCC" "$OPT" -std=c++17 -I"$REPO" -DTENSILE_WITH_CUDA ${ARCH:+-arch=sm_$ARCH} ${PICKED_CXX:+-ccbin "$PICKED_CXX"})
    PIC=(-Xcompiler -pthread,-fPIC,-fvisibility=hidden)
    CUDA_SRC=("$REPO/tf_plugin/allocator/cuda_backend.cu")
    CUDA_BUILT=1
  else
    CXX=("${CXX_BIN:-${PICKED_CXX:-$(command -v g++ || command -v c++)}}" "$OPT" -std=c++17 -I"$REPO")
    PIC=(-pthread -fPIC -fvisibility=hidden)
    CUDA_SRC=()
    note "CUDA backend" "not built" "no CUDA compiler (nvcc on PATH or CUDA_HOME), or CUDA=OFF"
  fi
  [ "$CUDA_BUILT" = 1 ] && THREADS=(-Xcompiler -pthread) || THREADS=(-pthread)
  # The two at once (each one compiler process).
  run_step build_c_abi 240 "${CXX[@]}" "${PIC[@]}" -shared "${CORE[@]}" "$REPO/tf_plugin/allocator/pool_c_abi.cc" \
    "${CUDA_SRC[@]}" -o "$BUILD/libtensile_pool_c.so" &
  run_step build 240 "${CXX[@]}" "${THREADS[@]}" "${CORE[@]}" "$REPO/tf_plugin/allocator/trace_replay.cc" \
    "$HERE/pool_replay.cc" "${CUDA_SRC[@]}" ${CUDA_SRC[@]:+"$HERE/cuda_baselines.cu"} -o "$BUILD/pool_replay"
  wait
  note "PyTorch comparison" "not built" "torch_caching_replay needs CMake with Ninja or make"
fi
REPLAY=$BUILD/pool_replay
POOL_LIB=$BUILD/libtensile_pool_c.so
[ -f "$POOL_LIB" ] || note "C ABI library" "not built" "see $LOGS/build.log"
if [ ! -x "$REPLAY" ]; then
  note summary failed "pool_replay did not build; see $LOGS/build.log"
  exit 1
fi

# ---- 1. race test, host async backend (lockstep: deterministic)
run_step race_async_host 60 "$REPLAY" --mode race --backend async-host "$RESNET" "$TRANSFORMER"
# ---- 2. footprint: host (4 KiB and 2 MiB pieces), and the CUDA arena on a GPU
if [ "$GPU" = 1 ] && [ "$CUDA_BUILT" = 1 ]; then
  run_step arena 90 "$REPLAY" --mode arena --backend cuda "$RESNET" "$TRANSFORMER"
else
  run_step arena 60 "$REPLAY" --mode arena "$RESNET" "$TRANSFORMER"
fi

if [ "$GPU" = 1 ] && [ "$CUDA_BUILT" = 1 ]; then
  # ---- 3. race test on real streams (stitching on: the window is mapped with cuMemMap)
  run_step race_cuda 60 "$REPLAY" --mode race --backend cuda --spin-ns 20000 "$RESNET" "$TRANSFORMER"
  # ---- 4. real training kernels through the pool
  if [ -n "$TORCH_ROOT" ] && [ -f "$POOL_LIB" ]; then
    run_step torch_training 150 "$PYTHON" "$HERE/torch_training.py" --lib "$POOL_LIB" --out-dir "$LOGS"
  else
    note torch_training skipped "needs PyTorch and libtensile_pool_c.so (torch: ${TORCH_ROOT:-absent})"
  fi
else
  note cuda_steps skipped "no GPU (or DRY_RUN=1) or no CUDA backend: gpu=$GPU cuda_backend=$CUDA_BUILT"
  # The training script's plan and its pure parts, without PyTorch or a GPU.
  run_step torch_training_plan 30 "$PYTHON" "$HERE/torch_training.py" --dry-run --lib "$POOL_LIB"
fi

# ---- 5. pair cost (the CUDA rows only where built and a GPU is present)
PAIR_ARGS=(--mode pairs --samples 11 --min-sample-ms 100)
if [ "$GPU" = 1 ]; then
  run_step pairs_1job 90 "$REPLAY" "${PAIR_ARGS[@]}" "$RESNET"
  run_step pairs_2jobs 90 "$REPLAY" "${PAIR_ARGS[@]}" "$RESNET" "$RESNET"
  if [ "$TORCH_BUILT" = 1 ]; then
    run_step torch_1job 60 "$BUILD/torch_caching_replay" --samples 11 --min-sample-ms 100 "$RESNET"
    run_step torch_2jobs 60 "$BUILD/torch_caching_replay" --samples 11 --min-sample-ms 100 "$RESNET" "$RESNET"
    run_step torch_footprint 60 "$BUILD/torch_caching_replay" --samples 1 --min-sample-ms 1 "$RESNET" "$TRANSFORMER"
  else
    note torch_replay skipped "torch_caching_replay not built (see the lines above)"
  fi
else
  # Host only (no CUDA device): the pool's own rows, to show the harness runs.
  run_step pairs_1job 60 "$REPLAY" "${PAIR_ARGS[@]}" --capacity 1073741824 "$RESNET"
  run_step pairs_2jobs 60 "$REPLAY" "${PAIR_ARGS[@]}" --capacity 1073741824 "$RESNET" "$RESNET"
fi

# ---- 6. sanitizers on a short replay (slowest: last)
if [ "$GPU" = 1 ] && [ "$CUDA_BUILT" = 1 ]; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      run_step "sanitizer_$tool" 90 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$REPLAY" --mode race --backend cuda --rules on --passes 1 --spin-ns 0 "$TRANSFORMER" "$SMALL"
    done
  else
    note sanitizers skipped "compute-sanitizer not found"
  fi
fi

note total ok "$(($(date +%s) - START)) s, gpu=$GPU cuda_backend=$CUDA_BUILT torch=$TORCH_BUILT"
