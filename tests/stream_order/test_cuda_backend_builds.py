"""The CUDA backend compiles wherever a CUDA compiler is (issue 41): nvcc on the PATH, under
CUDA_HOME, or the registries' compiler (``pip install -e ".[cuda-build]"``: nvidia-cuda-nvcc,
-runtime, -crt and nvidia-nvvm, under site-packages/nvidia; checked with 13.5). Skipped otherwise; the CPU build,
the TensorFlow plugin and CI's default run never need it.

The build is the one benchmarks/gpu/CMakeLists.txt makes for pool_replay (-DTENSILE_WITH_CUDA),
done with nvcc directly so that the test needs no CMake. The binary then runs its host modes
(the check.sh dry run) and, without a GPU, refuses the CUDA backend with CUDA's own reason."""
import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "benchmarks" / "traces"
SOURCES = [
    "tf_plugin/allocator/cuda_backend.cu",
    "benchmarks/gpu/cuda_baselines.cu",
    "tf_plugin/allocator/stream_aware_pool.cc",
    "tf_plugin/allocator/async_host_backend.cc",
    "tf_plugin/allocator/trace_replay.cc",
    "benchmarks/gpu/pool_replay.cc",
]


def find_nvcc() -> Path | None:
    candidates = [shutil.which("nvcc")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    nvidia = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    candidates += [str(p) for p in sorted(nvidia.glob("*/bin/nvcc"))]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def pool_replay_cuda(tmp_path_factory) -> Path:
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("no CUDA compiler (nvcc) on this machine; pip install -e '.[cuda-build]' "
                    "(the registries' nvcc 13) to build the CUDA backend here")
    exe = tmp_path_factory.mktemp("cuda") / "pool_replay"
    root = nvcc.parent.parent
    libdirs = [d for d in (root / "lib64", root / "lib") if d.is_dir()]
    cmd = [str(nvcc), "-O2", "-std=c++17", f"-I{REPO}", "-DTENSILE_WITH_CUDA", "-Xcompiler", "-pthread",
           *[str(REPO / s) for s in SOURCES], *[f"-L{d}" for d in libdirs],
           *[f"-Xlinker=-rpath,{d}" for d in libdirs], "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert built.returncode == 0, f"the CUDA backend does not compile:\n{built.stderr[-3000:]}"
    return exe


def test_cuda_backend_compiles_and_the_harness_runs_its_host_modes(pool_replay_cuda):
    out = subprocess.run([str(pool_replay_cuda), "--mode", "race", "--backend", "async-host",
                          str(TRACES / "transformer_encoder_b32.replay"), str(TRACES / "small_cnn_b64.replay")],
                         capture_output=True, text=True, check=True).stdout
    on, off = (json.loads(line) for line in out.splitlines())
    assert (on["rule"], on["corrupted_buffers"], on["reuses_before_sync"]) == ("on", 0, 0)
    assert off["rule"] == "off" and off["reuses_before_sync"] > 0


def test_without_a_gpu_the_cuda_backend_says_why(pool_replay_cuda):
    run = subprocess.run([str(pool_replay_cuda), "--mode", "race", "--backend", "cuda", "--rules", "on",
                          str(TRACES / "small_cnn_b64.replay")], capture_output=True, text=True)
    if run.returncode == 0:  # a GPU is here: then the rule holds on it
        r = json.loads(run.stdout.splitlines()[0])
        assert r["corrupted_buffers"] == 0 and r["backend"].startswith("cuda")
        return
    assert run.returncode == 1
    assert run.stderr.startswith("pool_replay: CUDA backend: cudaSetDevice: "), run.stderr
