"""The plan rewrite on small hand-written steps, with hand-made events."""
import numpy as np
import tensorflow as tf

from tensile_tf.capture import capture_job_graph
from tensile_tf.rewrite import apply_plan
from tensile_tf.scheduler.plan import JobPlan, RecomputeEvent


def test_a_recomputation_fed_by_an_earlier_recomputation():
    """Sin runs after the first recomputation's before_op, so it reads the clone
    of Tanh; recomputing Sin too gives a chain whose input is a clone (seen on
    two ResNet50 jobs on a capped link: the rewrite looked the clone up in the
    traced graph and failed)."""

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        a = tf.tanh(x)
        m = a * 2.0
        b = tf.sin(a)
        n = tf.exp(b)
        p = b * 3.0
        return tf.reduce_sum(m + n + p)

    x = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))
    graph = capture_job_graph("chained", step, (x,))
    names = {o.op_type: o.name for o in graph.ops}
    muls = [o.name for o in graph.ops if o.op_type == "Mul"]
    recompute_a = RecomputeEvent("chained", f"{names['Tanh']}:0", release_after_op=muls[0], before_op=names["Sin"],
                                 trigger_op=muls[0], ops=[names["Tanh"]], size_bytes=256, time_s=0.0, msps=0.0)
    recompute_b = RecomputeEvent("chained", f"{names['Sin']}:0", release_after_op=names["Exp"], before_op=muls[1],
                                 trigger_op=names["Exp"], ops=[names["Sin"]], size_bytes=256, time_s=0.0, msps=0.0)
    planned = apply_plan(step, (x,), JobPlan("chained", recomputes=[recompute_a, recompute_b]), graph)
    assert planned.report.recomputes == 2 and not planned.report.skipped
    assert planned(x).numpy().tobytes() == step(x).numpy().tobytes()
    # the second recomputation reads the first one's clone
    gate = [n for n in planned.graph_def.node if n.op == "TensileRecomputeGate"][1]
    assert any(i.startswith("tensile/recompute_") for i in gate.input)
