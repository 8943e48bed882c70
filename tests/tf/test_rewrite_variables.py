"""The plan rewrite of variables (Notes [Variable swaps] and [Reads that outlive a
variable gap] in tensile_tf/tf/rewrite/variable_swaps.py) on small
hand-written steps, with hand-made events."""
import numpy as np
import tensorflow as tf

from tensile_tf.tf.capture import capture_job_graph
from tensile_tf.tf.rewrite import apply_plan
from tensile_tf.scheduler.plan import JobPlan, RecomputeEvent, SwapEvent


def test_a_variable_read_before_its_gap_is_read_again_after_the_swap_in():
    """Note [Reads that outlive a variable gap]: the backward MatMul of a
    two-layer step reads w2 through the forward pass's read. A plan that swaps
    w2 out after the forward MatMul and back in for the backward one must
    rewire that read, else the old read pins w2's buffer across the gap and
    the swap-in's copy is a second one (ResNet50's conv5 kernels: 42 MiB
    twice, 237 MiB measured for 196 MiB predicted)."""
    import tf_plugin
    from tf_plugin import swap

    rng = np.random.default_rng(0)
    # initial values made by a TF op, so the buffers are the pool's (TF may wrap a NumPy array's memory)
    w1 = tf.Variable(tf.constant(rng.standard_normal((64, 1024)).astype(np.float32)) * 0.05, name="w1")
    w2 = tf.Variable(tf.constant(rng.standard_normal((1024, 1024)).astype(np.float32)) * 0.05, name="w2")  # 4 MiB

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.tanh(x @ w1) @ w2))
        g1, g2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    x = tf.constant(rng.standard_normal((8, 64)).astype(np.float32))
    graph = capture_job_graph("two_layers", step, (x,))
    readers = [c for c in graph.tensors["var:" + w2.name.split(":")[0]].consumers
               if graph.ops[[o.name for o in graph.ops].index(c)].op_type == "MatMul"]
    forward, backward = readers[0], readers[-1]      # x@w1@w2, and d(loss)/d(h) = dy @ w2^T
    key, size = "var:" + w2.name.split(":")[0], 1024 * 1024 * 4
    names = [o.name for o in graph.ops]
    plan = JobPlan("two_layers",
                   swap_outs=[SwapEvent("two_layers", key, "swap_out", forward, 0.0, 0.0, 0.0, size,
                                        release_after_op=forward)],
                   swap_ins=[SwapEvent("two_layers", key, "swap_in", names[names.index(backward) - 1], 0.0, 0.0, 0.0,
                                       size, serves_op=backward)])
    start = [v.numpy() for v in (w1, w2)]
    planned = apply_plan(step, (x,), plan, graph)
    assert planned.report.variable_swap_ins == 1 and not planned.report.skipped, planned.report
    again = [n for n in planned.graph_def.node if n.op == "ReadVariableOp" and "var_read_again" in n.name]
    reads_again = [n for n in planned.graph_def.node if any(i.split(":")[0] == again[0].name for i in n.input)]
    assert len(again) == 1 and [n.op for n in reads_again] == ["MatMul"], [n.name for n in reads_again]

    pool = tf_plugin.device_pool()   # its event trace is on by default (capture reads it): left on
    pool.set_trace_enabled(True)
    pool.clear_trace()
    planned_loss = planned(x).numpy()
    swap.drain_swap_channel()
    trace = pool.trace()
    planned_weights = [v.numpy() for v in (w1, w2)]
    # the old buffer (allocated before the step) is freed before the swap-in allocates w2 again
    swap_in = next(k for k, ev in enumerate(trace) if ev["kind"] == "alloc" and "var_swap_in" in ev["op"])
    made, old_freed = set(), False
    for ev in trace[:swap_in]:
        if ev["kind"] == "alloc":
            made.add(ev["offset"])
        elif ev["kind"] == "free" and ev["offset"] not in made and ev["bytes"] >= size:
            old_freed = True
    assert old_freed, "\n".join(f"{ev['kind']} {ev['bytes']} {ev['op'][-50:]}" for ev in trace[:swap_in + 1] if ev["bytes"] > 4096)
    for v, value in zip((w1, w2), start):
        v.assign(value)
    assert step(x).numpy().tobytes() == planned_loss.tobytes()
    assert all(np.array_equal(v.numpy(), p) for v, p in zip((w1, w2), planned_weights))


def test_a_read_with_a_write_before_its_reader_keeps_its_old_value():
    """Note [Reads that outlive a variable gap]: a consumer that reads the
    variable's value from before a write must not read it again after the
    swap-in (it would see the written value): that rewiring is skipped and
    listed, and the step computes what it computed."""
    w = tf.Variable(np.arange(16, dtype=np.float32).reshape(4, 4), name="w_written")

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        before = w.value()
        first = tf.reduce_sum(x @ before)
        w.assign_add(tf.ones([4, 4]))
        return first + tf.reduce_sum(tf.sin(before))   # the value from before the write

    x = tf.ones([2, 4])
    graph = capture_job_graph("written", step, (x,))
    key = "var:" + w.name.split(":")[0]
    names = [o.name for o in graph.ops]
    readers = [c for c in graph.tensors[key].consumers if graph.ops[names.index(c)].op_type in ("MatMul", "Sin")]
    matmul, sin = readers[0], readers[-1]
    plan = JobPlan("written",
                   swap_outs=[SwapEvent("written", key, "swap_out", matmul, 0.0, 0.0, 0.0, 64, release_after_op=matmul)],
                   swap_ins=[SwapEvent("written", key, "swap_in", names[names.index(sin) - 1], 0.0, 0.0, 0.0, 64,
                                       serves_op=sin)])
    start = w.numpy()
    planned = apply_plan(step, (x,), plan, graph)
    assert any("written between the two reads" in why for _, why in planned.report.skipped), planned.report.skipped
    planned_out = planned(x).numpy()
    w.assign(start)
    assert planned_out.tobytes() == step(x).numpy().tobytes()


def test_optimizer_updates_run_as_their_gradients_exist_not_after_all_of_them():
    """Note [No gradient barrier]: Keras 3's Adam passes every gradient
    through one IdentityN. Plan order goes through it, so the first update
    comes before the last gradient op, and the rewritten step has no
    IdentityN left; it trains bit for bit."""
    import keras

    from tensile_tf.tf.executor_order import executor_order
    from tensile_tf.jobs.job import supervised_train_step

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    opt = keras.optimizers.Adam(1e-2)
    step = tf.function(supervised_train_step(model, opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                       jit_compile=False)
    rng = np.random.default_rng(0)
    args = (tf.constant(rng.standard_normal((32, 8)).astype(np.float32)),
            tf.constant(rng.integers(0, 4, 32).astype(np.int32)))
    step(*args)   # builds the optimizer's slots
    traced = step.get_concrete_function(*args).graph.as_graph_def()
    assert any(n.op == "IdentityN" for n in traced.node)   # the barrier this test is about
    graph = executor_order(capture_job_graph("adam", step, args, optimizer=opt), step, args)
    kinds = [o.op_type for o in graph.ops]
    first_update = min(k for k, o in enumerate(graph.ops)   # of a slot or a parameter, not the step counter
                       if any(graph.tensors[t].kind in ("slot", "parameter") for t in o.updates))
    last_gradient = max(k for k, o in enumerate(graph.ops)   # the first layer's weight gradient
                        if o.name.startswith("gradient_tape/") and o.op_type == "MatMul")
    assert first_update < last_gradient, (graph.ops[first_update].name, graph.ops[last_gradient].name, kinds[:5])

    start = [v.numpy() for v in model.weights + list(opt.variables)]
    planned = apply_plan(step, args, JobPlan("adam", order_only=True), graph)
    assert not any(n.op == "IdentityN" for n in planned.graph_def.node)
    losses = [planned(*args).numpy().tobytes() for _ in range(2)]
    after = [v.numpy() for v in model.weights + list(opt.variables)]
    for v, value in zip(model.weights + list(opt.variables), start):
        v.assign(value)
    assert [step(*args).numpy().tobytes() for _ in range(2)] == losses
    assert all(np.array_equal(v.numpy(), a) for v, a in zip(model.weights + list(opt.variables), after))


def test_a_variable_swapped_in_for_a_recomputation_is_read_again_by_its_gate():
    """Note [Swap-ins for recomputation], for a variable: h = x @ w is
    recomputed before its late use, and the plan swaps w out after the
    forward MatMul and back in for that recompute step. The gate reads w
    through a fresh read after the swap-in (a read made before the gap would
    pin the old buffer), the old buffer is freed before the swap-in allocates
    the new one, and the step computes what it computed."""
    import tf_plugin
    from tf_plugin import swap

    from tensile_tf.scheduler.access_sequence import recompute_step_name

    rng = np.random.default_rng(0)
    w = tf.Variable(tf.constant(rng.standard_normal((1024, 1024)).astype(np.float32)) * 0.05, name="w_regrown")

    @tf.function(jit_compile=False, autograph=False)
    def step(x):
        h = tf.matmul(x, w)
        early = tf.reduce_sum(h)
        middle = tf.reduce_sum(tf.cos(tf.exp(x)))
        return early + middle + tf.reduce_max(h)

    x = tf.constant(rng.standard_normal((1024, 1024)).astype(np.float32))
    graph = capture_job_graph("regrown_w", step, (x,))
    names = [o.name for o in graph.ops]
    by_type = {o.op_type: o.name for o in graph.ops}
    matmul, late = by_type["MatMul"], by_type["Max"]
    early = next(c for c in graph.tensors[f"{matmul}:0"].consumers if c != late)
    middle = names[names.index(late) - 2]
    key, size = "var:" + w.name.split(":")[0], 1 << 22
    assert matmul in graph.tensors[key].consumers
    recompute_h = RecomputeEvent("regrown_w", f"{matmul}:0", release_after_op=early, before_op=late,
                                 trigger_op=names[names.index(late) - 1], ops=[matmul], size_bytes=size, time_s=0.0,
                                 msps=0.0)
    plan = JobPlan("regrown_w", recomputes=[recompute_h],
                   swap_outs=[SwapEvent("regrown_w", key, "swap_out", matmul, 0.0, 0.0, 0.0, size,
                                        release_after_op=matmul)],
                   swap_ins=[SwapEvent("regrown_w", key, "swap_in", middle, 0.0, 0.0, 0.0, size,
                                       serves_op=recompute_step_name(matmul, f"{matmul}:0"))])
    planned = apply_plan(step, (x,), plan, graph)
    assert not planned.report.skipped, planned.report.skipped
    assert planned.report.variable_swap_ins == 1 and planned.report.recomputes == 1, planned.report
    gate = next(n for n in planned.graph_def.node if n.op == "TensileRecomputeGate")
    data = [i for i in gate.input if not i.startswith("^")]
    again = {n.name for n in planned.graph_def.node if n.op == "ReadVariableOp" and "var_read_again" in n.name}
    assert any(i.split(":")[0] in again for i in data), (gate.input, again)

    pool = tf_plugin.device_pool()   # its event trace is on by default (capture reads it): left on
    pool.set_trace_enabled(True)
    pool.clear_trace()
    planned(x)
    swap.drain_swap_channel()
    # the buffer w holds after a step: the one its swap-in allocated
    held = next(ev["offset"] for ev in pool.trace() if ev["kind"] == "alloc" and "var_swap_in" in ev["op"])
    pool.clear_trace()
    out = planned(x).numpy()
    swap.drain_swap_channel()
    trace = pool.trace()
    # that buffer is freed (by the swap-out, once the old read is done) before
    # the swap-in allocates w again; the step's own ops may reuse its bytes
    # after the free, depending on when the link thread gets to it
    swap_in = next(k for k, ev in enumerate(trace) if ev["kind"] == "alloc" and "var_swap_in" in ev["op"])
    assert any(ev["kind"] == "free" and ev["offset"] == held and ev["bytes"] >= size for ev in trace[:swap_in]), trace
    assert out.tobytes() == step(x).numpy().tobytes()
