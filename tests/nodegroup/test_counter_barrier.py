"""CounterBarrier semantics of the C++ NodeGroupPipeline, driven from Python
threads (each ``boundary`` call blocks like the TF op's continuation would).
A standalone pipeline per test: no TensorFlow graphs involved."""
import threading
import time

import pytest

import tf_plugin
from tf_plugin.nodegroup.schedule import JobProfile, schedule_pairs

NodeGroupPipeline = tf_plugin._plugin.NodeGroupPipeline


def wait_until(condition, what: str, deadline_s: float = 30.0) -> None:
    """Polls ``condition`` (state the pipeline records) until it holds."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.005)


def waiting(pipe, n: int):
    return lambda: pipe.stats()["waiting_now"] == n


def run_job(pipe, job, pairs, iterations, log, errors, work_s=0.0):
    """A job's steps: boundary b, then group b's 'work', logging (job, iter, group, start, end)."""
    n = len(pairs)
    try:
        for it in range(iterations):
            for b in range(n + 1):
                code, msg = pipe.boundary(job, b, n)
                if code != "ok":
                    errors.append((job, code, msg))
                    return
                if b < n:
                    start = time.monotonic()
                    if work_s:
                        time.sleep(work_s)
                    log.append((job, it, b, start, time.monotonic()))
    except Exception as e:  # noqa: BLE001
        errors.append((job, "exception", repr(e)))


def start_jobs(pipe, table, iterations, work_s=0.0):
    log, errors = [], []
    threads = [threading.Thread(target=run_job, args=(pipe, job, pairs, iterations, log, errors, work_s))
               for job, (_, pairs) in table.items()]
    for t in threads:
        t.start()
    return threads, log, errors


def check_pair_order(table, log, iterations):
    """Every group of pair k (iteration i) starts after every group of pair k-1
    (iteration i) ended; pair 0 of iteration i after the last pair of i-1."""
    pair = {(job, g): p for job, (_, pairs) in table.items() for g, p in enumerate(pairs)}
    num_pairs = max(p for _, pairs in table.values() for p in pairs) + 1
    spans = {}
    for job, it, g, start, end in log:
        spans.setdefault((it, pair[(job, g)]), []).append((start, end))
    ordered = [(it, k) for it in range(iterations) for k in range(num_pairs) if (it, k) in spans]
    for prev, cur in zip(ordered, ordered[1:]):
        assert min(s for s, _ in spans[cur]) >= max(e for _, e in spans[prev]), (prev, cur)


def test_pairs_run_in_order_across_iterations():
    pipe = NodeGroupPipeline()
    sched = schedule_pairs([JobProfile.uniform(1, "a", 3, 3, 10), JobProfile.uniform(2, "b", 3, 3, 10)],
                           mem_limit=70, split_size=10)
    table = {j: (sched.names[j], pairs) for j, pairs in sched.pair_of_group.items()}
    pipe.set_schedule(table, sched.num_pairs)
    threads, log, errors = start_jobs(pipe, table, iterations=4, work_s=0.002)
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(log) == 4 * 12
    check_pair_order(table, log, 4)
    stats = pipe.stats()
    assert stats["waits"] > 0 and stats["timeouts"] == 0 and stats["waiting_now"] == 0
    # one barrier opening (and one SyncAndCoalesce) per pair per iteration
    assert stats["pair_starts"] == 4 * sched.num_pairs


def test_eight_jobs_no_deadlock():
    pipe = NodeGroupPipeline()
    pipe.set_timeout(20)
    jobs = [JobProfile.uniform(i, f"j{i}", 2 + i % 3, 2 + i % 2, 10) for i in range(1, 9)]
    sched = schedule_pairs(jobs, mem_limit=60, split_size=10)
    table = {j: (sched.names[j], pairs) for j, pairs in sched.pair_of_group.items()}
    pipe.set_schedule(table, sched.num_pairs)
    threads, log, errors = start_jobs(pipe, table, iterations=5)
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors
    check_pair_order(table, log, 5)


def test_a_leaving_job_releases_the_barriers_it_takes_part_in():
    pipe = NodeGroupPipeline()
    pipe.set_timeout(20)
    pipe.set_schedule({1: ("a", [0, 2]), 2: ("b", [1, 3])}, 4)
    result = {}

    def job_b():
        result["b0"] = pipe.boundary(2, 0, 2)   # waits for a's group in pair 0

    t = threading.Thread(target=job_b)
    t.start()
    wait_until(waiting(pipe, 1), "b waits at its barrier")
    assert t.is_alive()
    pipe.leave(1)                               # a fails before finishing pair 0
    t.join(timeout=5)
    assert result["b0"] == ("ok", "")
    # b now runs unpaced: the rest of its step needs nobody.
    assert pipe.boundary(2, 1, 2) == ("ok", "") and pipe.boundary(2, 2, 2) == ("ok", "")
    assert pipe.stats()["released_by_leave"] == 1


def test_wait_times_out_with_a_clear_error():
    pipe = NodeGroupPipeline()
    pipe.set_timeout(0.3)
    pipe.set_schedule({5: ("resnet-a", [0, 2]), 6: ("resnet-b", [1, 3])}, 4)
    t0 = time.monotonic()
    code, msg = pipe.boundary(6, 0, 2)
    assert code == "deadline_exceeded" and time.monotonic() - t0 >= 0.25  # it waited its timeout
    assert "CounterBarrier 1" in msg and "'resnet-b' (stream 6)" in msg and "'resnet-a' (stream 5)" in msg
    assert "barrier_timeout_s" in msg
    assert pipe.stats()["timeouts"] == 1


def test_new_version_is_taken_at_the_next_iteration():
    pipe = NodeGroupPipeline()
    pipe.set_timeout(5)
    pipe.set_schedule({1: ("a", [0, 1])}, 2)
    assert pipe.boundary(1, 0, 2)[0] == "ok"
    pipe.set_schedule({1: ("a", [0, 2]), 2: ("b", [1, 3])}, 4)     # b arrives
    # a finishes its current iteration under the old version...
    assert pipe.boundary(1, 1, 2)[0] == "ok" and pipe.boundary(1, 2, 2)[0] == "ok"
    # ...and paces with b from its next one: its group 1 (pair 2) waits for b's pair 1.
    assert pipe.boundary(1, 0, 2)[0] == "ok"
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("a1", pipe.boundary(1, 1, 2)))
    t.start()
    wait_until(waiting(pipe, 1), "a waits for b's pair 1")
    assert t.is_alive() and "a1" not in done
    assert pipe.boundary(2, 0, 2) == ("ok", "")   # b starts its group 0 (pair 1)
    # b's group 0 ends: a's group 1 (pair 2) may start; b's group 1 (pair 3) waits for it.
    b1 = threading.Thread(target=lambda: done.setdefault("b1", pipe.boundary(2, 1, 2)))
    b1.start()
    t.join(timeout=5)
    assert done["a1"] == ("ok", "")
    # b's boundary is blocked inside the pipeline (as the pipeline records), not merely not run yet
    wait_until(waiting(pipe, 1), "b waits for a's pair 2")
    assert b1.is_alive() and "b1" not in done
    assert pipe.boundary(1, 2, 2) == ("ok", "")   # a's group 1 ends: pair 2 is done
    b1.join(timeout=5)
    assert done["b1"] == ("ok", "")


def test_wrong_partition_and_bad_schedule_are_errors():
    pipe = NodeGroupPipeline()
    pipe.set_schedule({1: ("a", [0, 1])}, 2)
    code, msg = pipe.boundary(1, 0, 3)
    assert code == "invalid_argument" and "3 node groups" in msg and "'a'" in msg
    with pytest.raises(ValueError, match="job 'a'.*pairs must increase"):
        pipe.set_schedule({1: ("a", [1, 1])}, 2)


def test_jobs_outside_the_schedule_pass_through():
    pipe = NodeGroupPipeline()
    assert all(pipe.boundary(7, b, 3) == ("ok", "") for b in range(4))
    assert pipe.stats()["passthrough"] == 4


def test_an_aborted_step_does_not_stall_the_next_iteration():
    pipe = NodeGroupPipeline()
    pipe.set_timeout(10)
    table = {1: ("a", [0, 2]), 2: ("b", [1, 3])}
    pipe.set_schedule(table, 4)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("b0", pipe.boundary(2, 0, 2)))
    t.start()
    assert pipe.boundary(1, 0, 2) == ("ok", "")   # a starts group 0, then its step aborts
    wait_until(waiting(pipe, 1), "b waits for a's pair 0")
    assert "b0" not in got                        # b still waits for a's pair 0
    # a's next iteration: the boundaries its aborted step skipped count as done,
    # which releases b; then both run whole iterations in step.
    a_log, a_err = [], []
    a = threading.Thread(target=run_job, args=(pipe, 1, [0, 2], 2, a_log, a_err))
    a.start()
    t.join(timeout=5)
    assert got["b0"] == ("ok", "")
    b_log, b_err = [], []
    # b is inside its first iteration (group 0 started): finish it, then two more.
    assert pipe.boundary(2, 1, 2)[0] == "ok" and pipe.boundary(2, 2, 2)[0] == "ok"
    run_job(pipe, 2, [1, 3], 2, b_log, b_err)
    a.join(timeout=10)
    assert not a_err and not b_err and len(a_log) == 4 and len(b_log) == 4
    assert pipe.stats()["timeouts"] == 0


def test_a_job_skipping_a_version_leaves_it():
    """Note [Versions]: b runs version 1 while versions 2 and 3 are installed;
    a paces with b under version 2. When b moves straight to version 3 it must
    leave version 2 too, or a waits there for b forever (seen as a 60 s
    timeout with eight jobs coming and going)."""
    pipe = NodeGroupPipeline()
    pipe.set_timeout(10)
    pipe.set_schedule({2: ("b", [0])}, 1)
    assert pipe.boundary(2, 0, 1)[0] == "ok"                         # b: version 1
    pipe.set_schedule({1: ("a", [0, 2]), 2: ("b", [1, 3])}, 4)
    assert pipe.boundary(1, 0, 2)[0] == "ok"                         # a: version 2
    pipe.set_schedule({1: ("a", [0, 2]), 2: ("b", [1, 3])}, 4)       # version 3
    done = {}
    a = threading.Thread(target=lambda: done.setdefault("a1", pipe.boundary(1, 1, 2)))
    a.start()                                 # a's group 1 (pair 2) waits for b's pair 1 in version 2
    wait_until(waiting(pipe, 1), "a waits for b's pair 1 in version 2")
    assert "a1" not in done
    assert pipe.boundary(2, 1, 1)[0] == "ok"                         # b ends its version-1 step
    b = threading.Thread(target=lambda: done.setdefault("b0", pipe.boundary(2, 0, 2)))
    b.start()                                 # b joins version 3, leaving 1 and 2
    a.join(timeout=5)
    assert done.get("a1") == ("ok", ""), done
    pipe.leave(1)
    b.join(timeout=5)
    assert done.get("b0") == ("ok", "") and pipe.stats()["timeouts"] == 0


def test_a_new_version_is_entered_only_when_the_old_pairing_lets_the_job_go_on():
    """Note [Hand-over at the old barrier]: a and b are paired (a in pairs 0
    and 2, b in 1 and 3) when version 2 is installed. a, done with its
    iteration while b still runs its pair 3, must not start its next one
    (version 2's generation 0 needs no arrivals) before b's pair 3 ends, as
    version 1 orders it; then b enters version 2 behind a's pair 0 there."""
    pipe = NodeGroupPipeline()
    pipe.set_timeout(10)
    table = {1: ("a", [0, 2]), 2: ("b", [1, 3])}
    pipe.set_schedule(table, 4)
    done = {}
    assert pipe.boundary(1, 0, 2)[0] == "ok"                        # a: pair 0
    a1 = threading.Thread(target=lambda: done.setdefault("a1", pipe.boundary(1, 1, 2)))
    a1.start()                                                      # a waits for b's pair 1
    assert pipe.boundary(2, 0, 2)[0] == "ok"                        # b: pair 1
    b1 = threading.Thread(target=lambda: done.setdefault("b1", pipe.boundary(2, 1, 2)))
    b1.start()                                                      # b ends pair 1, waits for a's pair 2
    a1.join(timeout=5)
    assert done["a1"] == ("ok", "")                                 # a: pair 2
    assert pipe.boundary(1, 2, 2)[0] == "ok"                        # a ends pair 2: its iteration is done
    b1.join(timeout=5)
    assert done["b1"] == ("ok", "")                                 # b: pair 3, running
    pipe.set_schedule(table, 4)                                     # version 2
    a0 = threading.Thread(target=lambda: done.setdefault("a0", pipe.boundary(1, 0, 2)))
    a0.start()
    wait_until(waiting(pipe, 1), "a waits at version 1's barrier 0 for b's pair 3")
    assert "a0" not in done and pipe.stats()["version"] == 2
    assert pipe.boundary(2, 2, 2)[0] == "ok"                        # b ends pair 3 (version 1)
    a0.join(timeout=5)
    assert done["a0"] == ("ok", "")                                 # a: pair 0 of version 2
    b0 = threading.Thread(target=lambda: done.setdefault("b0", pipe.boundary(2, 0, 2)))
    b0.start()                                                      # b: version 2's pair 1 waits for a's pair 0
    wait_until(waiting(pipe, 1), "b waits for a's pair 0 in version 2")
    assert "b0" not in done
    a_next = threading.Thread(target=lambda: done.setdefault("a1'", pipe.boundary(1, 1, 2)))
    a_next.start()
    b0.join(timeout=5)
    assert done["b0"] == ("ok", "")
    pipe.leave(1)
    pipe.leave(2)
    a_next.join(timeout=5)
    assert pipe.stats()["timeouts"] == 0


def test_a_job_waiting_to_hand_over_is_let_go_when_the_others_leave():
    """Note [Hand-over at the old barrier]: the hand-over wait is released by
    a job that leaves, as any wait is, and the job goes on in the new
    version."""
    pipe = NodeGroupPipeline()
    pipe.set_timeout(10)
    pipe.set_schedule({1: ("a", [0]), 2: ("b", [1])}, 2)
    assert pipe.boundary(1, 0, 1)[0] == "ok" and pipe.boundary(1, 1, 1)[0] == "ok"   # a: pair 0
    assert pipe.boundary(2, 0, 1)[0] == "ok"                                          # b: pair 1, running
    pipe.set_schedule({1: ("a", [0])}, 1)                                             # b will be gone
    done = {}
    a0 = threading.Thread(target=lambda: done.setdefault("a0", pipe.boundary(1, 0, 1)))
    a0.start()
    wait_until(waiting(pipe, 1), "a waits for b's pair 1 in version 1")
    pipe.leave(2)                                                                     # b fails and leaves
    a0.join(timeout=5)
    assert done["a0"] == ("ok", "")
    assert pipe.boundary(1, 1, 1)[0] == "ok" and pipe.boundary(1, 0, 1)[0] == "ok"   # a alone in version 2
    assert pipe.stats()["timeouts"] == 0
