"""Allocate/free pair cost of the device pool on a real model's allocation pattern.

1. Record: a subprocess imports tensile_tf (so the StreamAwarePool is
   TensorFlow's CPU allocator), trains keras.applications.ResNet50
   (weights=None) for a few steps, and dumps the pool's event trace of the
   last steps together with the chunks live when that window began.
2. Pair: every free is matched to its allocation by arena offset. Chunks live
   at the window's start and never freed in it (variables, ...) become
   "persistent" allocations made once, untimed; chunks live at the start and
   freed in the window are allocated at the start of each pass; chunks still
   live at the end are freed at the end of each pass. So one pass makes each
   allocation once and frees it once, and passes can repeat.
3. Replay: benchmarks/alloc_replay.cc (compiled here with TensorFlow's
   compile/link flags, cached under benchmarks/.build/) replays the exact
   sequence in C++ against the tensile pool, tsl::BFCAllocator (as
   TF_CPU_ALLOCATOR_USE_BFC=1 builds it), TensorFlow's default CPU allocator
   (tsl::cpu_allocator(), no plugin loaded) and plain aligned malloc, and
   reports nanoseconds per allocate/free pair (median over samples).

Usage:
    PYTHONPATH=. python benchmarks/alloc_pair_bench.py            # full run
    PYTHONPATH=. python benchmarks/alloc_pair_bench.py --quick    # ~1 minute
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
BUILD_DIR = BENCH_DIR / ".build"
REPLAY_SOURCE = BENCH_DIR / "alloc_replay.cc"
POOL_SOURCES = [
    REPO / "tf_plugin/allocator/stream_aware_pool.cc",
    REPO / "tf_plugin/allocator/device_pool.cc",
]
POOL_HEADERS = [
    REPO / "tf_plugin/allocator/stream_aware_pool.h",
    REPO / "tf_plugin/allocator/device_pool.h",
    REPO / "tf_plugin/allocator/event_trace.h",
    REPO / "tf_plugin/allocator/free_chunk_set.h",
    REPO / "tf_plugin/allocator/pool_backend.h",
]
ALLOCATORS = [
    ("tensile_pool", "StreamAwarePool via the TF adapter path, trace on (production)"),
    ("tensile_pool_notrace", "same, event trace off"),
    ("tensile_pool_core", "pool Allocate/Deallocate only, no op name, trace off"),
    ("bfc", "tsl::BFCAllocator + BasicCPUAllocator (TF_CPU_ALLOCATOR_USE_BFC=1)"),
    ("tf_default", "tsl::cpu_allocator(), TF's CPU allocator without plugin"),
    ("aligned_malloc", "tsl::port::AlignedMalloc/AlignedFree, alignment 64"),
    ("noop", "no allocator: harness cost (loop + annotations), subtracted in 'net'"),
]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


# ----------------------------------------------------------------- recording


def capture(args: argparse.Namespace) -> None:
    """Runs in a subprocess: trains the model with the pool, dumps the trace."""
    import tensorflow as tf

    import tensile_tf

    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    from tf_plugin import device_pool

    import keras

    pool = device_pool()
    model, input_shape, description = build_model(args)
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x = tf.random.normal((args.batch, *input_shape))
    y = tf.random.uniform((args.batch,), 0, 10, tf.int32)

    @tf.function(jit_compile=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(args.warmup_steps):
        train_step(x, y).numpy()
    live = [c for c in pool.chunks() if c["in_use"]]
    pool.clear_trace()
    t0 = time.perf_counter()
    for _ in range(args.window_steps):
        train_step(x, y).numpy()
    seconds = time.perf_counter() - t0
    trace = pool.trace()
    stats = tensile_tf.pool_stats()
    if stats["trace_dropped"]:
        sys.exit(
            f"capture: the pool trace dropped {stats['trace_dropped']} events; "
            "record fewer --window-steps"
        )
    events = [
        {k: e[k] for k in ("kind", "stream", "bytes", "offset", "op")}
        for e in trace
        if e["kind"] in ("alloc", "free")
    ]
    Path(args.capture).write_text(
        json.dumps(
            {
                "model": f"{description}, batch {args.batch}, SGD",
                "warmup_steps": args.warmup_steps,
                "window_steps": args.window_steps,
                "window_seconds": seconds,
                "tensorflow": tf.__version__,
                "pool_stats": {k: v for k, v in stats.items() if k != "jobs"},
                "live_at_start": [
                    {"offset": c["offset"], "size": c["size"], "owner": c["owner"]} for c in live
                ],
                "events": events,
            }
        )
    )


MODELS = ("resnet50", "transformer_encoder", "small_cnn", "residual_net", "mlp")


def build_model(args: argparse.Namespace):
    """The model to record: (keras.Model, input shape, description)."""
    import keras

    if args.model == "resnet50":
        shape = (args.image_size, args.image_size, 3)
        model = keras.applications.ResNet50(weights=None, input_shape=shape, classes=10)
        return model, shape, f"keras.applications.ResNet50(weights=None), {args.image_size}x{args.image_size}x3"
    from tensile_tf.jobs import zoo

    model = getattr(zoo, args.model)()
    shape = tuple(model.input_shape[1:])
    return model, shape, f"tensile_tf.jobs.zoo:{args.model}, input {shape}"


def record_trace(args: argparse.Namespace, path: Path) -> None:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--capture",
        str(path),
        "--model",
        args.model,
        "--image-size",
        str(args.image_size),
        "--batch",
        str(args.batch),
        "--warmup-steps",
        str(args.warmup_steps),
        "--window-steps",
        str(args.window_steps),
    ]
    print(f"recording: {args.model} ({args.image_size}px if an image model) batch {args.batch}, "
          f"{args.warmup_steps} warm-up + {args.window_steps} recorded steps ...", flush=True)
    subprocess.run(cmd, check=True, env=_env(TENSILE_POOL_BYTES=args.pool_bytes))


# ------------------------------------------------------------------- pairing


def build_replay(trace: dict, path: Path) -> dict:
    """Turns the recorded window into alloc_replay's input; returns summary numbers."""
    names: dict[str, int] = {}

    def name_index(op: str) -> int:
        op = op.replace(" ", "_").replace("\n", "_") or "-"
        return names.setdefault(op, len(names))

    start_live = {c["offset"]: c for c in trace["live_at_start"]}
    live: dict[int, int] = {}  # offset -> slot, for allocations of this window
    slot_bytes: list[int] = []
    prologue: list[str] = []  # chunks live at start, freed in the window
    body: list[str] = []
    unmatched = 0
    size_mismatch = 0
    freed_from_start: set[int] = set()
    for e in trace["events"]:
        off = e["offset"]
        if e["kind"] == "alloc":
            if off in live or (off in start_live and off not in freed_from_start):
                raise SystemExit(f"pairing: offset {off} allocated twice without a free")
            slot = len(slot_bytes)
            slot_bytes.append(e["bytes"])
            live[off] = slot
            body.append(f"A {slot} {e['bytes']} {e['stream']} {name_index(e['op'])}")
        else:
            if off in live:
                slot = live.pop(off)
                if slot_bytes[slot] != e["bytes"]:
                    size_mismatch += 1
            elif off in start_live and off not in freed_from_start:
                c = start_live[off]
                freed_from_start.add(off)
                slot = len(slot_bytes)
                slot_bytes.append(c["size"])
                if c["size"] != e["bytes"]:
                    size_mismatch += 1
                prologue.append(f"A {slot} {c['size']} {max(c['owner'], 0)} {name_index('')}")
            else:
                unmatched += 1
                continue
            body.append(f"F {slot} {name_index(e['op'])}")
    if unmatched or size_mismatch:
        raise SystemExit(
            f"pairing: {unmatched} frees match no allocation and {size_mismatch} sizes differ; "
            "the trace is inconsistent"
        )
    epilogue = [f"F {slot} {name_index('')}" for slot in live.values()]
    persistent = [c for off, c in start_live.items() if off not in freed_from_start]
    timed = prologue + body + epilogue
    name_list = [""] * len(names)
    for n, i in names.items():
        name_list[i] = n
    lines = ["tensile-replay 1", f"names {len(name_list)}", *name_list,
             f"persistent {len(persistent)}",
             *(f"{c['size']} {max(c['owner'], 0)}" for c in persistent),
             f"timed {len(timed)} {len(slot_bytes)}", *timed]
    path.write_text("\n".join(lines) + "\n")
    sizes = sorted(slot_bytes)
    return {
        "pairs": len(slot_bytes),
        "window_allocs": sum(1 for e in trace["events"] if e["kind"] == "alloc"),
        "live_at_start_freed": len(prologue),
        "live_at_end_freed": len(epilogue),
        "persistent_chunks": len(persistent),
        "persistent_bytes": sum(c["size"] for c in persistent),
        "distinct_sizes": len(set(sizes)),
        "median_bytes": sizes[len(sizes) // 2],
        "max_bytes": sizes[-1],
        "share_below_256KiB": sum(1 for s in sizes if s < 262144) / len(sizes),
        "streams": sorted(Counter(e["stream"] for e in trace["events"]).keys()),
    }


# ------------------------------------------------------------------ building


def tf_flags() -> tuple[list[str], list[str], str]:
    out = subprocess.run(
        [sys.executable, "-c",
         "import json, os, tensorflow as tf; print(json.dumps([tf.sysconfig.get_compile_flags(), "
         "tf.sysconfig.get_link_flags(), os.path.dirname(tf.__file__)]))"],
        check=True, capture_output=True, text=True, env=_env(),
    ).stdout.strip().splitlines()[-1]
    cflags, lflags, lib_dir = json.loads(out)
    return cflags, lflags, lib_dir


def build_replayer() -> Path:
    cxx = os.environ.get("CXX", "g++")
    cflags, lflags, lib_dir = tf_flags()
    cmd_flags = (["-O2", "-std=c++17", "-Wno-deprecated-declarations"]
                 + [f for f in cflags if not f.startswith("--std")] + [f"-I{REPO}"])
    link = lflags + [f"-Wl,-rpath,{lib_dir}"]
    digest = hashlib.sha256()
    for f in [REPLAY_SOURCE, *POOL_SOURCES, *POOL_HEADERS]:
        digest.update(f.read_bytes())
    digest.update(" ".join([cxx, *cmd_flags, *link]).encode())
    exe = BUILD_DIR / f"alloc_replay-{digest.hexdigest()[:12]}"
    if exe.exists():
        return exe
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [cxx, *cmd_flags, str(REPLAY_SOURCE), *map(str, POOL_SOURCES), *link, "-o", str(exe)]
    print("compiling alloc_replay.cc (about 15 s) ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"  built {exe.relative_to(REPO)} in {time.perf_counter() - t0:.0f} s", flush=True)
    return exe


# ------------------------------------------------------------------- running


def run_replay(exe: Path, replay: Path, args: argparse.Namespace) -> list[dict]:
    cmd = [str(exe), str(replay), "--samples", str(args.samples),
           "--min-sample-ms", str(args.min_sample_ms),
           "--allocators", ",".join(args.allocators)]
    print(f"replaying: {' '.join(cmd[1:])}", flush=True)
    # No TENSILE/BFC variables: the replayer must see TF's own default allocator.
    env = {k: v for k, v in _env().items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def print_table(results: list[dict], summary: dict) -> None:
    medians = {r["allocator"]: statistics.median(r["ns_per_pair"]) for r in results}
    base = medians.get("noop", 0.0)
    bfc_net = medians["bfc"] - base if "bfc" in medians else None
    print()
    print(f"pairs per pass: {summary['pairs']}  (ResNet50 trace, "
          f"{summary['share_below_256KiB']:.0%} below 256 KiB, median {summary['median_bytes']} B, "
          f"{summary['persistent_chunks']} persistent chunks)")
    header = (f"{'allocator':<22} {'median':>8} {'min':>8} {'max':>8} {'net':>8} {'net/BFC':>8}"
              f" {'wall':>8}  name")
    print(header)
    print(f"{'':<22} {'ns/pair':>8} {'':>8} {'':>8} {'ns/pair':>8} {'':>8} {'ns/pair':>8}")
    print("-" * (len(header) + 16))
    for r in results:
        v = r["ns_per_pair"]
        med = medians[r["allocator"]]
        net = med - base
        rel = f"{net / bfc_net:7.2f}x" if bfc_net and r["allocator"] != "noop" else "       -"
        wall = statistics.median(r["wall_ns_per_pair"])
        print(f"{r['allocator']:<22} {med:8.1f} {min(v):8.1f} {max(v):8.1f} {net:8.1f} {rel:>8}"
              f" {wall:8.1f}  {r['name']}")
    print()
    print("median/min/max: thread CPU time per pair over samples; net = median minus the noop row "
          "(the replay loop's own cost);\nwall: median wall-clock time per pair (includes waiting "
          "for a core on a shared machine)")
    for key, text in ALLOCATORS:
        if key in medians:
            print(f"  {key:<22} {text}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run: 1 recorded step, 5 samples")
    p.add_argument("--model", choices=MODELS, default="resnet50",
                   help="resnet50 (keras.applications) or a tensile_tf.jobs.zoo builder at its defaults")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--window-steps", type=int, default=4)
    p.add_argument("--pool-bytes", default="4GiB", help="TENSILE_POOL_BYTES while recording")
    p.add_argument("--samples", type=int, default=21, help="timed samples per allocator")
    p.add_argument("--min-sample-ms", type=float, default=200.0)
    p.add_argument("--allocators", default=",".join(k for k, _ in ALLOCATORS))
    p.add_argument("--trace", type=Path, default=None,
                   help="use this recorded trace (JSON) instead of recording one")
    p.add_argument("--json", type=Path, default=None, help="also write results here")
    p.add_argument("--capture", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.capture:
        capture(args)
        return
    if args.quick:
        args.warmup_steps, args.window_steps = 2, 1
        args.samples, args.min_sample_ms = 5, 100.0
    args.allocators = [a for a in args.allocators.split(",") if a]

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    exe = build_replayer()
    trace_path = args.trace
    if trace_path is None:
        trace_path = BUILD_DIR / (f"{args.model}_{args.image_size}px_b{args.batch}_"
                                  f"{args.window_steps}steps_trace.json")
        record_trace(args, trace_path)
    trace = json.loads(trace_path.read_text())
    replay_path = trace_path.with_suffix(".replay")
    summary = build_replay(trace, replay_path)
    results = run_replay(exe, replay_path, args)
    print_table(results, summary)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
            "model": trace["model"], "tensorflow": trace["tensorflow"],
            "window_steps": trace["window_steps"], "summary": summary,
            "results": [dict(r, median=statistics.median(r["ns_per_pair"])) for r in results],
            "noop_median": next((statistics.median(r["ns_per_pair"]) for r in results
                                 if r["allocator"] == "noop"), 0.0),
        }, indent=1))


if __name__ == "__main__":
    main()
