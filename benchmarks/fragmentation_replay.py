"""Fragmentation benchmark (pool placement policy): record the pool's event
trace of a real run, then replay its allocations and frees against placement
policies and find, for each, the smallest arena that serves the whole trace.
The ratio smallest-arena / peak-bytes is the headroom a policy needs.

    python benchmarks/fragmentation_replay.py record CONFIG.yaml TRACE.json
    python benchmarks/fragmentation_replay.py replay TRACE.json [--policies ...]

`record` runs the config's jobs (admission none) in a 1 GiB pool. `replay`
models StreamAwarePool exactly (256-byte chunks, per-stream unsynced sets,
coalescing only within a set, sync-and-coalesce when nothing else fits, the
trace's explicit syncs; tests/pool/test_fragmentation_replay_model.py
checks it offset for offset against the pool's own traces) and varies only
where a request is placed:

- seed-order: Waterwave Listing 1: best fit in the stream's own unsynced
  chunks first, then in the synced chunks;
- best-fit-across: best fit over own unsynced and synced chunks together
  (policy 4; Note [Best fit across own and synced]);
- best-fit-across+high-end: the same, but requests of 1 MiB or more are
  carved from the high end of their chunk (large and small apart);
- eager-top: best-fit-across, except that allocations of eager ops (op names
  without a "/" scope: TensorFlow names an eager op by its type; variables,
  their initializers, optimizer slots) take the highest fitting chunk and
  are cut from its top, so long-lived buffers stack down from the arena's
  end. Prototyped in the pool twice (5a3f494, and 6d7bc1e where the TF
  adapter classified by step binding) and not adopted: replays of recorded
  traces moved both ways (benchmarks/RESULTS.md, "Fragmentation, ninth
  session"). The name rule is approximate: ops of a small tf.function can be
  unscoped too;
- oracle-lifetime-top (a bound, not a policy): like eager-top, but "long
  lived" read from the future: every allocation that outlives LONG_EVENTS
  events of the trace. No pool can know this; it shows what lifetime
  segregation could reach at best;
- best-fit-across+stitch (the pool since the eleventh session): policy 4,
  and a request of STITCH_MIN bytes or more that no chunk serves after the
  sync is stitched from page-aligned pieces of free chunks (policy 7, Note
  [Stitched allocations] in tf_plugin/allocator/stream_aware_pool.h).

Note [Robust arena]. The smallest arena that serves a trace is not
monotone: an arena 1% larger can fail where a smaller one served, because a
different free chunk wins a best fit early and the layout diverges (seen on
every trace here; for two InceptionV3 jobs a bisection found 1.21x the peak
bytes while an arena of 1.41x still failed). A bisection finds *a* serving
arena, by luck as much as by policy. The number to size a pool by is the
robust arena: the smallest of a 1% grid from which every larger grid arena
up to 1.5x serves.
`replay` prints both.

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
POLICIES = ("seed-order", "best-fit-across", "best-fit-across+high-end", "eager-top",
            "oracle-lifetime-top", "best-fit-across+stitch")
STITCH_MIN = 1 << 20        # StreamAwarePool::kStitchMinBytes
PAGE = 4096                 # the host backend's stitch granularity
LONG_EVENTS = 5000          # oracle-lifetime-top: "long lived" = outlives this many trace events
GRID_STEP, GRID_TOP = 0.01, 1.5   # Note [Robust arena]


class ReplayPool:
    """StreamAwarePool's bookkeeping with a pluggable placement policy."""

    def __init__(self, capacity: int, policy: str):
        self.policy = policy
        self.capacity = capacity
        self.offsets = [0]
        self.chunks = {0: [capacity, SYNCED, False]}  # offset -> [size, owner, live]
        self.free_sets: dict[int, set[int]] = {SYNCED: {0}}  # owner -> offsets of its free chunks
        # policy 7: window offset -> free bytes (first fit), and stitched offset -> its pieces
        self.window_free = {0: -(-capacity // PAGE) * PAGE * 2}
        self.stitched: dict[int, list[int]] = {}

    def _mark_free(self, offset: int, owner: int) -> None:
        self.free_sets.setdefault(owner, set()).add(offset)

    def _unmark_free(self, offset: int) -> None:
        self.free_sets[self.chunks[offset][1]].discard(offset)

    def _free_chunks(self, owner: int) -> list[tuple[int, int]]:
        return [(o, self.chunks[o][0]) for o in self.free_sets.get(owner, ())]

    def _best_fit(self, candidates, n: int):
        fits = [(size, o) for o, size in candidates if size >= n]
        return min(fits) if fits else None

    def _carve(self, size: int, offset: int, n: int, stream: int, top: bool = False) -> int:
        owner = self.chunks[offset][1]
        self._unmark_free(offset)
        if size - n < MIN_CHUNK:
            self.chunks[offset] = [size, stream, True]
            return offset
        if top or (self.policy.endswith("high-end") and n >= LARGE):
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

    def _highest_fit(self, candidates, n: int):
        fits = [(o, size) for o, size in candidates if size >= n]
        return max(fits)[::-1] if fits else None

    def allocate(self, nbytes: int, stream: int, long_lived: bool = False) -> int | None:
        n = max(1, -(-nbytes // MIN_CHUNK)) * MIN_CHUNK
        top = long_lived and self.policy.endswith("-top")  # highest fit, cut from its top
        own, synced = self._free_chunks(stream), self._free_chunks(SYNCED)
        if top:
            fit = self._highest_fit(own + synced, n)
        elif self.policy == "seed-order":
            fit = self._best_fit(own, n) or self._best_fit(synced, n)
        else:
            # Policy 4: the best fit of each set; the synced one only when strictly smaller
            # (own chunk on equal size), as StreamAwarePool::FindFit.
            own_fit, synced_fit = self._best_fit(own, n), self._best_fit(synced, n)
            fit = synced_fit if synced_fit is not None and (own_fit is None or synced_fit[0] < own_fit[0]) else own_fit
        if fit is None:
            self.sync()
            fit = (self._highest_fit if top else self._best_fit)(self._free_chunks(SYNCED), n)
        if fit is None and self.policy.endswith("+stitch") and n >= STITCH_MIN:
            return self._stitch(n, stream)
        return None if fit is None else self._carve(*fit, n, stream, top=top)

    def _stitch(self, n: int, stream: int) -> int | None:
        """Policy 7 as StreamAwarePool::StitchLocked: page-aligned interiors of the
        (all synced) free chunks, largest first, lowest offset on ties."""
        need = -(-n // PAGE) * PAGE
        interiors = []
        for o in self.free_sets[SYNCED]:
            lo, hi = -(-o // PAGE) * PAGE, (o + self.chunks[o][0]) // PAGE * PAGE
            if hi > lo:
                interiors.append((-(hi - lo), lo, o))
        chosen, have = [], 0
        for neg, lo, o in sorted(interiors):
            if have >= need:
                break
            chosen.append((lo, min(-neg, need - have), o))
            have += chosen[-1][1]
        window = next((w for w in sorted(self.window_free) if self.window_free[w] >= need), None)
        if have < need or window is None:
            return None
        rest = self.window_free.pop(window) - need
        if rest:
            self.window_free[window + need] = rest
        pieces = []
        for lo, length, o in sorted(chosen):
            size = self.chunks[o][0]
            self._unmark_free(o)
            if lo > o:                                   # the head stays free (synced)
                self.chunks[o][0] = lo - o
                self._mark_free(o, SYNCED)
                bisect.insort(self.offsets, lo)
            if lo + length < o + size:                   # and the tail
                self.chunks[lo + length] = [o + size - lo - length, SYNCED, False]
                self._mark_free(lo + length, SYNCED)
                bisect.insort(self.offsets, lo + length)
            self.chunks[lo] = [length, stream, True]
            pieces.append(lo)
        self.stitched[self.capacity + window] = pieces
        return self.capacity + window

    def _unstitch(self, offset: int) -> None:
        pieces = self.stitched.pop(offset)
        window, size = offset - self.capacity, sum(self.chunks[p][0] for p in pieces)
        if window + size in self.window_free:            # coalesce with the free neighbours
            size += self.window_free.pop(window + size)
        prev = max((w for w in self.window_free if w < window), default=None)
        if prev is not None and prev + self.window_free[prev] == window:
            window, size = prev, self.window_free[prev] + size
        self.window_free[window] = size
        for p in pieces:
            self.free(p)

    def _merge(self, a: int, b: int) -> None:
        """Merges free chunk b into its lower neighbour a (both unmarked)."""
        self.chunks[a][0] += self.chunks[b][0]
        del self.chunks[b]
        del self.offsets[bisect.bisect_left(self.offsets, b)]

    def free(self, offset: int) -> None:
        if offset in self.stitched:
            self._unstitch(offset)
            return
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


def lifetimes(trace: list[dict]) -> dict[int, int]:
    """Event index of each allocation -> events until its free (the trace's length if never)."""
    live, out = {}, {}
    for i, e in enumerate(trace):
        if e["kind"] == "alloc":
            live[e["offset"]] = i
        elif e["kind"] == "free" and e["offset"] in live:
            j = live.pop(e["offset"])
            out[j] = i - j
    out.update({j: len(trace) for j in live.values()})
    return out


def long_lived_flags(trace: list[dict], policy: str) -> list[bool]:
    """Per event: whether `policy` places it as long lived."""
    if policy == "oracle-lifetime-top":
        life = lifetimes(trace)
        return [life.get(i, 0) > LONG_EVENTS for i in range(len(trace))]
    if policy == "eager-top":
        return [e["kind"] == "alloc" and bool(e["op"]) and "/" not in e["op"] for e in trace]
    return [False] * len(trace)


def serves(trace: list[dict], capacity: int, policy: str, flags: list[bool] | None = None) -> bool:
    flags = flags if flags is not None else long_lived_flags(trace, policy)
    pool, where = ReplayPool(capacity, policy), {}
    for e, long_lived in zip(trace, flags):
        if e["kind"] == "alloc":
            at = pool.allocate(e["bytes"], e["stream"], long_lived)
            if at is None:
                return False
            where[e["offset"]] = at
        elif e["kind"] == "free" and e["offset"] in where:
            pool.free(where.pop(e["offset"]))
        elif e["kind"] == "sync" and e["op"] == "explicit":
            pool.sync()
    return True


def grid_arena(peak: int, factor: float) -> int:
    """The arena of `factor` x `peak` bytes, rounded down to whole chunks."""
    return int(peak * factor) // MIN_CHUNK * MIN_CHUNK


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
    """A smallest capacity (in 256-byte units, by bisection) that serves the trace: not
    robust (Note [Robust arena])."""
    flags = long_lived_flags(trace, policy)
    peak = peak_bytes(trace)
    lo, hi = peak // MIN_CHUNK, 4 * peak // MIN_CHUNK
    while lo < hi:
        mid = (lo + hi) // 2
        if serves(trace, mid * MIN_CHUNK, policy, flags):
            hi = mid
        else:
            lo = mid + 1
    return lo * MIN_CHUNK


def robust_arena(trace: list[dict], policy: str) -> float | None:
    """Note [Robust arena]: the smallest grid factor f (arena = f x peak bytes) from which
    every grid arena up to GRID_TOP serves; None when GRID_TOP itself fails."""
    flags = long_lived_flags(trace, policy)
    peak = peak_bytes(trace)
    steps = round((GRID_TOP - 1.0) / GRID_STEP)
    robust = None
    for k in range(steps, -1, -1):
        factor = 1.0 + k * GRID_STEP
        if not serves(trace, grid_arena(peak, factor), policy, flags):
            break
        robust = factor
    return robust


def record(config: str, out: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TENSILE_POOL_TRACE_EVENTS", str(1 << 22))
    import tensile_tf
    tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
    from tensile_tf.config.schema import load_config
    from tensile_tf.runtime import JobHost
    from tensile_tf.jobs.job import Job

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


def replay(path: str, policies: list[str]) -> None:
    with open(path) as f:
        trace = json.load(f)
    peak = peak_bytes(trace)
    print(f"{path}: {len(trace)} events, peak {peak / 2**20:.2f} MiB")
    for policy in policies:
        arena = smallest_arena(trace, policy)
        robust = robust_arena(trace, policy)
        shown = f"{robust:.2f} x peak" if robust is not None else f"above {GRID_TOP:.2f} x peak"
        print(f"  {policy:26s} robust arena {shown:17s}  bisection {arena / 2**20:8.2f} MiB "
              f"({arena / peak:.3f} x peak)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("config")
    r.add_argument("out")
    p = sub.add_parser("replay")
    p.add_argument("trace")
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    a = ap.parse_args()
    record(a.config, a.out) if a.cmd == "record" else replay(a.trace, a.policies)


if __name__ == "__main__":
    main()
