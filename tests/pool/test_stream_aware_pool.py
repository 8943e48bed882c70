"""StreamAwarePool unit tests: Waterwave Listing 1 behaviour, worked by hand."""
import pytest

from tf_plugin import MIN_CHUNK_BYTES, SYNCED, PoolOutOfMemory, StreamAwarePool

KiB = 1024


def make_pool(capacity=64 * KiB, streams=("a", "b")):
    pool = StreamAwarePool(capacity, name="unit")
    ids = [pool.register_stream(s) for s in streams]
    return pool, ids


def test_fresh_pool_is_one_synced_chunk():
    pool, _ = make_pool()
    assert pool.chunks() == [dict(offset=0, size=64 * KiB, requested=0, in_use=False, owner=SYNCED)]
    s = pool.stats()
    assert (s["capacity"], s["current"], s["peak"], s["largest_free_chunk"]) == (64 * KiB, 0, 0, 64 * KiB)


def test_sizes_round_up_to_min_chunk_and_best_fit_splits():
    pool, (a, _) = make_pool()
    off = pool.allocate(1, a)
    assert off == 0
    chunks = pool.chunks()
    assert chunks[0]["size"] == MIN_CHUNK_BYTES and chunks[0]["requested"] == 1
    assert chunks[1] == dict(offset=MIN_CHUNK_BYTES, size=64 * KiB - MIN_CHUNK_BYTES, requested=0,
                             in_use=False, owner=SYNCED)
    pool.check_invariants()


def test_free_goes_to_own_unsynced_set_and_is_reused_first():
    pool, (a, b) = make_pool()
    x = pool.allocate(4 * KiB, a)
    pool.allocate(4 * KiB, a)  # keeps x from merging into the tail
    pool.deallocate(x)
    assert pool.chunks()[0]["owner"] == a
    assert pool.stats()["unsynced_free"] == 4 * KiB
    # Stream a takes its own unsynced chunk back (search order step 1).
    assert pool.allocate(4 * KiB, a) == x
    pool.check_invariants()


def test_other_stream_never_gets_unsynced_chunk_while_synced_memory_fits():
    pool, (a, b) = make_pool()
    x = pool.allocate(4 * KiB, a)
    pool.allocate(4 * KiB, a)
    pool.deallocate(x)
    y = pool.allocate(4 * KiB, b)
    assert y != x  # b takes synced memory (step 2), not a's unsynced chunk
    assert pool.stats()["num_syncs"] == 0


def test_best_fit_spans_own_unsynced_and_synced_chunks():
    """Note [Best fit across own and synced]: a small request must not split
    the large chunk its stream has just freed while a synced chunk fits."""
    pool, (a, _) = make_pool(capacity=64 * KiB)
    big = pool.allocate(32 * KiB, a)
    pool.allocate(8 * KiB, a)  # keeps `big` from merging into the tail
    pool.deallocate(big)  # a's unsynced 32 KiB; the synced tail is 24 KiB
    small = pool.allocate(8 * KiB, a)
    assert small != big  # the synced tail is the better fit
    assert pool.allocate(32 * KiB, a) == big  # the large hole is still whole
    assert pool.stats()["num_syncs"] == 0
    pool.check_invariants()


def test_best_fit_across_size_bins():
    """Note [Size-binned free sets] (free_chunk_set.h): free chunks of 5, 7, 8, 9, 9 and 16
    units (bins 5, 7, 8, 8, 8 and 12: four bins per power of two) separated by live chunks.
    Each request gets the smallest chunk that fits, the lowest offset on equal size, whether
    that chunk sits in the request's own bin or in a later one."""
    unit = MIN_CHUNK_BYTES
    pool, (a, _) = make_pool(capacity=1024 * unit)
    holes = {}
    for units in (16, 9, 5, 8, 9, 7):  # allocated in this order: offsets increase
        holes.setdefault(units, []).append(pool.allocate(units * unit, a))
        pool.allocate(unit, a)  # a live separator
    for offs in holes.values():
        for off in offs:
            pool.deallocate(off)
    pool.sync_and_coalesce()  # all synced; separators keep the holes apart
    assert pool.allocate(6 * unit, a) == holes[7][0]       # bin 6 empty: next bin's first
    assert pool.allocate(9 * unit, a) == holes[9][0]       # bin 8 holds 8, 9, 9: lowest 9
    assert pool.allocate(9 * unit, a) == holes[9][1]
    assert pool.allocate(10 * unit, a) == holes[16][0]     # bins 9-11 empty
    assert pool.allocate(3 * unit, a) == holes[5][0]       # splits the 5 (bin 5 >= bin 3)
    assert pool.allocate(8 * unit, a) == holes[8][0]
    assert pool.allocate(2 * unit, a) == holes[5][0] + 3 * unit  # the 5's remainder
    assert pool.stats()["num_syncs"] == 1
    pool.check_invariants()


def test_equal_fit_prefers_the_streams_own_unsynced_chunk():
    pool, (a, _) = make_pool(capacity=24 * KiB)
    x = pool.allocate(8 * KiB, a)
    pool.allocate(8 * KiB, a)
    pool.deallocate(x)  # a's unsynced 8 KiB and a synced 8 KiB tail
    assert pool.allocate(8 * KiB, a) == x


def test_allocate_syncs_only_when_it_must_take_other_streams_chunks():
    pool, (a, b) = make_pool(capacity=16 * KiB)
    x = pool.allocate(8 * KiB, a)
    pool.allocate(8 * KiB, a)
    pool.deallocate(x)  # a's unsynced 8 KiB is the only free memory
    y = pool.allocate(8 * KiB, b)  # step 3: sync, then take it
    assert y == x
    s = pool.stats()
    assert s["num_syncs"] == 1 and s["num_allocator_syncs"] == 1
    assert [e["kind"] for e in pool.trace()][-2:] == ["sync", "alloc"]
    pool.check_invariants()


def test_deallocate_coalesces_only_within_the_same_unsynced_set():
    pool, (a, b) = make_pool(capacity=16 * KiB)
    p = [pool.allocate(4 * KiB, s) for s in (a, a, b, b)]
    pool.deallocate(p[0])
    pool.deallocate(p[1])  # merges with p[0]: same stream, both unsynced
    pool.deallocate(p[2])  # b's chunk: next to a's free chunk, but separate
    layout = [(c["offset"], c["size"], c["owner"], c["in_use"]) for c in pool.chunks()]
    assert layout == [(0, 8 * KiB, a, False), (8 * KiB, 4 * KiB, b, False), (12 * KiB, 4 * KiB, b, True)]
    pool.check_invariants()


def test_coalescing_with_synced_neighbour_is_deferred_until_sync():
    pool, (a, _) = make_pool(capacity=16 * KiB)
    x = pool.allocate(4 * KiB, a)  # rest (12 KiB) stays synced
    pool.deallocate(x)
    chunks = pool.chunks()
    assert [(c["size"], c["owner"]) for c in chunks] == [(4 * KiB, a), (12 * KiB, SYNCED)]
    pool.sync_and_coalesce()
    assert pool.chunks() == [dict(offset=0, size=16 * KiB, requested=0, in_use=False, owner=SYNCED)]


def test_oom_is_counted_traced_and_explained():
    pool, (a, b) = make_pool(capacity=16 * KiB)
    pool.allocate(4 * KiB, b)
    pool.allocate(8 * KiB, a)
    with pytest.raises(PoolOutOfMemory) as err:
        pool.allocate(8 * KiB, a, op="conv2d_4/Conv2D")
    msg = str(err.value)
    for part in ("pool 'unit' out of memory", "job 'a'", "op 'conv2d_4/Conv2D'", "asked 8.0 KiB",
                 "4.0 KiB free", "largest 4.0 KiB",
                 "held by a 8.0 KiB, b 4.0 KiB",     # who held the pool at the failed allocation, largest first
                 "raise the pool capacity"):
        assert part in msg, (part, msg)
    s = pool.stats()
    assert s["num_ooms"] == 1 and s["jobs"]["a"]["num_ooms"] == 1
    assert pool.trace()[-1]["kind"] == "oom"
    assert isinstance(err.value, MemoryError)


def test_stats_vocabulary_pool_and_per_job():
    pool, (a, b) = make_pool()
    x = pool.allocate(1000, a)
    y = pool.allocate(3000, b)
    pool.deallocate(x)
    s = pool.stats()
    assert s["current"] == 3072 and s["peak"] == 1024 + 3072
    assert s["allocated"] == 1024 + 3072 and s["freed"] == 1024
    assert s["jobs"]["a"]["current"] == 0 and s["jobs"]["a"]["peak"] == 1024
    assert s["jobs"]["b"]["current"] == 3072 and s["jobs"]["b"]["num_allocs"] == 1
    pool.reset_peak()
    assert pool.stats()["peak"] == 3072 and pool.stats()["jobs"]["a"]["peak"] == 0
    pool.deallocate(y)


def test_release_stream_makes_its_free_chunks_synced_and_reuses_id():
    pool, (a, b) = make_pool()
    x = pool.allocate(4 * KiB, a)
    pool.allocate(4 * KiB, b)
    pool.deallocate(x)
    pool.release_stream(a)
    assert pool.chunks()[0]["owner"] == SYNCED
    assert "a" not in pool.stats()["jobs"]
    assert pool.register_stream("c") == a  # nothing of a is live: id reused
    pool.check_invariants()


def test_trace_is_a_bounded_ring():
    pool = StreamAwarePool(64 * KiB, trace_capacity=8)
    for _ in range(10):
        pool.deallocate(pool.allocate(256))
    trace = pool.trace()
    assert len(trace) == 8 and pool.stats()["trace_dropped"] == 12
    assert [e["kind"] for e in trace[:2]] == ["alloc", "free"]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError):
        StreamAwarePool(0)
    with pytest.raises(ValueError, match="unknown pool backend 'cuda': the backends built in are: host, async-host"):
        StreamAwarePool(1024, backend="cuda")
    pool = StreamAwarePool(4096)
    with pytest.raises(ValueError, match="no live allocation"):
        pool.deallocate(256)
