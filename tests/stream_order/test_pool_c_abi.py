"""The pool's C ABI (tf_plugin/allocator/pool_c_abi.h), the library PyTorch's
CUDAPluggableAllocator loads in benchmarks/gpu/torch_training.py, driven through ctypes on the
asynchronous host backend: allocate, free on a stream, the same stream's reuse at once, another
stream's reuse only after the pool waited for the freeing stream's ticket.

Built twice where the compilers are: with g++ (host backends only) and with nvcc (the CUDA
backend linked in, as check.sh builds it for the GPU), each loaded under its own file name, so
one process holds both. Skipped where no C++ compiler is found. On the lockstep backend nobody ticks, so a stream's queued work runs only
when the pool waits for it: every value read below is a function of the calls alone."""
import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.stream_order.test_cuda_backend_builds import find_nvcc

REPO = Path(__file__).resolve().parents[2]
CORE = ["tf_plugin/allocator/pool_c_abi.cc", "tf_plugin/allocator/stream_aware_pool.cc",
        "tf_plugin/allocator/async_host_backend.cc"]
MiB = 1 << 20
STITCH = 1
A, B = 0x1000, 0x2000   # stream handles: keys on the host backends


def _build(tmp: Path) -> dict[str, subprocess.Popen]:
    """Starts both builds at once (two cores); returns name -> process (output in tmp)."""
    procs = {}
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx:
        procs["g++"] = subprocess.Popen(
            [gxx, "-O1", "-std=c++17", f"-I{REPO}", "-pthread", "-fPIC", "-shared", "-fvisibility=hidden",
             *[str(REPO / s) for s in CORE], "-o", str(tmp / "libtensile_pool_c_host.so")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nvcc = find_nvcc()
    if nvcc:
        procs["nvcc"] = subprocess.Popen(
            [str(nvcc), "-O1", "-std=c++17", f"-I{REPO}", "-DTENSILE_WITH_CUDA",
             "-Xcompiler", "-pthread,-fPIC,-fvisibility=hidden", "-shared",
             *[str(REPO / s) for s in CORE], str(REPO / "tf_plugin/allocator/cuda_backend.cu"),
             "-o", str(tmp / "libtensile_pool_c_cuda.so")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return procs


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("c_abi")
    procs = _build(tmp)
    if not procs:
        pytest.skip("no C++ compiler (g++) nor nvcc on this machine")
    out = {}
    for name, proc in procs.items():
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"the C ABI library does not build with {name}:\n{log[-3000:]}"
        out[name] = tmp / ("libtensile_pool_c_host.so" if name == "g++" else "libtensile_pool_c_cuda.so")
    return out


class Pool:
    """The library's functions with their C types."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        vp, u64, i64 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64
        sig = {"tensile_pool_init": (ctypes.c_int, [ctypes.c_char_p, u64, ctypes.c_int]),
               "tensile_pool_shutdown": (ctypes.c_int, []),
               "tensile_pool_alloc": (vp, [ctypes.c_ssize_t, ctypes.c_int, vp]),
               "tensile_pool_free": (None, [vp, ctypes.c_ssize_t, ctypes.c_int, vp]),
               "tensile_pool_stats_json": (i64, [ctypes.c_char_p, u64]),
               "tensile_pool_last_error": (ctypes.c_char_p, []),
               "tensile_pool_enqueue_fill": (ctypes.c_int, [vp, vp, u64, u64]),
               "tensile_pool_enqueue_verify": (ctypes.c_int, [vp, vp, u64, u64]),
               "tensile_pool_drain_corruptions": (i64, [])}
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name.removeprefix("tensile_pool_"), fn)

    def stats(self) -> dict:
        n = self.stats_json(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        assert self.stats_json(buf, n + 1) == n
        return json.loads(buf.value)

    def error(self) -> str:
        return self.last_error().decode()


@pytest.fixture(params=["g++", "nvcc"])
def pool(request, built):
    if request.param not in built:
        pytest.skip(f"no {request.param} on this machine")
    p = Pool(built[request.param])
    yield p
    p.shutdown()


def word(addr: int) -> int:
    return ctypes.c_uint64.from_address(addr).value


def test_another_stream_reuses_a_free_only_after_its_ticket(pool):
    assert pool.init(b"async-host", 4 * MiB, 0) == 0, pool.error()
    x = pool.alloc(MiB, 0, A)
    assert x and pool.enqueue_fill(A, x, MiB, 0xA) == 0
    pool.free(x, MiB, 0, A)
    # Lockstep, nobody ticking: A's fill is still queued behind its free.
    assert word(x) == 0
    # The same stream takes its own free at once, without a wait (stream order covers it).
    y = pool.alloc(MiB, 0, A)
    assert y == x and pool.stats()["stream_waits"] == 0
    pool.free(y, MiB, 0, A)
    # Another stream does not: x is A's unsynced chunk; B is served from the synced rest.
    z = pool.alloc(MiB, 0, B)
    w = pool.alloc(2 * MiB, 0, B)
    assert z and w and x not in (z, w)
    assert pool.stats()["syncs"] == 0 and word(x) == 0
    # Only x's bytes are left: B gets them after the pool waited for A's ticket, so A's
    # queued fill has run by the time B holds the memory.
    v = pool.alloc(MiB, 0, B)
    assert v == x
    s = pool.stats()
    assert (s["syncs"], s["allocator_syncs"], s["stream_waits"]) == (1, 1, 1)
    assert word(x) == 0xA
    assert pool.enqueue_fill(B, v, MiB, 0xB) == 0 and pool.enqueue_verify(B, v, MiB, 0xB) == 0
    for p in (z, w, v):
        pool.free(p, 0, 0, B)
    assert pool.drain_corruptions() == 0
    s = pool.stats()
    assert s["current"] == 0 and s["invariant_error"] == ""
    streams = {e["handle"]: e for e in s["streams"]}
    assert streams[hex(A)]["peak"] == MiB and streams[hex(B)]["peak"] == 4 * MiB
    assert s["peak"] == 4 * MiB and s["num_allocs"] == 5


def test_stitched_allocation_through_the_abi(pool):
    """Note [Stitched allocations]: two 1 MiB holes apart serve one 2 MiB request through the
    window; the pattern kernels reach it there, and its free unmaps after the stream's wait."""
    assert pool.init(b"async-host", 4 * MiB, STITCH) == 0, pool.error()
    parts = [pool.alloc(MiB, 0, A) for _ in range(4)]
    pool.free(parts[0], 0, 0, A)
    pool.free(parts[2], 0, 0, A)
    big = pool.alloc(2 * MiB, 0, B)
    assert big and big not in parts
    s = pool.stats()
    assert s["stitched"] == 1 and s["stitched_current"] == 2 * MiB and s["stream_waits"] == 1
    assert pool.enqueue_fill(B, big, 2 * MiB, 0xC) == 0 and pool.enqueue_verify(B, big, 2 * MiB, 0xC) == 0
    pool.free(big, 0, 0, B)
    assert pool.stats()["stream_waits"] == 2   # B's work passed before the unmap
    assert pool.drain_corruptions() == 0
    assert word(parts[2]) == 0xC   # the window's bytes were the arena's
    for p in (parts[1], parts[3]):
        pool.free(p, 0, 0, A)
    assert pool.stats()["invariant_error"] == ""


def test_failures_say_why(pool):
    assert pool.init(b"tpu", MiB, 0) == -1
    assert "unknown backend 'tpu'" in pool.error() and "async-host" in pool.error()
    assert pool.init(b"async-host", 2 * MiB, 0) == 0
    assert pool.alloc(0, 0, A) is None                     # nothing to allocate
    assert pool.alloc(8 * MiB, 0, A) is None               # an OOM: null and the reason
    assert "out of memory" in pool.error() and "8.0 MiB" in pool.error()
    x = pool.alloc(MiB, 0, A)
    assert pool.enqueue_fill(A, x + 2 * MiB, 256, 1) == -1 and "not inside" in pool.error()
    assert pool.init(b"async-host", MiB, 0) == -1 and "live allocations" in pool.error()
    assert pool.shutdown() == -1 and "still allocated" in pool.error()
    pool.free(x, 0, 0, A)
    assert pool.stats()["num_ooms"] == 1


def test_first_allocation_makes_the_pool_from_the_environment(built):
    """Policy 1, as PyTorch uses it (no init call): in a fresh process."""
    path = next(iter(built.values()))
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.tensile_pool_alloc.restype = ctypes.c_void_p;"
            "lib.tensile_pool_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p];"
            "buf = ctypes.create_string_buffer(4096); p = lib.tensile_pool_alloc(1000, 0, None);"
            "lib.tensile_pool_stats_json(buf, 4096); print(p is not None, buf.value.decode())")
    env = {**os.environ, "TENSILE_POOL_BACKEND": "host", "TENSILE_POOL_BYTES": str(3 * MiB)}
    out = subprocess.run(["python3", "-c", code, str(path)], env=env, capture_output=True, text=True,
                         check=True).stdout
    ok, stats = out.split(" ", 1)
    s = json.loads(stats)
    assert ok == "True" and s["capacity"] == 3 * MiB and s["backend"] == "host"
    assert s["current"] == 1024 and s["streams"][0]["handle"] in ("(nil)", "0x0")
