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


def test_graph_edit_refuses_exactly_the_control_edges_that_close_a_cycle():
    """_GraphEdit's cycle check prunes its search by topological rank; every
    answer must still be the plain reachability answer, also after edges that
    go down in rank and nodes added on the way."""
    import itertools
    import random

    from tensile_tf.rewrite import _GraphEdit

    @tf.function(autograph=False)
    def f(x):
        a = tf.sin(x)
        b = tf.cos(a)
        c = tf.exp(a)
        for _ in range(30):  # a longer chain: edges that go down in rank move whole runs of nodes
            b = tf.sin(b)
        return tf.tanh(b + c), tf.sqrt(x)

    gdef = f.get_concrete_function(tf.TensorSpec([4], tf.float32)).graph.as_graph_def()
    edit = _GraphEdit(gdef)

    def reachable(src, dst):  # plain search, no ranks
        stack, seen = [src], {src}
        while stack:
            x = stack.pop()
            if x == dst:
                return True
            for y in edit.succ.get(x, ()):
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    rng = random.Random(0)
    added, refused = 0, 0
    for k in range(400):
        if k % 4 == 0:  # a swap op: a new node fed early, read late, then anchored (often going down in rank)
            names = sorted(edit.nodes)
            edit.add_node(f"fresh{k}", "NoOp", [f"^{rng.choice(names)}"], {})
            edit.add_control(f"fresh{k}", rng.choice(names))
            src, dst = rng.choice(names), f"fresh{k}"
        else:
            src, dst = rng.sample(sorted(edit.nodes), 2)
        closes_cycle = reachable(dst, src)
        assert edit.add_control(src, dst) is not closes_cycle, (src, dst)
        added, refused = added + (not closes_cycle), refused + closes_cycle
        if edit._rank is not None:  # the invariant the pruning relies on: every edge goes up in rank
            for name, node in edit.nodes.items():
                for i in node.input:
                    before = i.lstrip("^").split(":")[0]
                    assert edit._rank[before] < edit._rank[name], (before, name)
    assert added > 20 and refused > 20
    assert edit.rank_rebuilds <= 2  # edges going down in rank moved a few nodes instead
    # the edges kept form a DAG
    for a, b in itertools.permutations(sorted(edit.nodes)[:12], 2):
        assert not (reachable(a, b) and reachable(b, a))
