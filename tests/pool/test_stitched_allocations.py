"""Policy 7 of stream_aware_pool.h, Note [Stitched allocations]: a large request that
no single free chunk serves is mapped from several free pieces into one range of the
stitch window. Worked by hand on an 8 MiB arena, then a state machine against the
same model as test_pool_state_machine.py with requests large enough to stitch."""
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import consumes, rule

from tf_plugin import SYNCED, PoolOutOfMemory, StreamAwarePool
from tests.pool.test_pool_state_machine import STREAMS, PoolMachine

KiB, MiB = 1024, 1 << 20
PAGE = 4096
STITCH_MIN = 1 * MiB


def pieces_of(pool, offset):
    """(arena offset, bytes) of each piece the trace records for the stitched allocation at `offset`."""
    trace = pool.trace()
    at = max(i for i, e in enumerate(trace) if e["kind"] == "alloc" and e["offset"] == offset)
    out = []
    for e in trace[at + 1:]:
        if e["kind"] != "piece":
            break
        out.append((e["offset"], e["bytes"]))
    return out


def holes_pool(stitch=True):
    """8 MiB holding four 2 MiB allocations of stream a, the first and third freed:
    4 MiB free in two 2 MiB holes, a's unsynced chunks."""
    pool = StreamAwarePool(8 * MiB, name="stitch", stitch=stitch)
    a, b = pool.register_stream("a"), pool.register_stream("b")
    offs = [pool.allocate(2 * MiB, a) for _ in range(4)]
    assert offs == [0, 2 * MiB, 4 * MiB, 6 * MiB]
    pool.deallocate(offs[0])
    pool.deallocate(offs[2])
    return pool, a, b


def test_two_holes_serve_a_request_larger_than_either():
    pool, a, _ = holes_pool()
    assert pool.stats()["largest_free_chunk"] == 2 * MiB
    off = pool.allocate(3 * MiB, a, op="dense/MatMul")
    # An offset beyond the arena: the stitch window.
    assert off >= pool.capacity
    # Largest piece first: all of the first hole, then 1 MiB of the second; mapped in arena order.
    assert pieces_of(pool, off) == [(0, 2 * MiB), (4 * MiB, 1 * MiB)]
    assert [(c["offset"], c["size"], c["in_use"]) for c in pool.chunks()] == [
        (0, 2 * MiB, True), (2 * MiB, 2 * MiB, True), (4 * MiB, 1 * MiB, True), (5 * MiB, 1 * MiB, False),
        (6 * MiB, 2 * MiB, True)]
    s = pool.stats()
    assert (s["num_stitched"], s["num_live_stitched"], s["stitched_current"]) == (1, 1, 3 * MiB)
    assert (s["current"], s["requested_current"]) == (7 * MiB, 3 * MiB + 4 * MiB)
    pool.check_invariants()
    # One memory, two addresses: what is written at the window is in the arena's pieces.
    pool.fill(off, 3 * MiB, 7)
    assert pool.holds(0, 2 * MiB, 7) and pool.holds(4 * MiB, 1 * MiB, 7)
    assert not pool.holds(5 * MiB, 1 * MiB, 7)
    pool.fill(4 * MiB, 1 * MiB, 9)
    assert pool.holds(off + 2 * MiB, 1 * MiB, 9)
    # The trace pairs one alloc with one free at the window offset.
    pool.deallocate(off)
    frees = [e for e in pool.trace() if e["kind"] == "free" and e["offset"] == off]
    assert [(e["bytes"], e["stream"]) for e in frees] == [(3 * MiB, a)]
    # The pieces went back to a's unsynced set; the second stays apart from its synced tail
    # (policy 5: a free chunk coalesces only within its own set).
    assert [(c["offset"], c["size"], c["in_use"], c["owner"]) for c in pool.chunks()] == [
        (0, 2 * MiB, False, a), (2 * MiB, 2 * MiB, True, a), (4 * MiB, 1 * MiB, False, a),
        (5 * MiB, 1 * MiB, False, SYNCED), (6 * MiB, 2 * MiB, True, a)]
    s = pool.stats()
    assert (s["num_live_stitched"], s["stitched_current"], s["current"]) == (0, 0, 4 * MiB)
    pool.check_invariants()
    with pytest.raises(IndexError):
        pool.fill(off, 1, 0)  # the window range is unmapped again


def test_other_streams_unsynced_chunks_are_stitched_only_after_a_sync():
    """The Waterwave rule holds for pieces: b's request syncs first, then stitches a's former chunks."""
    pool, a, b = holes_pool()
    syncs = pool.stats()["num_allocator_syncs"]
    off = pool.allocate(4 * MiB, b)
    assert off >= pool.capacity and pool.stats()["num_allocator_syncs"] == syncs + 1
    assert pieces_of(pool, off) == [(0, 2 * MiB), (4 * MiB, 2 * MiB)]
    assert all(c["owner"] == b for c in pool.chunks() if c["offset"] in (0, 4 * MiB))
    pool.check_invariants()


def test_requests_below_the_stitch_minimum_and_pools_without_stitching_fail_as_before():
    pool, a, _ = holes_pool(stitch=False)
    with pytest.raises(PoolOutOfMemory, match="asked 3.0 MiB, 4.0 MiB free of 8.0 MiB in 2 chunks"):
        pool.allocate(3 * MiB, a)
    assert pool.stats()["stitching"] is False and pool.stats()["num_stitched"] == 0
    # Below kStitchMinBytes: two 512 KiB holes do not serve 768 KiB.
    small = StreamAwarePool(2 * MiB, name="small")
    s = small.register_stream("a")
    offs = [small.allocate(512 * KiB, s) for _ in range(4)]
    small.deallocate(offs[0])
    small.deallocate(offs[2])
    with pytest.raises(PoolOutOfMemory):
        small.allocate(768 * KiB, s)
    assert small.stats()["num_stitched"] == 0


def test_a_request_larger_than_the_free_pages_is_an_oom():
    pool, a, _ = holes_pool()
    with pytest.raises(PoolOutOfMemory, match="asked 4.0 MiB, 4.0 MiB free"):
        pool.allocate(4 * MiB + 1, a)   # one page more than the two holes hold
    assert pool.stats()["num_stitched"] == 0
    pool.check_invariants()


def test_pieces_are_page_aligned_interiors_of_unaligned_holes():
    """Holes that start and end off page boundaries give only their whole pages."""
    pool = StreamAwarePool(8 * MiB, name="stitch")
    a = pool.register_stream("a")
    sizes = [1 * KiB, 2 * MiB, 1 * KiB, 2 * MiB, 1 * KiB]
    offs = [pool.allocate(n, a) for n in sizes]
    pool.deallocate(offs[1])                  # [1 KiB, 2 MiB + 1 KiB): 511 whole pages
    pool.deallocate(offs[3])
    rest = pool.allocate(8 * MiB - sum(sizes), a)   # the tail is taken: only the two holes are free
    off = pool.allocate(3 * MiB, a)
    pieces = pieces_of(pool, off)
    assert all(o % PAGE == 0 and n % PAGE == 0 for o, n in pieces)
    assert sum(n for _, n in pieces) == 3 * MiB and pieces[0] == (4 * KiB, 2 * MiB - 4 * KiB)
    pool.check_invariants()
    for o in (off, rest, offs[0], offs[2], offs[4]):
        pool.deallocate(o)
    pool.sync_and_coalesce()
    assert pool.chunks() == [dict(offset=0, size=8 * MiB, requested=0, in_use=False, owner=SYNCED)]


class StitchingPoolMachine(PoolMachine):
    """The state machine of test_pool_state_machine.py with requests up to 2.5 MiB in 6 MiB,
    so that stitching happens; each stitched allocation's arena pieces are checked like
    chunks (contents, the stream rule, tiling)."""
    capacity = 6 * MiB

    def __init__(self):
        super().__init__()
        self.pieces = {}   # stitched offset -> [(arena offset, bytes)] (of the live one at that offset)

    @rule(target=PoolMachine.live, stream=st.integers(0, STREAMS - 1),
          nbytes=st.one_of(st.integers(STITCH_MIN, 5 * MiB // 2), st.integers(0, 64 * KiB)))
    def allocate(self, stream, nbytes):
        return self._allocate(stream, nbytes)

    @rule(off=consumes(PoolMachine.live))
    def free_another(self, off):
        """Frees twice as often as the base machine, so holes form between large chunks."""
        self.free(off)

    def _note_allocation(self, off):
        if off >= self.capacity:
            self.pieces[off] = pieces_of(self.pool, off)

    def _arena_ranges(self, off, rounded):
        return self.pieces[off] if off >= self.capacity else [(off, rounded)]

    def _stitched_bytes(self, off):
        pieces = self.pieces[off]
        total = sum(n for _, n in pieces)
        assert total >= STITCH_MIN and total % PAGE == 0
        assert all(o % PAGE == 0 and n % PAGE == 0 for o, n in pieces)
        assert [o for o, _ in pieces] == sorted(o for o, _ in pieces)
        return total

    def _check_oom_honest(self, rounded):
        """Not stitchable either: too small, or the free chunks' whole pages hold less."""
        if rounded < STITCH_MIN:
            return
        pages = sum((c["offset"] + c["size"]) // PAGE - -(-c["offset"] // PAGE)
                    for c in self.pool.chunks() if not c["in_use"] and c["size"] >= PAGE)
        assert pages * PAGE < -(-rounded // PAGE) * PAGE


StitchingPoolMachine.TestCase.settings = settings(stateful_step_count=40)
TestStitchingPoolStateMachine = StitchingPoolMachine.TestCase
