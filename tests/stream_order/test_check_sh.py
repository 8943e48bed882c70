"""benchmarks/gpu/check.sh survives the device image (issue 44): ``DRY_RUN=1`` with ``make`` taken
off PATH builds with Ninja, and with CMake gone too it builds with a plain compiler line; either
way every step's log lands in $OUT/logs, everything not built says why, and the table prints.

PATH is a folder of links to every program on the real PATH except the ones taken away, so
the script meets the same tools but those. CUDA=OFF keeps the dry run to the host build (the
CUDA build is tests/stream_order/test_cuda_backend_builds.py's and test_pool_c_abi.py's), so
each run takes about 30 s on two cores (25 of them the build). Skipped where no C++ compiler (or, for the Ninja run,
no CMake or Ninja) is found."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benchmarks" / "gpu" / "check.sh"


def path_without(tmp: Path, *removed: str) -> str:
    """A PATH of one folder linking every program on PATH but `removed`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bin_dir / entry.name
            if entry.name in removed or target.exists() or target.is_symlink():
                continue
            if entry.is_file() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    return str(bin_dir)


def dry_run(tmp: Path, path: str, **extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp / "out"
    env = {**os.environ, "PATH": path, "DRY_RUN": "1", "CUDA": "OFF", "OUT": str(out),
           "BUILD": str(tmp / "build"), "TOTAL_LIMIT": "240", **extra}
    for tool in ("CMAKE", "NINJA"):
        if tool not in extra:
            env.pop(tool, None)
    run = subprocess.run(["bash", str(CHECK)], env=env, capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in (out / "check.jsonl").read_text().splitlines()]
    return run, lines


def steps(lines: list[dict]) -> dict[str, dict]:
    return {e["step"]: e for e in lines if e["kind"] == "step"}


def assert_host_steps_ran(run, lines, out: Path):
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    s = steps(lines)
    for name in ("race_async_host", "arena", "torch_training_plan", "pairs_1job", "pairs_2jobs", "total"):
        assert s[name]["status"] == "ok", s[name]
    assert s["cuda_steps"]["status"] == "skipped"
    race = [e for e in lines if e["kind"] == "race"]
    assert [(e["rule"], e["corrupted_buffers"] == 0) for e in race] == [("on", True), ("off", False)]
    arena = {(e["backend"], e["piece_bytes"]): e["together_over_sum"] for e in lines if e["kind"] == "arena"}
    assert arena[("host", 0)] > arena[("host", 2 << 20)] > arena[("host", 4096)]
    plan = next(e for e in lines if e.get("figure") == "plan")
    assert plan["lib_built"] is True
    # Every step's log is in $OUT, and the table was printed.
    logs = {p.name for p in (out / "logs").iterdir()}
    assert {"race_async_host.log", "race_async_host.log.out", "arena.log.out"} <= logs
    assert "two jobs concurrently: smallest arena" in run.stdout
    return s


@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("g++")),
                    reason="needs cmake, ninja and g++ on PATH")
def test_dry_run_without_make_builds_with_ninja(tmp_path):
    path = path_without(tmp_path, "make", "gmake")
    # A compiler that links libstdc++ into shared libraries, as the H200 machine's /opt/gcc g++ did
    # (the C ABI library then crashed inside PyTorch): offered first (CXX), and passed over.
    static = tmp_path / "bin" / "static-g++"
    static.write_text('#!/bin/sh\nexec g++ -static-libstdc++ -static-libgcc "$@"\n')
    static.chmod(0o755)
    run, lines = dry_run(tmp_path, path, CXX=str(static))
    s = assert_host_steps_ran(run, lines, tmp_path / "out")
    assert s["C++ compiler"]["status"] not in (str(static), "static libstdc++"), s["C++ compiler"]
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "build" / "libtensile_pool_c.so")],
                            capture_output=True, text=True).stdout
    assert "libstdc++" in needed     # the library loads the process's C++ runtime
    probe = tmp_path / "build" / "cxx_probe.cc"   # the control: the static compiler does build a library...
    made = subprocess.run([str(static), "-shared", "-fPIC", "-o", str(tmp_path / "static.so"), str(probe)])
    if made.returncode == 0:                      # ... that needs no libstdc++.so: the check told them apart
        assert "libstdc++" not in subprocess.run(["readelf", "-d", str(tmp_path / "static.so")],
                                                 capture_output=True, text=True).stdout
    assert s["generator"]["status"] == "Ninja" and "make absent" in s["generator"]["detail"]
    assert s["configure"]["status"] == "ok" and s["build"]["status"] == "ok"
    # The parts that did not build say why, in a visible line each.
    assert s["CUDA backend"] == {"kind": "step", "step": "CUDA backend", "status": "not built",
                                 "detail": "-DTENSILE_CUDA=OFF"}
    assert s["PyTorch comparison"]["status"] == "not built" and s["PyTorch comparison"]["detail"]
    assert (tmp_path / "build" / "libtensile_pool_c.so").is_file()


@pytest.mark.slow   # the no-make run above covers the suite's dry run; this fallback costs another 30 s
@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++ on PATH")
def test_dry_run_without_cmake_builds_with_the_compiler(tmp_path):
    path = path_without(tmp_path, "make", "gmake", "cmake", "ninja")
    run, lines = dry_run(tmp_path, path, CMAKE="", NINJA="")   # pip's cmake, if any, too
    s = assert_host_steps_ran(run, lines, tmp_path / "out")
    assert s["generator"]["status"] == "plain compiler"
    assert s["build"]["status"] == "ok" and s["build_c_abi"]["status"] == "ok"
    assert s["PyTorch comparison"]["detail"] == "torch_caching_replay needs CMake with Ninja or make"
