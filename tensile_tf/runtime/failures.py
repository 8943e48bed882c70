"""How a job's failure is recorded: one line for tables, the whole traceback
kept for the output directory. A failure is always the job's own: the host
catches it at the job's boundary and the other jobs go on.

Note [What held the pool]
A job that ran out of pool memory says who held the pool, largest first:
each job's stream, the steps parked for reuse ("parked:..."), and what no
job owns ("default" in the pool's words, "outside every job" here: eager
tensors, work outside the steps). Twice: the pool's own message, at the
failed allocation ("held by ..."), and this record, when the failure was
recorded ("held then: ..."), a moment later, after the failed step let go
of its tensors. Before, the message gave the free bytes and chunks only,
and a packed search that lost a trial with no other trial admitted beside
it (issue 58) could not tell what had taken the room. In six io-mem
searches the record named a trial built but not yet admitted beside each
lost one (Note [Neighbours before their admission] in
tensile_tf/search/trials.py)."""
from __future__ import annotations

import re
import traceback

from tensile_tf.runtime.records import JobState, JobStatus


class NonFiniteLoss(RuntimeError):
    """A job's loss became NaN or infinite and the job is configured to stop."""


def summarize_error(error: BaseException | str, limit: int = 2000) -> str:
    """The informative part of an error message, on one line.

    TensorFlow's graph execution errors open with "Graph execution error:" and
    a Python stack of where the failing node was defined; the cause follows,
    then "[[{{node NAME}}]]". Keep the cause and the node.
    """
    if isinstance(error, BaseException):
        message = getattr(error, "message", None) or str(error)
        fallback = type(error).__name__
    else:
        message, fallback = error, "error"
    cause, node = [], None
    for line in message.splitlines():
        text = line.strip()
        if not text or text == "Graph execution error:" or text.startswith("Detected at node") \
                or line.startswith("  File "):
            continue
        if text.startswith("[[{{node "):
            node = text[len("[[{{node "):].split("}}")[0]
            continue
        cause.append(text)
    summary = " ".join(cause[:4])
    if node:
        summary += f" (at node {node})"
    return summary[:limit] or fallback


# What the C++ pool's OOM message suggests (tf_plugin/allocator/stream_aware_pool.cc,
# OomMessage): written for the library's users; a YAML user gets config keys instead.
_POOL_OOM_REMEDY = re.compile(r"; raise the pool capacity \(TENSILE_POOL_BYTES.*?\(swapping / recomputation\)")


def oom_remedy(state: JobState) -> str:
    """What a YAML user can change when the job ran out of pool memory, with
    the plan's own prediction when the job ran planned; the batch size only
    where a key sets it (``jobs.job.batch_size_key``)."""
    from tensile_tf.jobs.job import batch_size_key

    spec = state.job.spec
    key = batch_size_key(spec) if spec is not None else ("batch_size", None)
    lower = "" if key is None else f"lower this job's `{key[0]}:`{'' if key[1] is None else f' (now {key[1]})'}"
    if state.plan is not None:
        from tensile_tf.units import human_bytes

        return (f"raise `pool:`{' or ' + lower if lower else ''}; its plan predicted a peak of "
                f"{human_bytes(state.plan.predicted_planned_peak_bytes)} for a budget of "
                f"{human_bytes(state.plan.budget_bytes)} (lower `run.plan_budget:` to plan with more room)")
    return f"raise `pool:`, {lower + ', ' if lower else ''}or set `run.planner: tensile` to plan swaps"


def pool_holders(jobs: dict[str, dict], limit: int = 6) -> str:
    """Who held the pool, largest first, from ``pool_stats()["jobs"]`` (stream -> counters):
    "held then: j1 20.1 MiB, outside every job 1.2 MiB, ..." (Note [What held the pool])."""
    from tensile_tf.units import human_bytes

    held = sorted(((int(c.get("current", 0)), name) for name, c in jobs.items() if c.get("current", 0) > 0),
                  reverse=True)
    if not held:
        return ""
    names = [f"{'outside every job' if name == 'default' else name} {human_bytes(b)}" for b, name in held[:limit]]
    more = f" and {len(held) - limit} more" if len(held) > limit else ""
    return f"held then: {', '.join(names)}{more}"


def _held_at_failure() -> str:
    """``pool_holders`` of the pool as it is now, or "" where the pool is not loaded (the pure tier)."""
    import sys

    if "tensile_tf.tf.pool" not in sys.modules:
        return ""
    try:
        return pool_holders(sys.modules["tensile_tf.tf.pool"].pool_stats().get("jobs", {}))
    except Exception:   # noqa: BLE001 - a record of a failure never fails itself
        return ""


def record_failure(state: JobState, error: BaseException, at_s: float,
                   status: JobStatus = JobStatus.failed, preface: str = "") -> None:
    """Marks the job failed (or rejected) with ``error``'s summary (after ``preface``) and
    traceback. The status is set last: other threads (the run loop's progress reports,
    a search driver) read a final status as "its record is complete"."""
    state.error_type = type(error).__name__
    state.error = preface + summarize_error(error)
    if state.error_type == "ResourceExhaustedError":
        remedy = oom_remedy(state)
        state.error, n = _POOL_OOM_REMEDY.subn("; " + remedy, state.error)
        if not n:
            state.error += f"; {remedy}"
        held = _held_at_failure()      # Note [What held the pool]
        if held:
            state.error += f" ({held})"
    state.traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    state.ended_at_s = at_s
    state.status = status


__all__ = ["NonFiniteLoss", "pool_holders", "record_failure", "summarize_error"]


def total_need(state: JobState, capacity: int) -> str:
    """Issue 58: what a job refused for a pool too small for it alone needs, against the pool
    (the op's request alone, all its message said, told too little); "" where it cannot be
    predicted. A cold-planned job's step is rewritten: its capture's graph is the unplanned one."""
    from tensile_tf.tf.unplanned_peaks import footprint_needs, graph_needs
    from tensile_tf.units import human_bytes

    try:
        captured = state.rt.captured
        if state.rt.planned_step is not None and captured is not None:
            needs = footprint_needs(captured.graph)
        else:
            needs = graph_needs(state.name, state.rt.step_fn, state.rt.first_batch,
                                getattr(state.rt.train, "optimizer", None))
    except Exception:  # noqa: BLE001 - only the message's preface depends on it
        needs = None
    if needs is None:
        return ""
    return (f"job {state.name!r} needs about {human_bytes(sum(needs))} unplanned (predicted from "
            f"its graph) against the pool's {human_bytes(capacity)}: ")
