"""The few private TensorFlow internals tensile_tf relies on, in one place.

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
