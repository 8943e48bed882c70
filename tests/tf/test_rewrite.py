"""The plan rewrite on small hand-written steps, with hand-made events."""
import numpy as np
import tensorflow as tf

from tensile_tf.tf.capture import capture_job_graph
from tensile_tf.tf.rewrite import apply_plan
from tensile_tf.scheduler.plan import JobPlan, RecomputeEvent, SwapEvent


def _run_traced(planned, x, pool):
    """Runs a planned step once (it traces), then once more with the pool's
    trace cleared and the swap stats reset: that run's output and trace."""
    from tf_plugin import swap

    planned(x)
    swap.drain_swap_channel()
    swap.reset_swap_stats()
    pool.clear_trace()
    out = planned(x).numpy()
    swap.drain_swap_channel()
    return out, pool.trace()


def _freed_at(trace, op: str) -> int:
    """Where in a pool trace the buffer ``op`` allocated is freed."""
    made = next(k for k, e in enumerate(trace) if e["kind"] == "alloc" and e["op"].endswith(op))
    return next(k for k, e in enumerate(trace) if k > made and e["kind"] == "free"
                and e["offset"] == trace[made]["offset"])


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

    from tensile_tf.tf.rewrite.graph_edit import _GraphEdit

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


def test_a_tensor_swapped_in_for_a_recomputation_leaves_the_device_across_its_gap():
    """Note [Swap-ins for recomputation]: b = sin(a) is recomputed before its
    late use, so its clone reads a there; the plan swaps a out after its
    forward use and back in for that recompute step. The rewrite carries the
    swap out (it skipped it before), the gate reads the swap-in, a's buffer
    leaves the pool in the gap, and the step computes what it computed."""
    import tf_plugin
    from tf_plugin import swap

    from tensile_tf.scheduler.access_sequence import recompute_step_name

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        a = tf.tanh(x)                    # 4 MiB, read by sin only
        b = tf.sin(a)                     # dropped after its early use, recomputed for the late one
        early = tf.reduce_sum(b)
        d = tf.cos(tf.exp(x))             # the peak: x, exp's 4 MiB and cos's 4 MiB (and a, unless swapped)
        middle = tf.reduce_sum(d)
        return early + middle + tf.reduce_max(b)

    x = tf.constant(np.linspace(-1, 1, 1 << 20, dtype=np.float32).reshape(1024, 1024))
    graph = capture_job_graph("regrown", step, (x,))
    names = [o.name for o in graph.ops]
    by_type = {o.op_type: o.name for o in graph.ops}
    sin, cos, late = by_type["Sin"], by_type["Cos"], by_type["Max"]
    early = next(c for c in graph.tensors[f"{sin}:0"].consumers if c != late)
    middle = next(c for c in graph.tensors[f"{cos}:0"].consumers)
    a, size = f"{by_type['Tanh']}:0", 1 << 22
    recompute_b = RecomputeEvent("regrown", f"{sin}:0", release_after_op=early, before_op=late,
                                 trigger_op=names[names.index(late) - 1], ops=[sin], size_bytes=size, time_s=0.0,
                                 msps=0.0)
    swap_a = dict(swap_outs=[SwapEvent("regrown", a, "swap_out", sin, 0.0, 0.0, 0.0, size, release_after_op=sin)],
                  swap_ins=[SwapEvent("regrown", a, "swap_in", middle, 0.0, 0.0, 0.0, size,
                                      serves_op=recompute_step_name(sin, f"{sin}:0"))])
    assert names.index(early) < names.index(cos) < names.index(middle) < names.index(late)
    pool = tf_plugin.device_pool()   # its event trace is on by default (capture reads it): left on
    pool.set_trace_enabled(True)
    freed_before = {}
    for name, plan in {"recompute": JobPlan("regrown", recomputes=[recompute_b]),
                       "recompute and swap": JobPlan("regrown", recomputes=[recompute_b], **swap_a)}.items():
        planned = apply_plan(step, (x,), plan, graph)
        assert not planned.report.skipped, planned.report.skipped
        out, trace = _run_traced(planned, x, pool)
        assert out.tobytes() == step(x).numpy().tobytes(), name
        # when a's buffer is freed: before the exp op allocates (the gap), or after
        a_freed = _freed_at(trace, by_type["Tanh"])
        exp_at = next(k for k, e in enumerate(trace) if e["kind"] == "alloc" and e["op"].endswith(by_type["Exp"]))
        freed_before[name] = {
            "exp": a_freed < exp_at,
            "swap-in": a_freed < next((k for k, e in enumerate(trace) if e["kind"] == "alloc" and "swap_in" in e["op"]),
                                      len(trace))}
        moved = swap.swap_stats()["channel"]
        if "swap" in name:
            assert planned.report.activation_swap_ins == 1 and planned.report.recomputes == 1
            assert (moved["swap_outs"], moved["swap_ins"], moved["bytes_in"]) == (1, 1, size), moved
            gate = next(n for n in planned.graph_def.node if n.op == "TensileRecomputeGate")
            data = [i for i in gate.input if not i.startswith("^")]
            assert len(data) == 1 and data[0].startswith("tensile/swap_in_"), gate.input
            # Note [A planned step without a trace]: a lateness check nothing reads still ran
            checks = sum(n.op == "TensileSwapCheck" for n in planned.graph_def.node)
            assert checks == 1 and moved["checked_swap_ins"] == checks, moved
    # Without the swap, the gate holds a across the gap; with it, a's buffer is
    # freed once copied out, before the swap-in allocates its copy (the
    # swap-in reads the swap-out's handle; the exp op may come first or not).
    assert not freed_before["recompute"]["exp"], freed_before
    assert freed_before["recompute and swap"]["swap-in"], freed_before


def test_an_owner_swapped_across_its_views_reads_frees_its_buffer_in_the_gap():
    """Note [Views made again]: r = reshape(h) shares h's buffer and is read
    early and late; h itself is read last. The plan swaps h out after the
    early read and back in for the late read of r. The late read reads the
    reshape made again from the swap-in, so h's buffer leaves the pool in the
    gap (before, r pinned it until its late read), and the step computes what
    it computed."""
    import tf_plugin
    from tf_plugin import swap

    from tensile_tf.tf.step_memory import apply_step_memory, measure_step_memory
    from tensile_tf.scheduler.access_sequence import TensorAccessSequence
    from tensile_tf.scheduler.latency import UniformLatency

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        h = tf.tanh(x)                    # 4 MiB, the owner
        r = tf.reshape(h, [-1])           # a view of h's buffer
        early = tf.reduce_sum(r)
        d = tf.cos(tf.exp(x))             # the gap: exp's 4 MiB (cos writes into it) beside x, and h unless swapped
        middle = tf.reduce_sum(d)
        late_view = tf.reduce_max(r + middle)
        return early + middle + late_view + tf.reduce_min(h + late_view)

    x = tf.constant(np.linspace(-1, 1, 1 << 20, dtype=np.float32).reshape(1024, 1024))
    graph = capture_job_graph("viewed", step, (x,))
    apply_step_memory(graph, measure_step_memory(step, (x,), graph, steps=1))   # the trace finds the view
    names = [o.name for o in graph.ops]
    by_type = {o.op_type: o.name for o in graph.ops}
    h, r = f"{by_type['Tanh']}:0", f"{by_type['Reshape']}:0"
    assert graph.tensors[r].view_of == h
    early = next(c for c in graph.tensors[r].consumers if names.index(c) < names.index(by_type["Exp"]))
    late = next(c for c in graph.tensors[r].consumers if names.index(c) > names.index(by_type["Cos"]))
    middle = next(c for c in graph.tensors[f"{by_type['Cos']}:0"].consumers)
    # the planner counts r's reads as h's: its late read is h's access, and h's own read comes last
    tas = TensorAccessSequence(graph, UniformLatency())
    assert tas.read_as_owner == {tas.tindex[r]: tas.tindex[h]} and tas.tindex[h] not in tas.view_spans
    assert names.index(late) in tas.acc[tas.tindex[h]]
    size = 1 << 22
    plan = JobPlan("viewed",
                   swap_outs=[SwapEvent("viewed", h, "swap_out", early, 0.0, 0.0, 0.0, size, release_after_op=early)],
                   swap_ins=[SwapEvent("viewed", h, "swap_in", middle, 0.0, 0.0, 0.0, size, serves_op=late)])
    pool = tf_plugin.device_pool()   # its event trace is on by default (capture reads it): left on
    pool.set_trace_enabled(True)
    planned = apply_plan(step, (x,), plan, graph)
    assert not planned.report.skipped, planned.report.skipped
    assert planned.report.views_made_again == 1
    out, trace = _run_traced(planned, x, pool)
    assert out.tobytes() == step(x).numpy().tobytes()
    moved = swap.swap_stats()["channel"]
    assert (moved["swap_outs"], moved["swap_ins"], moved["bytes_in"]) == (1, 1, size), moved
    # h's buffer is freed once copied out, before the swap-in allocates its
    # copy (the swap-in reads the swap-out's handle, and TensorFlow drops an
    # op's inputs before its successors run); with r read late it was freed
    # only after the late read, so both copies were on the device at once
    h_freed = _freed_at(trace, by_type["Tanh"])
    swap_in_at = next(k for k, e in enumerate(trace) if e["kind"] == "alloc" and "swap_in" in e["op"])
    assert h_freed < swap_in_at, (h_freed, swap_in_at)


def test_a_second_recomputation_after_a_swap_in_reads_that_swap_in():
    """Note [Swap-ins for recomputation]: a is swapped out after its forward
    uses and back in for the recomputation of b = sin(a); the recomputation
    of c = sigmoid(a), later, reads a too. Its gate used to read a itself
    (the swap-in was keyed to b's recomputation only), which held a's buffer
    on the device across the whole gap; now it reads the swap-in, as the
    graph's own consumers after it do, and the step computes what it did."""
    import tf_plugin

    from tensile_tf.scheduler.access_sequence import recompute_step_name

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        a = tf.tanh(x)
        b = tf.sin(a)
        c = tf.sigmoid(a)
        early = tf.reduce_sum(b) + tf.reduce_sum(c)
        d = tf.cos(tf.exp(x))
        middle = tf.reduce_sum(d)
        late_b = tf.reduce_max(b)
        return early + middle + late_b + tf.reduce_min(c)

    x = tf.constant(np.linspace(-1, 1, 1 << 20, dtype=np.float32).reshape(1024, 1024))
    graph = capture_job_graph("twice", step, (x,))
    names = [o.name for o in graph.ops]
    by_type = {o.op_type: o.name for o in graph.ops}
    sin, sig, cos = by_type["Sin"], by_type["Sigmoid"], by_type["Cos"]
    late_b, late_c = by_type["Max"], by_type["Min"]
    early_b = next(c for c in graph.tensors[f"{sin}:0"].consumers if c != late_b)
    early_c = next(c for c in graph.tensors[f"{sig}:0"].consumers if c != late_c)
    middle = next(c for c in graph.tensors[f"{cos}:0"].consumers)
    first, second = sorted([(late_b, sin, early_b), (late_c, sig, early_c)], key=lambda r: names.index(r[0]))
    size = 1 << 22
    recomputes = [RecomputeEvent("twice", f"{op}:0", release_after_op=early, before_op=late,
                                 trigger_op=names[names.index(late) - 1], ops=[op], size_bytes=size, time_s=0.0,
                                 msps=0.0) for late, op, early in (first, second)]
    a = f"{by_type['Tanh']}:0"
    last_forward = max(sin, sig, key=names.index)
    assert max(names.index(early_b), names.index(early_c)) < names.index(middle) < names.index(first[0])
    plan = JobPlan("twice", recomputes=recomputes,
                   swap_outs=[SwapEvent("twice", a, "swap_out", last_forward, 0.0, 0.0, 0.0, size,
                                        release_after_op=last_forward)],
                   swap_ins=[SwapEvent("twice", a, "swap_in", middle, 0.0, 0.0, 0.0, size,
                                       serves_op=recompute_step_name(first[1], f"{first[1]}:0"))])
    pool = tf_plugin.device_pool()
    pool.set_trace_enabled(True)
    planned = apply_plan(step, (x,), plan, graph)
    assert not planned.report.skipped, planned.report.skipped
    assert planned.report.recomputes == 2 and planned.report.activation_swap_ins == 1
    gates = [n for n in planned.graph_def.node if n.op == "TensileRecomputeGate"]
    assert len(gates) == 2
    for gate in gates:
        data = [i for i in gate.input if not i.startswith("^")]
        assert len(data) == 1 and data[0].startswith("tensile/swap_in_"), gate.input
    out, trace = _run_traced(planned, x, pool)
    assert out.tobytes() == step(x).numpy().tobytes()
    # a's buffer leaves the pool before the swap-in allocates its copy
    a_freed = _freed_at(trace, by_type["Tanh"])
    assert a_freed < next(k for k, e in enumerate(trace) if e["kind"] == "alloc" and "swap_in" in e["op"])


def test_a_planned_step_instantiated_off_its_thread_runs_nothing_until_it_is_called():
    """Note [Instantiated off the job's thread]: a worker instantiates the
    planned step with a call cancelled before it starts. Nothing runs (the
    step's counter update, which depends on nothing, and its swap-out), no
    error is kept, and the step then computes what the unplanned one does."""
    import contextlib

    from tf_plugin import swap

    calls = tf.Variable(0, dtype=tf.int64)

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        calls.assign_add(1)
        a = tf.tanh(x)
        b = tf.sin(a)
        c = tf.exp(b)
        return tf.reduce_sum(c * a)

    x = tf.constant(np.linspace(-1, 1, 1 << 16, dtype=np.float32).reshape(256, 256))
    graph = capture_job_graph("instantiated", step, (x,))
    by_type = {o.op_type: o.name for o in graph.ops}
    a, size = f"{by_type['Tanh']}:0", 1 << 18
    last = next(c for c in graph.tensors[a].consumers if c != by_type["Sin"])
    plan = JobPlan("instantiated",
                   swap_outs=[SwapEvent("instantiated", a, "swap_out", by_type["Sin"], 0.0, 0.0, 0.0, size,
                                        release_after_op=by_type["Sin"])],
                   swap_ins=[SwapEvent("instantiated", a, "swap_in", by_type["Exp"], 0.0, 0.0, 0.0, size,
                                       serves_op=last)])
    planned = apply_plan(step, (x,), plan, graph)
    assert planned.report.activation_swap_ins == 1 and not planned.report.skipped
    expected = step(x).numpy().tobytes()
    calls.assign(0)
    swap.drain_swap_channel()
    swap.reset_swap_stats()
    scopes = []

    @contextlib.contextmanager
    def scope():   # as the job's stream scope is entered on the worker
        scopes.append(True)
        yield

    planned.instantiate_in_background(scope)
    planned.wait_ready()
    assert planned.ready and planned.instantiate_error is None and planned.instantiate_s > 0
    assert scopes == [True]
    assert int(calls.numpy()) == 0                               # the update did not run
    assert swap.swap_stats()["channel"]["swap_outs"] == 0       # nor the swap-out
    assert planned(x).numpy().tobytes() == expected
    swap.drain_swap_channel()
    assert int(calls.numpy()) == 1 and swap.swap_stats()["channel"]["swap_outs"] == 1
