"""benchmarks/fragmentation_replay.py measures placement policies on a pure-Python model
of StreamAwarePool. Its numbers mean something only if the model places exactly as the
pool does: replay the pool's own trace of a random workload (three streams, explicit and
forced syncs, out-of-memory requests) and compare every offset."""
import importlib.util
import random

import pytest

from tf_plugin import PoolOutOfMemory, StreamAwarePool
from tests.conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("fragmentation_replay", REPO_ROOT / "benchmarks" / "fragmentation_replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)

CAPACITY = 256 * 1024


def random_workload_trace(seed: int, capacity: int = CAPACITY, small: int = 4096, large: tuple[int, int] = (4096, 40000),
                          operations: int = 600) -> list[dict]:
    """Three streams allocating (half of the requests up to `small` bytes, half in `large`),
    freeing, and now and then syncing; the pool's own trace of it."""
    rng = random.Random(seed)
    pool = StreamAwarePool(capacity, name="replay-model")
    streams = [pool.register_stream(f"job{i}") for i in range(3)]
    live = []
    for _ in range(operations):
        r = rng.random()
        if r < 0.5 or not live:
            try:
                live.append(pool.allocate(rng.choice([rng.randint(1, small), rng.randint(*large)]),
                                          rng.choice(streams)))
            except PoolOutOfMemory:
                pass
        elif r < 0.97:
            pool.deallocate(live.pop(rng.randrange(len(live))))
        else:
            pool.sync_and_coalesce()
    pool.check_invariants()
    return pool.trace()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_the_replay_model_places_every_request_where_the_pool_did(seed):
    trace = random_workload_trace(seed)
    kinds = {e["kind"] for e in trace}
    assert {"alloc", "free", "sync", "oom"} <= kinds
    model = replay.ReplayPool(CAPACITY, "best-fit-across")
    where = {}
    for i, e in enumerate(trace):
        if e["kind"] == "alloc":
            at = model.allocate(e["bytes"], e["stream"])
            assert at == e["offset"], f"event {i}: the pool placed {e} at {e['offset']}, the model at {at}"
            where[e["offset"]] = at
        elif e["kind"] == "free":
            model.free(where.pop(e["offset"]))
        elif e["kind"] == "sync" and e["op"] == "explicit":
            model.sync()
        elif e["kind"] == "oom":
            assert model.allocate(e["bytes"], e["stream"]) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_replay_model_stitches_the_pieces_the_pool_stitched(seed):
    """Policy 7 in the model (best-fit-across+stitch) against the pool's own trace: every
    offset, every stitched allocation's window offset and each of its pieces."""
    capacity = 8 << 20   # requests up to 3 MiB: large enough to stitch
    trace = random_workload_trace(seed, capacity, small=64 << 10, large=(1 << 20, 3 << 20), operations=400)
    stitched = [e for e in trace if e["kind"] == "alloc" and e["offset"] >= capacity]
    assert len(stitched) >= 5 and any(e["kind"] == "oom" for e in trace)
    model = replay.ReplayPool(capacity, "best-fit-across+stitch")
    for i, e in enumerate(trace):
        if e["kind"] == "alloc":
            at = model.allocate(e["bytes"], e["stream"])
            assert at == e["offset"], f"event {i}: the pool placed {e} at {e['offset']}, the model at {at}"
            if at >= capacity:
                pieces = [(p["offset"], p["bytes"]) for p in trace[i + 1:i + 1 + len(model.stitched[at])]]
                assert all(p["kind"] == "piece" for p in trace[i + 1:i + 1 + len(pieces)])
                assert pieces == [(o, model.chunks[o][0]) for o in model.stitched[at]], f"event {i}"
        elif e["kind"] == "free":
            model.free(e["offset"])
        elif e["kind"] == "sync" and e["op"] == "explicit":
            model.sync()
        elif e["kind"] == "oom":
            assert model.allocate(e["bytes"], e["stream"]) is None


def test_the_robust_arena_is_where_every_larger_arena_serves():
    """Note [Robust arena]: a trace served by a lucky small arena but not by some larger one
    reports the larger robust factor; the bisection may report the lucky one."""
    trace = random_workload_trace(4)
    live_trace = [e for e in trace if e["kind"] in ("alloc", "free")]
    robust = replay.robust_arena(live_trace, "best-fit-across")
    peak = replay.peak_bytes(live_trace)
    assert robust is not None and 1.0 <= robust <= replay.GRID_TOP
    k = round((robust - 1.0) / replay.GRID_STEP)
    for j in range(k, round((replay.GRID_TOP - 1.0) / replay.GRID_STEP) + 1):
        factor = 1.0 + j * replay.GRID_STEP
        assert replay.serves(live_trace, replay.grid_arena(peak, factor), "best-fit-across")
    if k > 0:
        factor = 1.0 + (k - 1) * replay.GRID_STEP
        assert not replay.serves(live_trace, replay.grid_arena(peak, factor), "best-fit-across")
