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
        rows.append([" + ".join(e["traces"]), "yes" if e["stitch"] else "no",
                     " + ".join(f"{b / MiB:.0f}" for b in e["smallest_arena_alone"]),
                     f"{e['smallest_arena_together'] / MiB:.0f}", f"{e['together_over_sum']:.3f}",
                     "PASS" if e["together_over_sum"] <= 1.05 else "FAIL"])
    footprint = [e for e in lines if e["kind"] == "pair_cost" and len(set(e.get("traces", []))) > 1]
    for e in footprint:
        rows.append([" + ".join(e["traces"]), "(PyTorch, one stream per job)", "-",
                     f"{e['footprint_peak'] / MiB:.0f} reserved peak", "-", "-"])
    table("two jobs concurrently: smallest arena (MiB) against the sum of their own (goal <= 1.05x)",
          ["jobs", "stitching", "alone", "together", "together / sum", "goal"], rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "check.jsonl")
