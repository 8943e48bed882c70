"""The device pool from the user's side: capacity, stats, trace, and the
attribution of a job's steps to its own pool stream.

Stats use one vocabulary everywhere (bytes): ``capacity``, ``current``,
``peak``, ``allocated``, ``freed``, ``num_allocs``, ``num_frees``,
``num_ooms``, ``largest_alloc``, ``largest_free_chunk``, ``fragmentation``,
``num_syncs``, ``num_stitched`` (Note [Stitched allocations] in
tf_plugin/allocator/stream_aware_pool.h; ``stitched_current``,
``num_live_stitched``, ``stitching``); ``jobs`` maps each job (stream) name to
its own counters.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import tf_plugin

tf_plugin.load()  # the runtime starts here: the pool must be TensorFlow's allocator before any op

import tensorflow as tf  # noqa: E402

from tf_plugin import bind_step_op, device_pool  # noqa: E402
from tf_plugin.tf_internals import mark_func_graph, register_func_graph_transform  # noqa: E402
from tensile_tf.units import parse_bytes  # noqa: E402,F401  (re-exported)
from tensile_tf.tf.plugin_settings import PluginSettings, hand_to_plugin  # noqa: E402
from tensile_tf.tf.plugin_settings import in_effect as plugin_settings_in_effect  # noqa: E402


def configure_pool(capacity: int | str) -> None:
    """Sets the device pool's capacity ('8GiB' or bytes) before the first TF op: the plugin's
    settings with this capacity, in one call (Note [One call into the plugin])."""
    hand_to_plugin(dataclasses.replace(plugin_settings_in_effect(),
                                       pool_bytes=parse_bytes(capacity, what="pool capacity")))


def ensure_pool(pool_bytes: int | str) -> None:
    """Creates the device pool with ``pool_bytes``, or checks that the one
    this process has is that size (a process has one pool)."""
    want = parse_bytes(pool_bytes, what="pool_bytes")
    pool = tf_plugin._plugin.device_pool()  # noqa: SLF001
    if pool is None:
        configure_pool(want)
    elif abs(pool.capacity - want) >= tf_plugin.MIN_CHUNK_BYTES:
        raise RuntimeError(
            f"the device pool already exists with {tf_plugin.human_bytes(pool.capacity)}, not the "
            f"{tf_plugin.human_bytes(want)} asked for. A process has one pool: create the JobHost (or call "
            "tensile_tf.install(pool_bytes)) before the first TensorFlow op.")


def create_devices() -> None:
    """Makes TensorFlow create its devices now (on the pool, which must be
    configured), with its GPU probe's messages filtered
    (tf_plugin._loader.gpu_probe_noise_filtered). The CLI calls it; after
    it, TensorFlow's thread settings can no longer change."""
    from tf_plugin._loader import gpu_probe_noise_filtered

    with gpu_probe_noise_filtered():
        tf.config.list_logical_devices()


def _configure_from_environment() -> None:
    """Note [One call into the plugin]: the settings from the environment, handed over once."""
    if tf_plugin._plugin.device_pool() is None:  # noqa: SLF001
        hand_to_plugin(PluginSettings.from_environment())


_configure_from_environment()


def pool_stats() -> dict[str, Any]:
    """The device pool's stats as a plain dict (see module docstring).

    ``host_fallback`` counts allocations made outside op kernels (numpy
    conversions) that the pool could not serve and host memory did;
    ``allocation_waits`` the allocations that waited for other jobs' frees.
    """
    stats = device_pool().stats()
    stats["host_fallback"] = tf_plugin._plugin.host_fallback_stats()  # noqa: SLF001
    stats["allocation_waits"] = tf_plugin._plugin.allocation_wait_stats()  # noqa: SLF001
    return stats


@contextlib.contextmanager
def allocation_wait(ms: int):
    """Note [Waiting for frees] (tf_plugin/allocator/tf_pool_allocator.cc):
    inside, an op kernel's allocation that does not fit waits up to ``ms``
    for other jobs' frees before it is an OOM."""
    plugin = tf_plugin._plugin  # noqa: SLF001
    previous = plugin.allocation_wait_stats()["wait_ms"]
    plugin.set_allocation_wait_ms(int(ms))
    try:
        yield
    finally:
        plugin.set_allocation_wait_ms(previous)


@contextlib.contextmanager
def host_fallback_scope():
    """Note [Host fallback while building] (tf_plugin/allocator/tf_pool_allocator.cc):
    inside, this thread's allocations that the pool cannot serve come from
    host memory. Yields a callable: how many allocations fell back so far."""
    plugin = tf_plugin._plugin  # noqa: SLF001
    start = plugin.host_fallback_stats()["num_allocs"]
    previous = plugin.set_thread_host_fallback(True)
    try:
        yield lambda: plugin.host_fallback_stats()["num_allocs"] - start
    finally:
        plugin.set_thread_host_fallback(previous)


def reset_pool_peak() -> None:
    """Sets the pool's and every job's peak to their current bytes."""
    device_pool().reset_peak()


def sync_pool() -> None:
    """Waterwave SyncAndCoalesce on the device pool."""
    device_pool().sync_and_coalesce()


def pool_trace() -> list[dict[str, Any]]:
    """The pool's event trace (oldest first): alloc, free, sync and oom events."""
    return device_pool().trace()


# Note [Truncated op names] in tf_plugin/allocator/event_trace.h: the trace
# keeps at most 63 bytes of an op name, as head + "~" + tail.
TRACED_OP_NAME_BYTES = 63


TRACED_OP_NAME_HEAD = 20


def traced_op_name(op_name: str) -> str:
    """The name the pool's trace keeps for ``op_name`` (an ASCII name: the
    trace cuts bytes): itself, or its head, '~' and its tail."""
    if len(op_name) <= TRACED_OP_NAME_BYTES:
        return op_name
    tail = TRACED_OP_NAME_BYTES - TRACED_OP_NAME_HEAD - 1
    return f"{op_name[:TRACED_OP_NAME_HEAD]}~{op_name[-tail:]}"


def traced_op_matches(traced: str, op_name: str) -> bool:
    """Whether the op name an event of the pool's trace holds stands for ``op_name``."""
    if len(op_name) <= TRACED_OP_NAME_BYTES:
        return traced == op_name
    head, sep, tail = traced.partition("~")
    return bool(sep) and op_name.startswith(head) and op_name.endswith(tail)


def ops_of_traced_names(ops, names, prefix: str = "") -> dict[str, list]:
    """Traced op name -> the ops (anything with a ``name``) it stands for
    (Note [Truncated op names]: a cut name may stand for several, in the
    order of ``ops``). ``prefix``: what a rewrite's import put before every
    op name."""
    by_name = {prefix + o.name: o for o in ops}
    by_traced: dict[str, list] = {}
    for o in ops:
        if len(prefix + o.name) > TRACED_OP_NAME_BYTES:
            by_traced.setdefault(traced_op_name(prefix + o.name), []).append(o)
    ops_of: dict[str, list] = {}
    for name in names:
        if name in by_name:
            ops_of[name] = [by_name[name]]
        elif "~" in name:
            ops_of[name] = by_traced.get(name) or [o for o in ops if traced_op_matches(name, prefix + o.name)]
    return ops_of


class JobStream:
    """A job's stream in the device pool.

    Every allocation made by a step function built with :meth:`step_function`
    is attributed to this job: the step first runs the TensileBindStep op,
    which binds the step's TensorFlow step id to the stream.
    """

    def __init__(self, name: str):
        self.name = name
        self._pool = device_pool()
        self.stream: int = self._pool.register_stream(name)
        self._released = False

    def step_function(self, fn: Callable, *, graph_transform: Callable | None = None,
                      **tf_function_kwargs) -> Callable:
        """Wraps ``fn`` (plain or tf.function) in a tf.function attributed to this job.

        ``graph_transform(func_graph)``, if given, edits each trace of the step
        right after tracing (e.g. inserts node-group barriers).
        """
        if graph_transform is not None:
            register_func_graph_transform()
        attributed_step = self.attributed(fn, graph_transform)
        attributed_step.__name__ = f"{getattr(fn, '__name__', 'step')}_{self.name}"
        tf_function_kwargs.setdefault("jit_compile", False)
        return tf.function(attributed_step, **tf_function_kwargs)

    def attributed(self, fn: Callable, graph_transform: Callable | None = None) -> Callable:
        """``fn`` for tracing into a tf.function whose run's allocations are this job's: its ops run
        after the TensileBindStep op, which binds the run's step to the stream (graph ops run on
        TensorFlow's threads, where ``eager_scope`` does not reach)."""
        stream, job = self.stream, self.name

        def attributed_fn(*args, **kwargs):
            bind = bind_step_op(stream, job)   # named for the job (Note [Profiles of one job's steps])
            with tf.control_dependencies([bind]):
                out = fn(*args, **kwargs)
            if graph_transform is not None:
                mark_func_graph(tf.compat.v1.get_default_graph(), graph_transform)
            return out

        return attributed_fn

    @contextlib.contextmanager
    def eager_scope(self) -> Iterator["JobStream"]:
        """Attributes eager allocations of this thread (model building,
        variable creation, tf.data iteration) to this job while inside."""
        previous = tf_plugin._plugin.set_thread_stream(self.stream)  # noqa: SLF001
        try:
            yield self
        finally:
            tf_plugin._plugin.set_thread_stream(previous)  # noqa: SLF001

    def stats(self) -> dict[str, Any]:
        """This job's counters (current, peak, allocated, freed, ...)."""
        return self._pool.stats()["jobs"].get(self.name, {})

    def reset_peak(self) -> None:
        """Starts this job's peak afresh from its current bytes (others' untouched)."""
        self._pool.reset_stream_peak(self.stream)

    def rename(self, name: str) -> None:
        """The stream's bytes and counters from now on reported under ``name``
        (Note [Reusing a finished job's traced step] in tensile_tf/runtime/traced_step_reuse.py)."""
        self._pool.rename_stream(self.stream, name)
        self.name = name

    def release(self) -> None:
        """Forgets the stream; its freed chunks become available to every job."""
        if not self._released:
            tf_plugin._plugin.unbind_stream(self.stream)  # noqa: SLF001
            self._pool.release_stream(self.stream)
            self._released = True

    def __enter__(self) -> "JobStream":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
