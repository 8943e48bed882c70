"""How a job's failure is recorded: one line for tables, the whole traceback
kept for the output directory. A failure is always the job's own: the host
catches it at the job's boundary and the other jobs go on."""
from __future__ import annotations

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


def record_failure(state: JobState, error: BaseException, at_s: float,
                   status: JobStatus = JobStatus.failed) -> None:
    """Marks the job failed (or rejected) with ``error``'s summary and traceback."""
    state.status = status
    state.error_type = type(error).__name__
    state.error = summarize_error(error)
    state.traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-8000:]
    state.ended_at_s = at_s


__all__ = ["NonFiniteLoss", "record_failure", "summarize_error"]
