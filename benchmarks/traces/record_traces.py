"""Records the allocation traces under benchmarks/traces/ from real TensorFlow runs.

Each trace is one training step of a model whose every tensor the device pool
served (the pool is TensorFlow's CPU allocator), recorded by
benchmarks/alloc_pair_bench.py's capture after warm-up steps and paired into
the "tensile-replay 1" text format (benchmarks/alloc_replay.cc documents it).
Op names are dropped (``names 1 -``) to keep the files small; the sizes, the
order and the pairing are the run's.

The race test (tests/pool/test_stream_race.py) and benchmarks/gpu/check.sh
replay them without TensorFlow, one job per stream. Recording needs the
installed project (TensorFlow and the plugin); replaying does not.

Usage:
    PYTHONPATH=. python benchmarks/traces/record_traces.py          # all traces
    PYTHONPATH=. python benchmarks/traces/record_traces.py resnet50_64px_b8
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import alloc_pair_bench  # noqa: E402  (benchmarks/ on the path above)

# name -> alloc_pair_bench arguments. One recorded step each, after 3 warm-up steps.
TRACES = {
    "resnet50_64px_b8": {"model": "resnet50", "image_size": 64, "batch": 8},
    "transformer_encoder_b32": {"model": "transformer_encoder", "image_size": 0, "batch": 32},
    "small_cnn_b64": {"model": "small_cnn", "image_size": 0, "batch": 64},
}


def strip_names(replay_text: str) -> str:
    """The replay text with every op name replaced by '-' (name index 0)."""
    lines = replay_text.splitlines()
    assert lines[0] == "tensile-replay 1" and lines[1].startswith("names ")
    n_names = int(lines[1].split()[1])
    out = ["tensile-replay 1", "names 1", "-"]
    for line in lines[2 + n_names:]:
        parts = line.split()
        if parts and parts[0] == "A":
            parts[-1] = "0"
        elif parts and parts[0] == "F":
            parts[-1] = "0"
        out.append(" ".join(parts))
    return "\n".join(out) + "\n"


def record(name: str) -> Path:
    spec = TRACES[name]
    args = argparse.Namespace(
        model=spec["model"], image_size=spec["image_size"] or 64, batch=spec["batch"],
        warmup_steps=3, window_steps=1, pool_bytes="4GiB",
    )
    with tempfile.TemporaryDirectory() as tmp:
        trace_json = Path(tmp) / "trace.json"
        alloc_pair_bench.record_trace(args, trace_json)
        trace = json.loads(trace_json.read_text())
        replay = Path(tmp) / "trace.replay"
        summary = alloc_pair_bench.build_replay(trace, replay)
        out = HERE / f"{name}.replay"
        out.write_text(strip_names(replay.read_text()))
    print(f"{out.relative_to(HERE.parent.parent)}: {summary['pairs']} pairs, "
          f"{summary['persistent_chunks']} persistent chunks ({trace['model']}, "
          f"TensorFlow {trace['tensorflow']})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", choices=[[], *TRACES], default=[], help="traces to record (default: all)")
    args = p.parse_args()
    for name in args.names or TRACES:
        record(name)


if __name__ == "__main__":
    main()
