"""The table of benchmarks/gpu/check.sh from its JSON lines (standard library only:
the GPU machines have no project dependencies).

    python3 benchmarks/gpu/summarize.py check.jsonl
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MiB = 1 << 20


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    if not rows:
        return
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")


def main(path: str) -> None:
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.startswith("{")]
    steps = [e for e in lines if e["kind"] == "step"]
    table("steps", ["step", "status", "detail"],
          [[e["step"], e["status"], e["detail"][:100]] for e in steps])

    race = [e for e in lines if e["kind"] == "race"]
    rows = []
    for e in race:
        if e["rule"] == "on":
            verdict = "PASS" if e["corrupted_buffers"] == 0 and e["reuses_before_sync"] == 0 else "FAIL"
        else:
            verdict = "detected" if e["corrupted_buffers"] > 0 else "NOT DETECTED"
        rows.append([e["backend"], e["device"], e["rule"], e["jobs"], e["pairs"], e["corrupted_buffers"],
                     e["reuses_before_sync"], e["cross_stream_reuses"], e["syncs"], e["stream_waits"],
                     f"{e['capacity'] / MiB:.0f}", verdict])
    table("race test (traces replayed concurrently, pattern kernels on every buffer)",
          ["backend", "device", "rule", "jobs", "pairs", "corrupted", "reuse before sync",
           "cross-stream reuse", "syncs", "stream waits", "arena MiB", "verdict"], rows)

    pairs = [e for e in lines if e["kind"] == "pair_cost" and len(set(e.get("traces", []))) <= 1]
    by_alloc: dict[str, dict[int, dict]] = {}
    for e in pairs:
        by_alloc.setdefault(e["allocator"], {})[e["jobs"]] = e
    torch = next((v for k, v in by_alloc.items() if k.startswith("PyTorch")), {})
    rows = []
    for name, per in by_alloc.items():
        cells = [name, next(iter(per.values())).get("device", "")]
        for jobs in (1, 2):
            e = per.get(jobs)
            ns = statistics.median(e["cpu_ns_per_pair"]) if e else None
            t = torch.get(jobs)
            rel = f" ({ns / statistics.median(t['cpu_ns_per_pair']):.2f}x PyTorch)" if ns and t else ""
            cells.append(f"{ns:,.0f}{rel}" if ns else "-")
        rows.append(cells)
    table("CPU ns per allocate/free pair (median; ResNet50 64x64 batch 8 trace; 2 jobs = two copies on two streams)",
          ["allocator", "device", "1 job", "2 jobs"], rows)

    rows = []
    for e in (x for x in lines if x["kind"] == "arena"):
        pieces = e.get("piece_bytes", 4096 if e["stitch"] else 0)
        stitch = "no" if not e["stitch"] else (f"{pieces / MiB:.0f} MiB pieces" if pieces >= MiB
                                               else f"{pieces // 1024} KiB pieces")
        rows.append([" + ".join(e["traces"]), e.get("backend", "host"), stitch,
                     " + ".join(f"{b / MiB:.0f}" for b in e["smallest_arena_alone"]),
                     f"{e['smallest_arena_together'] / MiB:.0f}", f"{e['together_over_sum']:.3f}",
                     "PASS" if e["together_over_sum"] <= 1.05 else "FAIL"])
    footprint = [e for e in lines if e["kind"] == "pair_cost" and len(set(e.get("traces", []))) > 1]
    for e in footprint:
        rows.append([" + ".join(e["traces"]), "PyTorch", "(one stream per job)", "-",
                     f"{e['footprint_peak'] / MiB:.0f} reserved peak", "-", "-"])
    table("two jobs concurrently: smallest arena (MiB) against the sum of their own (goal <= 1.05x)",
          ["jobs", "backend", "stitching", "alone", "together", "together / sum", "goal"], rows)
    torch_training(lines)


def torch_training(lines: list[dict]) -> None:
    """torch_training.py's figures: two models on two streams, pool against caching allocator."""
    rows = []
    for e in (x for x in lines if x["kind"] == "torch_training"):
        f = e["figure"]
        if f == "losses":
            value = "bit for bit" if e["equal_bitwise"] else f"DIFFER: {e['differences'][:3]}"
            rows.append(["losses, pool vs caching", value, f"{e['steps_per_phase']} steps per phase; together = "
                         f"alone: {e['together_equals_alone']}", "PASS" if e["equal_bitwise"] else "FAIL"])
        elif f == "step_time":
            rows.append(["step time, both jobs", f"{e['ratio']:.3f}x",
                         f"pool {e['pool_ms']:.1f} ms, caching {e['caching_ms']:.1f} ms", ""])
        elif f == "footprint":
            rows.append([f"peak, {e['allocator']} ({e['measure']})", f"{e['together_over_sum']:.3f}x sum",
                         f"alone {' + '.join(f'{b / MiB:.0f}' for b in e['alone'])} MiB, "
                         f"together {e['together'] / MiB:.0f} MiB", ""])
        elif f == "pool_stats":
            rows.append(["pool counts", f"{e['syncs']} syncs, {e['stream_waits']} stream waits",
                         f"{e['stitched']} stitched, {e['num_ooms']} OOMs; both jobs: {e['together']}; "
                         f"{e['backend']}", "FAIL" if e["invariant_error"] else ""])
        elif f in ("child_failed", "not_run"):
            rows.append([f, e.get("allocator", ""), e.get("why", "")[:100], "FAIL"])
        elif f == "plan":
            rows.append(["plan (dry run)", f"library built: {e['lib_built']}", " / ".join(e["phases"]), ""])
    table("two models training at once on two streams (ResNet50 224x224 + Transformer encoder)",
          ["figure", "value", "detail", "verdict"], rows)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "check.jsonl")
