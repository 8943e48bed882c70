"""Property-based state-machine test of the StreamAwarePool: random allocate /
free / sync / release across streams, checked against a model after every
step. Arena bytes are filled per allocation, so overlapping chunks would be
caught by their contents too, not only by the pool's own bookkeeping."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from tf_plugin import MIN_CHUNK_BYTES, SYNCED, PoolOutOfMemory, StreamAwarePool

CAPACITY = 64 * 1024
STREAMS = 3


class PoolMachine(RuleBasedStateMachine):
    live = Bundle("live")
    capacity = CAPACITY
    backend = "host"

    def __init__(self):
        super().__init__()
        self.pool = StreamAwarePool(self.capacity, name="prop", backend=self.backend)
        self.streams = [self.pool.register_stream(f"job{i}") for i in range(STREAMS)]
        self.allocs = {}  # offset -> (stream, rounded size, fill byte)
        self.freed_by = {}  # offset of a freed chunk -> stream, until the next sync
        self.next_fill = 1

    @rule(target=live, stream=st.integers(0, STREAMS - 1), nbytes=st.integers(0, 12 * 1024))
    def allocate(self, stream, nbytes):
        return self._allocate(stream, nbytes)

    def _allocate(self, stream, nbytes):
        sid = self.streams[stream]
        syncs_before = self.pool.stats()["num_syncs"]
        expected = self._best_fit_without_sync(nbytes, sid)
        try:
            off = self.pool.allocate(nbytes, sid)
            self._note_allocation(off)
        except PoolOutOfMemory:
            s = self.pool.stats()
            if s["num_syncs"] > syncs_before:  # the failed search synced first
                self.freed_by.clear()
            # An OOM is honest: no free chunk of the rounded size exists even after the sync it did.
            rounded = max(1, -(-nbytes // MIN_CHUNK_BYTES)) * MIN_CHUNK_BYTES
            assert s["largest_free_chunk"] < rounded
            self._check_oom_honest(rounded)
            return None
        rounded = max(1, -(-nbytes // MIN_CHUNK_BYTES)) * MIN_CHUNK_BYTES
        synced_now = self.pool.stats()["num_syncs"] > syncs_before
        if synced_now:
            self.freed_by.clear()
            assert expected is None, "synced although a chunk fitted without a sync"
        elif off < self.capacity:
            # Placement (policy 4): the best fit, by (size, offset), across the stream's own
            # unsynced chunks and the synced ones, own chunk on equal size.
            assert off == expected, f"placed at {off}, best fit is {expected}"
        if off >= self.capacity:
            assert expected is None, "stitched although a single chunk fitted"   # policy 7
        # Never hand a chunk freed by another stream before a sync.
        for start, size in self._arena_ranges(off, rounded):
            for freed_off, by in self.freed_by.items():
                if by != sid:
                    assert not (start <= freed_off < start + size), "unsynced chunk of another stream reused"
        if off >= self.capacity:
            rounded = self._stitched_bytes(off)
        fill = self.next_fill % 251 + 1
        self.next_fill += 1
        self.pool.fill(off, rounded, fill)
        self.allocs[off] = (sid, rounded, fill)
        return off

    def _note_allocation(self, off):
        """More in StitchingPoolMachine."""

    def _check_oom_honest(self, rounded):
        """More in StitchingPoolMachine."""

    def _arena_ranges(self, off, rounded):
        """The arena bytes an allocation at `off` holds."""
        return [(off, rounded)]

    def _stitched_bytes(self, off):
        raise AssertionError(f"offset {off} is beyond the arena of a pool that does not stitch")

    def _best_fit_without_sync(self, nbytes, sid):
        """Offset policy 4 of stream_aware_pool.h picks without a sync, or None."""
        rounded = max(1, -(-nbytes // MIN_CHUNK_BYTES)) * MIN_CHUNK_BYTES
        free = [c for c in self.pool.chunks() if not c["in_use"] and c["size"] >= rounded]
        own = min(((c["size"], c["offset"]) for c in free if c["owner"] == sid), default=None)
        synced = min(((c["size"], c["offset"]) for c in free if c["owner"] == SYNCED), default=None)
        if synced is not None and (own is None or synced[0] < own[0]):
            return synced[1]
        return None if own is None else own[1]

    @rule(off=consumes(live))
    def free(self, off):
        if off is None:
            return
        sid, rounded, fill = self.allocs.pop(off)
        assert self.pool.holds(off, rounded, fill), "chunk contents overwritten: chunks overlap"
        ranges = self._arena_ranges(off, rounded)
        self.pool.deallocate(off)
        for start, size in ranges:
            for o in range(start, start + size, MIN_CHUNK_BYTES):
                self.freed_by[o] = sid

    @rule()
    def sync(self):
        self.pool.sync_and_coalesce()
        self.freed_by.clear()
        assert all(c["owner"] == SYNCED for c in self.pool.chunks() if not c["in_use"])

    @invariant()
    def bookkeeping_holds(self):
        self.pool.check_invariants()
        chunks = self.pool.chunks()
        # No two live chunks overlap, chunks tile the arena, bytes are conserved.
        end = 0
        for c in chunks:
            assert c["offset"] == end
            end += c["size"]
        assert end == self.capacity
        live = {c["offset"]: c["size"] for c in chunks if c["in_use"]}
        assert live == {start: size for o, (_, r, _) in self.allocs.items()
                        for start, size in self._arena_ranges(o, r)}
        s = self.pool.stats()
        assert s["current"] == sum(live.values())
        assert s["current"] + s["synced_free"] + s["unsynced_free"] == self.capacity
        assert s["allocated"] - s["freed"] == s["current"]

    def teardown(self):
        for off in list(self.allocs):
            self.pool.deallocate(off)
        self.pool.sync_and_coalesce()
        # Everything freed and synced: one free chunk again.
        assert self.pool.chunks() == [dict(offset=0, size=self.capacity, requested=0, in_use=False, owner=SYNCED)]


class AsyncPoolMachine(PoolMachine):
    """The same machine on the asynchronous host backend (Note [A host backend that behaves
    like a device]): every free queues a marker on its stream's worker, which runs it only when
    a sync waits for it; placement, the model and the invariants are the host backend's."""

    backend = "async-host"

    def teardown(self):
        had_live, waits = bool(self.allocs), self.pool.stats()["num_stream_waits"]
        super().teardown()
        if had_live:   # the final sync waited for the streams that freed them
            assert self.pool.stats()["num_stream_waits"] > waits


PoolMachine.TestCase.settings = settings(stateful_step_count=60)
TestPoolStateMachine = PoolMachine.TestCase
AsyncPoolMachine.TestCase.settings = settings(stateful_step_count=60)
TestAsyncPoolStateMachine = AsyncPoolMachine.TestCase
