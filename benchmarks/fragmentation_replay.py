"""Fragmentation benchmark (pool placement policy): record the pool's event
trace of a real run, then replay its allocations and frees against placement
policies and find, for each, the smallest arena that serves the whole trace.
The ratio smallest-arena / peak-bytes is the headroom a policy needs.

    python benchmarks/fragmentation_replay.py record CONFIG.yaml TRACE.json
    python benchmarks/fragmentation_replay.py replay TRACE.json

`record` runs the config's jobs (admission none) in a 1 GiB pool. `replay`
models StreamAwarePool exactly (256-byte chunks, per-stream unsynced sets,
coalescing only within a set, sync-and-coalesce when nothing else fits, the
trace's explicit syncs) and varies only where a request is placed:

- seed-order: Waterwave Listing 1: best fit in the stream's own unsynced
  chunks first, then in the synced chunks;
- best-fit-across: best fit over own unsynced and synced chunks together
  (what the pool does; Note [Best fit across own and synced]);
- best-fit-across+high-end: the same, but requests of 1 MiB or more are
  carved from the high end of their chunk (large and small apart).

(A fourth policy, long-lived allocations cut from the arena's top, was
prototyped in the pool itself and measured here; it was not adopted:
benchmarks/RESULTS.md, "Fragmentation".)

`record` keeps every event: it sets TENSILE_POOL_TRACE_EVENTS (the ring's
size) before the pool exists.

The replay is a pure-Python model of the C++ pool (the pool itself places
each request at one offset, so a recorded run cannot be replayed through it
with another policy).
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import sys

MIN_CHUNK = 256
LARGE = 1 << 20
SYNCED = -1
POLICIES = ("seed-order", "best-fit-across", "best-fit-across+high-end")


class ReplayPool:
    """StreamAwarePool's bookkeeping with a pluggable placement policy."""

    def __init__(self, capacity: int, policy: str):
        self.policy = policy
        self.offsets = [0]
        self.chunks = {0: [capacity, SYNCED, False]}  # offset -> [size, owner, live]
        self.free_sets: dict[int, set[int]] = {SYNCED: {0}}  # owner -> offsets of its free chunks

    def _mark_free(self, offset: int, owner: int) -> None:
        self.free_sets.setdefault(owner, set()).add(offset)

    def _unmark_free(self, offset: int) -> None:
        self.free_sets[self.chunks[offset][1]].discard(offset)

    def _free_chunks(self, owner: int) -> list[tuple[int, int]]:
        return [(o, self.chunks[o][0]) for o in self.free_sets.get(owner, ())]

    def _best_fit(self, candidates, n: int):
        fits = [(size, o) for o, size in candidates if size >= n]
        return min(fits) if fits else None

    def _carve(self, size: int, offset: int, n: int, stream: int) -> int:
        owner = self.chunks[offset][1]
        self._unmark_free(offset)
        if size - n < MIN_CHUNK:
            self.chunks[offset] = [size, stream, True]
            return offset
        if self.policy.endswith("high-end") and n >= LARGE:
            self.chunks[offset] = [size - n, owner, False]
            self._mark_free(offset, owner)
            at = offset + size - n
            self.chunks[at] = [n, stream, True]
            bisect.insort(self.offsets, at)
            return at
        self.chunks[offset] = [n, stream, True]
        self.chunks[offset + n] = [size - n, owner, False]
        self._mark_free(offset + n, owner)
        bisect.insort(self.offsets, offset + n)
        return offset

    def allocate(self, nbytes: int, stream: int) -> int | None:
        n = max(1, -(-nbytes // MIN_CHUNK)) * MIN_CHUNK
        if self.policy == "seed-order":
            fit = self._best_fit(self._free_chunks(stream), n) or self._best_fit(self._free_chunks(SYNCED), n)
        else:
            fit = self._best_fit(self._free_chunks(stream) + self._free_chunks(SYNCED), n)
        if fit is None:
            self.sync()
            fit = self._best_fit(self._free_chunks(SYNCED), n)
        return None if fit is None else self._carve(*fit, n, stream)

    def _merge(self, a: int, b: int) -> None:
        """Merges free chunk b into its lower neighbour a (both unmarked)."""
        self.chunks[a][0] += self.chunks[b][0]
        del self.chunks[b]
        del self.offsets[bisect.bisect_left(self.offsets, b)]

    def free(self, offset: int) -> None:
        chunk = self.chunks[offset]
        chunk[2] = False
        stream = chunk[1]
        i = bisect.bisect_left(self.offsets, offset)
        nxt = self.offsets[i + 1] if i + 1 < len(self.offsets) else None
        prev = self.offsets[i - 1] if i > 0 else None
        if nxt is not None and not self.chunks[nxt][2] and self.chunks[nxt][1] == stream:
            self._unmark_free(nxt)
            self._merge(offset, nxt)
        if prev is not None and not self.chunks[prev][2] and self.chunks[prev][1] == stream:
            self._unmark_free(prev)
            self._merge(prev, offset)
            offset = prev
        self._mark_free(offset, stream)

    def sync(self) -> None:
        for c in self.chunks.values():
            if not c[2]:
                c[1] = SYNCED
        i = 0
        while i < len(self.offsets) - 1:
            a, b = self.offsets[i], self.offsets[i + 1]
            if not self.chunks[a][2] and not self.chunks[b][2]:
                self._merge(a, b)
            else:
                i += 1
        self.free_sets = {SYNCED: {o for o, c in self.chunks.items() if not c[2]}}


def serves(trace: list[dict], capacity: int, policy: str) -> bool:
    pool, where = ReplayPool(capacity, policy), {}
    for e in trace:
        if e["kind"] == "alloc":
            at = pool.allocate(e["bytes"], e["stream"])
            if at is None:
                return False
            where[e["offset"]] = at
        elif e["kind"] == "free" and e["offset"] in where:
            pool.free(where.pop(e["offset"]))
        elif e["kind"] == "sync" and e["op"] == "explicit":
            pool.sync()
    return True


def peak_bytes(trace: list[dict]) -> int:
    current = peak = 0
    for e in trace:
        if e["kind"] == "alloc":
            current += e["bytes"]
            peak = max(peak, current)
        elif e["kind"] == "free":
            current -= e["bytes"]
    return peak


def smallest_arena(trace: list[dict], policy: str) -> int:
    """Smallest capacity (in 256-byte units, by bisection) that serves the trace."""
    peak = peak_bytes(trace)
    lo, hi = peak // MIN_CHUNK, 4 * peak // MIN_CHUNK
    while lo < hi:
        mid = (lo + hi) // 2
        if serves(trace, mid * MIN_CHUNK, policy):
            hi = mid
        else:
            lo = mid + 1
    return lo * MIN_CHUNK


def record(config: str, out: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TENSILE_POOL_TRACE_EVENTS", str(1 << 22))
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    from tensile_tf.config import load_config
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs import Job

    cfg = load_config(config)
    host = JobHost("1GiB", admission="none")
    for spec in cfg.jobs:
        host.submit(Job.from_spec(spec))
    result = host.run()
    trace = tensile_tf.pool_trace()
    stats = tensile_tf.pool_stats()
    if stats["trace_dropped"]:
        raise SystemExit(f"the trace dropped {stats['trace_dropped']} events; record fewer steps")
    with open(out, "w") as f:
        json.dump(trace, f)
    print(f"{[s.status.value for s in result.jobs]}: {len(trace)} events -> {out}")


def replay(path: str) -> None:
    with open(path) as f:
        trace = json.load(f)
    peak = peak_bytes(trace)
    print(f"{path}: {len(trace)} events, peak {peak / 2**20:.2f} MiB")
    for policy in POLICIES:
        arena = smallest_arena(trace, policy)
        print(f"  {policy:26s} smallest arena {arena / 2**20:8.2f} MiB  ({arena / peak:.3f} x peak)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("config")
    r.add_argument("out")
    p = sub.add_parser("replay")
    p.add_argument("trace")
    a = ap.parse_args()
    record(a.config, a.out) if a.cmd == "record" else replay(a.trace)


if __name__ == "__main__":
    main()
