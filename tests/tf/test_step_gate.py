"""StepGate (Note [Joint re-plan on arrival]): the host parks the running
jobs' threads at a step boundary while it builds a newcomer. Checked with
real threads, synchronised by events and the gate's own state only (no timing)."""
import threading
import time

from tensile_tf.runtime.threads import StepGate


def test_closed_waits_until_every_job_is_parked_and_holds_them_until_it_opens():
    gate, stop = StepGate(), threading.Event()
    steps = {"a": 0, "b": 0}
    inside, release_a = threading.Event(), threading.Event()
    a_went_on = threading.Event()

    def job_a():   # mid-step when the gate closes: parks at its next boundary
        release_a.wait()
        gate.at_boundary("a", stop)
        steps["a"] += 1
        a_went_on.set()

    def job_b():   # its job ends without another step: leaves
        gate.leave("b")

    threads = [threading.Thread(target=job_a), threading.Thread(target=job_b)]
    holder = {}

    def close():
        with gate.closed(["a", "b"], stop):
            holder["a_steps_while_closed"] = steps["a"]
            inside.set()
            holder["a_parked"] = not a_went_on.is_set()
            release_done.wait()

    release_done = threading.Event()
    closer = threading.Thread(target=close)
    closer.start()
    for t in threads:
        t.start()
    # `a` may reach its boundary only once the gate is closed (issue 57: released before, it could
    # pass an open gate, never park, and leave the closer waiting for it)
    deadline = time.monotonic() + 60
    while not gate.is_closed:
        assert time.monotonic() < deadline, "the gate never closed"
        time.sleep(0.001)
    release_a.set()          # `a` reaches its boundary and parks; `b` has left
    inside.wait()
    assert holder["a_steps_while_closed"] == 0 and holder["a_parked"]
    release_done.set()       # the gate opens: `a` takes its step
    closer.join()
    for t in threads:
        t.join()
    assert steps["a"] == 1


def test_an_open_gate_never_blocks_and_a_stop_releases_a_parked_job():
    gate, stop = StepGate(), threading.Event()
    gate.at_boundary("a", stop)   # open: returns at once
    parked = threading.Event()
    done = threading.Event()

    def job():
        parked.set()
        gate.at_boundary("a", stop)
        done.set()

    with gate.closed([], stop):   # nothing to wait for
        t = threading.Thread(target=job)
        t.start()
        parked.wait()
        stop.set()               # the run stops: the parked job is let go to end
        t.join()
    assert done.is_set()


def test_running_jobs_are_parked_for_a_newcomers_build_only_when_memory_requires_it(monkeypatch):
    """Arrivals.build_needs_parking: the newcomer's predicted persistent bytes
    against what the pool has free less the running steps' temporaries."""
    from types import SimpleNamespace

    from tensile_tf.runtime import arrivals

    MiB = 2**20
    predicted = {"new": (20 * MiB, 5 * MiB), "running": (30 * MiB, 40 * MiB)}
    host = SimpleNamespace(capacity=128 * MiB, admission=SimpleNamespace(predict=lambda s: predicted.get(s.name)))
    line = arrivals.Arrivals(host)
    monkeypatch.setattr(arrivals, "pool_stats", lambda: {"current": 50 * MiB})
    new, running = SimpleNamespace(name="new", rt=SimpleNamespace(train=None)), SimpleNamespace(name="running")
    assert line.build_needs_parking(new, [running]) is None       # 128 - 50 - 40 = 38 MiB free for 20
    predicted["new"] = (45 * MiB, 5 * MiB)
    assert line.build_needs_parking(new, [running]) == \
        "its build needs about 45.0 MiB, the pool has 38.0 MiB beside the running steps' temporaries"
    del predicted["new"]
    assert "needs are unknown" in line.build_needs_parking(new, [running])
    assert line.build_needs_parking(SimpleNamespace(name="new", rt=SimpleNamespace(train=object())), [running]) is None   # built
