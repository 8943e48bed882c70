"""Every private TensorFlow internal this project relies on, in one place
(checked on TensorFlow 2.21). Nothing here runs at import: each hook is
installed by an explicit call from the code that needs it.

| internal | used for | called from |
| --- | --- | --- |
| ``context.context_safe()._context_handle`` | "devices exist": plugin loaded too late | ``tf_plugin._loader`` |
| ``_pywrap_util_port.IsMklEnabled`` | warn when oneDNN's rewrites are on | ``tf_plugin._loader`` |
| ``ops._gradient_registry`` | Note [Custom gradients keep traced jobs alive] | ``tensile_tf.runtime.probing``, ``tensile_tf.runtime.traced_step_reuse``, ``tensile_tf.tf.unplanned_peaks`` |
| ``transform.FUNC_GRAPH_TRANSFORMS`` | Note [Editing a step after tracing] | ``tensile_tf.tf.pool.JobStream`` |
| ``auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS`` | Note [Automatic control dependencies] | ``tensile_tf.tf.rewrite`` |
| ``Graph._get_function``, ``function_def_to_graph`` | inline a called function while capturing (``inlined_call``, also for timing kernels alone) | ``tensile_tf.tf.capture`` |
| ``context.context()._config`` | memory optimizer off (Note [Graph-dependent Grappler rewrites]); its modes for the baseline suite | ``tensile_tf.tf.determinism``, ``benchmarks/plan_execution_reference.py`` |
| ``Operation._set_attr("_recompute_hint")`` | Grappler's MANUAL recomputation hints (baseline suite) | ``benchmarks/plan_execution_reference.py`` |
| ``xplane_pb2.XSpace`` | read tf.profiler's per-op latencies | ``tensile_tf.tf.capture`` |
| ``pywrap_tf_session`` (graph import, ``TF_GraphToFunction_wrapper``), ``atomic_function.from_function_def``, ``ConcreteFunction._inference_function``, ``op_def_registry`` | Note [A planned step without a trace] | ``tensile_tf.tf.rewrite.planned_step`` |
| ``execute.execute_with_cancellation``, ``cancellation.CancellationManager`` | Note [Instantiated off the job's thread] | ``tensile_tf.tf.rewrite.planned_step`` |
| Keras 3.15: ``keras.src.backend.tensorflow.trainer.TFEpochIterator`` (its ``_get_iterator()``: fit's dataset, and ``_distributed_dataset``, replaced by that dataset with autotuning off, Note [No autotuning thread per job]), ``keras.src.trainers.data_adapters.array_slicing.train_validation_split``, ``keras.src.trainers.data_adapters.data_adapter_utils.unpack_x_y_sample_weight``, ``Model._eval_epoch_iterator`` with ``evaluate(_use_cached_eval_dataset=True)`` (fit's validation iterator, made once), ``Trainer._symbolic_build(data_batch=)`` (the model's, compile metrics' and optimizer's variables made before the step's trace, Note [Variables made before the trace]) | fit's own batches, split and validation data (Note [fit's batches]), one trace of fit's step | ``tensile_tf.jobs.keras_fit``; ``_symbolic_build`` also ``tensile_tf.jobs.job.build_train_step`` (a keras_file job) |
| ``tf.data`` dataset classes by name (``_OptionsDataset`` and its ``_input_dataset``, ``_PrefetchDataset``); ``framework.config.is_op_determinism_enabled`` | whether a pipeline ends in a prefetch, and whether tf.data would inject one (Note [The prefetch tf.data would add]) | ``tensile_tf.jobs.datasets.iterated_as_tf_data_would`` |

Note [Custom gradients keep traced jobs alive]
``tf.custom_gradient`` in graph mode (Keras optimizers use it while a train
step is traced) registers its gradient function in TensorFlow's global
gradient registry under a fresh "CustomGradient-<uid>" name and never
unregisters it. That function closes over tensors of the traced FuncGraph,
whose captures hold the job's resource-variable handles, so a finished job's
variables (parameters, optimizer slots) would stay in the device pool
forever. The host records which registry names a job's tracing added and
forgets exactly those when it tears the job down.
"""
from __future__ import annotations

from tensorflow.python.framework import ops

# Note [Editing a step after tracing]
# TensorFlow applies every callable in FUNC_GRAPH_TRANSFORMS to each FuncGraph
# it traces, after automatic control dependencies and before it builds the
# function. Ours runs only the transform a step marked on its own graph while
# it was traced, so other tf.functions are untouched.
_TRANSFORM_ATTR = "_tensile_graph_transform"


def _registry() -> dict:
    return ops._gradient_registry._registry  # noqa: SLF001


def custom_gradient_names() -> set[str]:
    """Names of the custom gradients registered so far."""
    return {name for name in _registry() if name.startswith("CustomGradient-")}


def forget_custom_gradients(names: set[str]) -> int:
    """Unregisters the given custom gradients; returns how many were removed."""
    registry = _registry()
    removed = 0
    for name in names:
        if registry.pop(name, None) is not None:
            removed += 1
    return removed


def _apply_marked_transform(func_graph) -> None:
    transform = getattr(func_graph, _TRANSFORM_ATTR, None)
    if transform is not None:
        transform(func_graph)


def register_func_graph_transform() -> None:
    """Installs the FuncGraph hook of Note [Editing a step after tracing] (once)."""
    from tensorflow.python.eager.polymorphic_function import transform

    if _apply_marked_transform not in transform.FUNC_GRAPH_TRANSFORMS:
        transform.FUNC_GRAPH_TRANSFORMS.append(_apply_marked_transform)


def mark_func_graph(func_graph, graph_transform) -> None:
    """Asks the hook to run ``graph_transform`` on ``func_graph`` once traced."""
    setattr(func_graph, _TRANSFORM_ATTR, graph_transform)


def tensorflow_devices_exist() -> bool:
    """Whether TensorFlow created its eager context and devices already."""
    from tensorflow.python.eager import context

    ctx = context.context_safe()
    return ctx is not None and ctx._context_handle is not None  # noqa: SLF001


def onednn_rewrites_enabled() -> bool:
    """Whether TensorFlow in this process runs oneDNN's graph rewrites."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def exempt_from_automatic_control_deps(op_types: frozenset[str]) -> None:
    """Adds ``op_types`` to tf.function's order-insensitive stateful ops, so
    automatic control dependencies do not chain them in program order (Note
    [Automatic control dependencies] in tensile_tf/tf/rewrite/planned_step.py). Idempotent."""
    from tensorflow.python.framework import auto_control_deps as acd

    if not op_types <= acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS:
        acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS | op_types


def called_function_graph(op):
    """The graph of the function a call op (PartitionedCall, ...) calls."""
    fn = op.graph._get_function(op.get_attr("f").name)  # noqa: SLF001
    fgraph = getattr(fn, "graph", None)
    if fgraph is None:
        from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

        fgraph = function_def_to_graph(getattr(fn, "cached_definition", None) or fn.definition)
    return fgraph


def set_memory_optimizer(mode: str, recomputation_scope: str | None = None) -> None:
    """Grappler's memory optimizer mode (``RewriterConfig.MemOptType``: NO_MEM_OPT,
    MANUAL, RECOMPUTATION_HEURISTICS, HEURISTICS, ...) in the eager context's
    base ConfigProto (there is no public switch); ``recomputation_scope``: the
    name scope of the gradient ops its recomputation feeds (TF2's tapes name
    them "gradient_tape/", Grappler's default is TF1's "gradients/")."""
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    config = config_pb2.ConfigProto()
    if getattr(ctx, "_config", None) is not None:
        config.CopyFrom(ctx._config)  # noqa: SLF001
    rewrite = config.graph_options.rewrite_options
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.MemOptType.Value(mode)
    if recomputation_scope is not None:
        rewrite.memory_optimizer_target_node_name_scope = recomputation_scope
    ctx._config = config  # noqa: SLF001


def turn_off_memory_optimizer() -> None:
    """memory_optimization = NO_MEM_OPT (Note [Graph-dependent Grappler rewrites])."""
    set_memory_optimizer("NO_MEM_OPT")


def mark_for_recomputation(func_graph, skip_scopes: tuple[str, ...] = ("gradient_tape/",)) -> int:
    """Sets Grappler's ``_recompute_hint`` on every forward op of a traced
    step (not under ``skip_scopes``, not a variable read, constant or
    placeholder): the hints its memory optimizer's MANUAL mode recomputes
    from. Returns how many ops were marked."""
    from tensorflow.core.framework import attr_value_pb2

    skip_types = {"ReadVariableOp", "Const", "Placeholder", "VarHandleOp", "NoOp", "Identity"}
    marked = 0
    for op in func_graph.get_operations():
        if op.type in skip_types or op.name.startswith(skip_scopes) or "Assign" in op.type or "Apply" in op.type:
            continue
        op._set_attr("_recompute_hint", attr_value_pb2.AttrValue(i=0))  # noqa: SLF001
        marked += 1
    return marked


def memory_optimizer_off() -> bool:
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.eager import context

    mem = context.context().config.graph_options.rewrite_options.memory_optimization
    return mem == rewriter_config_pb2.RewriterConfig.NO_MEM_OPT


def new_xspace():
    """An empty tf.profiler XSpace protobuf (to parse an .xplane.pb file)."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # pragma: no cover - layout of older TF wheels
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    return xplane_pb2.XSpace()


def eager_function_from_graph_def(graph_def, name: str, *, prefix: str, inputs: list[str], outputs: list[str],
                                  control_outputs: list[str], like):
    """Registers ``graph_def`` as a function ``name`` of the eager context, its
    nodes named ``prefix/...``, without a Python graph op per node (Note [A
    planned step without a trace] in tensile_tf/tf/rewrite/planned_step.py).
    ``inputs`` / ``outputs``: tensor names ("node:k") in ``graph_def``, the
    function's arguments and results in order; ``control_outputs``: nodes
    that must run though nothing reads them; ``like``: the ConcreteFunction
    whose outputs these are (its output structure packs the results).
    Returns the AtomicFunction: ``call_preflattened(flat inputs)``."""
    from tensorflow.core.framework import function_pb2
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.eager.polymorphic_function import atomic_function
    from tensorflow.python.framework import c_api_util

    nodes = sorted({t.partition(":")[0] for t in inputs + outputs} | set(control_outputs))
    graph = ops.Graph()
    with graph._c_graph.get() as c_graph:  # noqa: SLF001
        options = c_api.TF_NewImportGraphDefOptions()
        try:
            c_api.TF_ImportGraphDefOptionsSetPrefix(options, prefix)
            for node in nodes:
                c_api.TF_ImportGraphDefOptionsAddReturnOperation(options, node)
            serialized = c_api_util.ScopedTFBuffer(graph_def.SerializeToString())
            results = c_api.TF_GraphImportGraphDefWithResults(c_graph, serialized.buffer, options)
            try:
                c_ops = dict(zip(nodes, c_api.TF_ImportGraphDefResultsReturnOperations(results)))
            finally:
                c_api.TF_DeleteImportGraphDefResults(results)
        finally:
            c_api.TF_DeleteImportGraphDefOptions(options)

        def output(tensor: str):
            node, _, index = tensor.partition(":")
            return c_api_util.tf_output(c_ops[node], int(index or 0))

        c_function = c_api.TF_GraphToFunction_wrapper(
            c_graph, name, False, None, [output(t) for t in inputs], [output(t) for t in outputs], [],
            [c_ops[n] for n in control_outputs], [], None, "")
    try:
        with c_api_util.tf_buffer() as buffer:
            c_api.TF_FunctionToFunctionDef(c_function, buffer)
            function_def = function_pb2.FunctionDef.FromString(c_api.TF_GetBuffer(buffer))
    finally:
        c_api.TF_DeleteFunction(c_function)
    function_def.attr["_XlaMustCompile"].b = False       # as tf.function(jit_compile=False) marks its steps
    return atomic_function.from_function_def(function_def, like._inference_function.function_type)  # noqa: SLF001


class NotInstantiated(RuntimeError):
    """A call meant only to instantiate a function started it (or failed
    for another reason)."""


def instantiate_eager_function(function, flat_inputs: list) -> None:
    """Instantiates the AtomicFunction ``function`` (TensorFlow's graph
    optimisations and executor, cached by the eager context) without running
    any of its ops: it is called with a cancellation manager cancelled
    before the call, and TensorFlow checks it after instantiating and before
    starting the function (Note [Instantiated off the job's thread] in
    tensile_tf/tf/rewrite/planned_step.py). ``flat_inputs``: tensors of the
    arguments' dtypes and devices (their shapes may differ, e.g. empty: the
    cache's key holds neither shapes nor values) and the captured handles.
    The call holds no GIL while TensorFlow instantiates. Raises
    NotInstantiated with TensorFlow's error if the call was not cancelled
    before it started."""
    from tensorflow.python.eager import cancellation, context, execute
    from tensorflow.python.framework import errors

    ctx = context.context()
    attrs = tuple(x for kv in ctx.function_call_options.as_attrs().items() for x in kv)   # as call_function
    manager = cancellation.CancellationManager()
    manager.start_cancel()
    try:
        execute.execute_with_cancellation(function.name.decode(), num_outputs=len(function.function_type.flat_outputs),
                                          inputs=list(flat_inputs), attrs=attrs, ctx=ctx,
                                          cancellation_manager=manager)
    except errors.CancelledError as e:
        if "cancelled before it was started" in e.message:
            return
        raise NotInstantiated(f"{function.name.decode()}: {e.message}") from e
    except errors.OpError as e:
        raise NotInstantiated(f"{function.name.decode()}: {e.message}") from e
    raise NotInstantiated(f"{function.name.decode()}: the call meant only to instantiate it ran it")


def op_is_stateful(op_type: str) -> bool | None:
    """Whether TensorFlow registers ``op_type`` as stateful; None when no op
    of that name is registered (a library function called as an op)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    return None if op_def is None else bool(op_def.is_stateful)


def eager_function_count() -> int:
    """How many functions the eager context holds now (a planned step's
    function leaves it when its step is dropped)."""
    from tensorflow.python.eager import context

    return len(context.context().list_function_names())
