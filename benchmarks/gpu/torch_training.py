"""Real training kernels through the pool (issue 44): two models training at once on two CUDA
streams in one process, through the pool (libtensile_pool_c.so, tf_plugin/allocator/pool_c_abi.h,
as PyTorch's CUDAPluggableAllocator: one pool for the process, one job per stream) and through
PyTorch's caching allocator on the same streams.

    python3 benchmarks/gpu/torch_training.py --lib benchmarks/gpu/.build/libtensile_pool_c.so
    python3 benchmarks/gpu/torch_training.py --dry-run      # the plan: no PyTorch, no GPU

An allocator can be chosen only before CUDA's first allocation, so each runs in a child process
of this script (``--child pool|caching``): the same three phases, ResNet50 alone, the
Transformer alone, both at once (torch_models.py), each job always on its own stream, seeds
fixed, deterministic algorithms on. This process compares, one JSON line per figure
("kind": "torch_training", printed by summarize.py):
  - losses: every step's loss, bit for bit, pool against caching allocator, and together
    against alone (a job's kernels do not depend on its neighbour's);
  - step time: median of both jobs' step together, pool / caching allocator;
  - footprint: the peak with both jobs against the sum of each job's peak alone (pool: live
    bytes; caching allocator: allocated and reserved bytes);
  - the pool's own counts: syncs, stream waits, stitched allocations, OOMs.
Exit status 1 when a child fails or the losses differ. Only the child imports PyTorch; every
other function here is pure and tested without it (tests/stream_order/test_torch_training.py)."""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
PHASES = (("resnet50",), ("transformer",), ("resnet50", "transformer"))
ALLOCATORS = ("pool", "caching")
GiB = 1 << 30
# Deterministic cuBLAS: a fixed workspace per stream (PyTorch's reproducibility notes); set
# before the child's first CUDA call.
CHILD_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=str(HERE / ".build" / "libtensile_pool_c.so"),
                   help="the pool's C ABI library (check.sh builds it)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per phase")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (losses still compared)")
    p.add_argument("--resnet-batch", type=int, default=8)
    p.add_argument("--transformer-batch", type=int, default=16)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--pool-gib", type=float, default=8.0, help="the pool's arena")
    p.add_argument("--no-stitch", action="store_true", help="a pool that never stitches")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (the caching child only: a check of the models)")
    p.add_argument("--child", choices=ALLOCATORS, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per child")
    p.add_argument("--out-dir", help="where each child's stderr is kept")
    p.add_argument("--dry-run", action="store_true", help="print the plan; import nothing")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    if args.child == "pool" and args.device != "cuda":
        p.error("the pool child needs --device cuda (PyTorch takes pluggable allocators for CUDA only)")
    return args


def child_command(args: argparse.Namespace, allocator: str) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", allocator, "--lib", args.lib,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--resnet-batch", str(args.resnet_batch),
           "--transformer-batch", str(args.transformer_batch), "--image", str(args.image),
           "--pool-gib", str(args.pool_gib), "--device", args.device]
    return cmd + (["--no-stitch"] if args.no_stitch else [])


def run_child(cmd: list[str], timeout: float, log: Path | None) -> dict:
    """Runs one child; returns its record, or {"failed": why}."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **CHILD_ENV})
    except subprocess.TimeoutExpired:
        return {"failed": f"over its {timeout:.0f} s"}
    if log is not None:
        log.write_text(done.stderr)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"kind": "torch_child"')]
    if done.returncode != 0 or not records:
        return {"failed": f"exit {done.returncode}: {done.stderr[-800:]}"}
    return records[-1]


# ------------------------------------------------------------------ comparisons (pure)

def phase_key(jobs: tuple[str, ...] | list[str]) -> str:
    return "+".join(jobs)


def first_difference(a: list[str], b: list[str]) -> int | None:
    """The first step whose losses (float.hex strings) differ, or None; a length mismatch
    counts at the shorter length."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_losses(pool: dict, caching: dict) -> dict:
    """Pool against caching allocator, every phase and job; and, per allocator, each job
    together against alone."""
    diffs = []
    for key, phase in caching["phases"].items():
        for job, losses in phase["losses"].items():
            d = first_difference(pool["phases"][key]["losses"][job], losses)
            if d is not None:
                diffs.append({"phase": key, "job": job, "step": d})
    together = phase_key(PHASES[-1])
    alone_equal = {}
    for name, record in (("pool", pool), ("caching", caching)):
        alone_equal[name] = all(
            first_difference(record["phases"][together]["losses"][job], record["phases"][job]["losses"][job]) is None
            for job in PHASES[-1])
    steps = len(caching["phases"][together]["losses"][PHASES[-1][0]])
    return {"figure": "losses", "equal_bitwise": not diffs, "differences": diffs, "steps_per_phase": steps,
            "together_equals_alone": alone_equal}


def compare_step_time(pool: dict, caching: dict) -> dict:
    together = phase_key(PHASES[-1])
    p = statistics.median(pool["phases"][together]["step_ms"])
    c = statistics.median(caching["phases"][together]["step_ms"])
    return {"figure": "step_time", "phase": together, "pool_ms": p, "caching_ms": c, "ratio": p / c}


def footprint(record: dict, allocator: str, measure: str) -> dict:
    """The peak with both jobs against the sum of each job's own peak, for one measure."""
    alone = [record["phases"][job][measure] for job in PHASES[-1]]
    together = record["phases"][phase_key(PHASES[-1])][measure]
    return {"figure": "footprint", "allocator": allocator, "measure": measure, "alone": alone,
            "together": together, "together_over_sum": together / sum(alone)}


def pool_counts(pool: dict) -> dict:
    """The pool's counts over the whole run, and in the phase with both jobs."""
    first, last = pool["phases"][PHASES[0][0]]["pool"], pool["phases"][phase_key(PHASES[-1])]["pool"]
    before = pool["phases"][PHASES[1][0]]["pool"]
    counts = ("syncs", "allocator_syncs", "stream_waits", "stitched", "num_ooms")
    return {"figure": "pool_stats", "backend": last["backend"], "capacity": last["capacity"],
            **{k: last[k] for k in counts}, "together": {k: last[k] - before[k] for k in counts},
            "invariant_error": last["invariant_error"], "first_phase_syncs": first["syncs"]}


def figures(pool: dict, caching: dict) -> list[dict]:
    out = [compare_losses(pool, caching), compare_step_time(pool, caching),
           footprint(pool, "pool", "peak_allocated"), footprint(caching, "caching", "peak_allocated"),
           footprint(caching, "caching", "peak_reserved"), pool_counts(pool)]
    return [{"kind": "torch_training", "device": caching.get("device", ""), **f} for f in out]


def main(argv: list[str] | None = None,
         runner: Callable[[list[str], float, Path | None], dict] = run_child) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    lib = Path(args.lib)
    if args.dry_run:
        print(json.dumps({"kind": "torch_training", "figure": "plan", "lib": str(lib), "lib_built": lib.is_file(),
                          "phases": [phase_key(p) for p in PHASES],
                          "children": [" ".join(child_command(args, a)) for a in ALLOCATORS]}))
        return 0
    if not lib.is_file():
        print(json.dumps({"kind": "torch_training", "figure": "not_run", "why": f"{lib} not built (check.sh builds it)"}))
        return 1
    out_dir = Path(args.out_dir) if args.out_dir else None
    records = {}
    for allocator in ALLOCATORS:
        log = out_dir / f"torch_training_{allocator}.log" if out_dir else None
        records[allocator] = runner(child_command(args, allocator), args.timeout, log)
    failed = {a: r["failed"] for a, r in records.items() if "failed" in r}
    for allocator, why in failed.items():
        print(json.dumps({"kind": "torch_training", "figure": "child_failed", "allocator": allocator, "why": why}))
    if failed:
        return 1
    out = figures(records["pool"], records["caching"])
    for f in out:
        print(json.dumps(f))
    return 0 if out[0]["equal_bitwise"] else 1


# ------------------------------------------------------------------ the child (PyTorch)

class PoolLibrary:
    """The pool's C ABI through ctypes (the same library PyTorch loads: one pool)."""

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.tensile_pool_init.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
        self.lib.tensile_pool_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
        self.lib.tensile_pool_stats_json.restype = ctypes.c_int64
        self.lib.tensile_pool_last_error.restype = ctypes.c_char_p

    def init(self, capacity: int, stitch: bool) -> None:
        if self.lib.tensile_pool_init(b"cuda", capacity, 1 if stitch else 0) != 0:
            raise SystemExit(f"tensile pool: {self.lib.tensile_pool_last_error().decode()}")

    def stats(self) -> dict:
        n = self.lib.tensile_pool_stats_json(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.tensile_pool_stats_json(buf, n + 1)
        return json.loads(buf.value)


def child_main(args: argparse.Namespace) -> None:
    import contextlib
    import gc

    import torch
    sys.path.insert(0, str(HERE))
    from torch_models import make_job

    pool = None
    if args.child == "pool":
        pool = PoolLibrary(args.lib)
        pool.init(int(args.pool_gib * GiB), not args.no_stitch)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(args.lib, "tensile_pool_alloc", "tensile_pool_free")
        torch.cuda.memory.change_current_allocator(allocator)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = args.device == "cuda"
    if cuda:
        for fused in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
            getattr(torch.backends.cuda, fused, lambda _: None)(False)
    device = torch.device(args.device)
    streams = {job: torch.cuda.Stream() if cuda else None for job in PHASES[-1]}
    seeds = {"resnet50": 1, "transformer": 2}
    batch = {"resnet50": args.resnet_batch, "transformer": args.transformer_batch}
    on = (lambda s: torch.cuda.stream(s)) if cuda else (lambda s: contextlib.nullcontext())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    record = {"kind": "torch_child", "allocator": args.child, "phases": {},
              "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    for names in PHASES:
        sync()
        gc.collect()
        if pool:
            pool.lib.tensile_pool_reset_peak()
        elif cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        jobs = []
        for name in names:
            with on(streams[name]):
                jobs.append(make_job(name, device, batch[name], args.image, seeds[name]))
        sync()
        step_ms = []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            for job in jobs:
                with on(streams[job.name]):
                    job.step(i)
            sync()
            if i >= args.warmup:
                step_ms.append((time.perf_counter() - t0) * 1e3)
        phase = {"step_ms": step_ms, "losses": {}}
        for job in jobs:
            with on(streams[job.name]):
                phase["losses"][job.name] = [float(x).hex() for x in torch.stack(job.losses).float().cpu().tolist()]
        sync()
        if pool:
            phase["pool"] = pool.stats()
            phase["peak_allocated"] = phase["pool"]["peak"]
        elif cuda:
            phase["peak_allocated"] = torch.cuda.max_memory_allocated()
            phase["peak_reserved"] = torch.cuda.max_memory_reserved()
        record["phases"][phase_key(names)] = phase
        del jobs, job   # every tensor of the phase freed before the next one's peak
    print(json.dumps(record))


if __name__ == "__main__":
    sys.exit(main())
