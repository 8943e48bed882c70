"""Observed concurrency (tensile_tf/scheduler/concurrency.py) on a graph worked out by hand."""
from tensile_tf.scheduler import GraphBuilder, JobFootprint, TensorAccessSequence, UniformLatency
from tensile_tf.scheduler.concurrency import observed_concurrency_bytes, sequential_activation_footprint


def backprop_like_graph():
    """The node-group CNN's case in miniature: `filter` (100 B scratch) and
    `input_grad` both read x; `pool_grad` consumes input_grad's output.
    Order: x_op, filter, input_grad, pool_grad, update."""
    b = GraphBuilder("job")
    b.tensor("w", 8, "parameter")
    b.op("x_op", outputs={"x": 4})
    b.op("filter", inputs=["x"], outputs={"gw": 8}, temp_bytes=100)
    b.op("input_grad", inputs=["x"], outputs={"gi": 10})
    b.op("pool_grad", inputs=["gi"], outputs={"gp": 40})
    b.op("update", inputs=["gw", "gp"], updates=["w"])
    return b.build()


def test_sequential_footprint_leaves_out_persistent_tensors():
    g = backprop_like_graph()
    # x_op: x; filter: x, gw, scratch; input_grad: x, gw, gi; pool_grad: gw, gi, gp; update: gw, gp
    assert sequential_activation_footprint(g) == [4, 112, 22, 58, 48]


def test_a_step_where_the_filter_outlasted_its_sibling_raises_the_ops_beside_it():
    g = backprop_like_graph()
    calm = {"x_op": 4, "filter": 112, "input_grad": 22, "pool_grad": 58}          # as the sequential model
    overlapped = {"x_op": 4, "filter": 112, "input_grad": 122, "pool_grad": 158}  # filter's scratch still there
    delta = observed_concurrency_bytes(g, [calm, overlapped, calm])
    # the worst step decides; `update` allocates nothing and carries pool_grad's difference
    assert delta == {"input_grad": 100, "pool_grad": 100, "update": 100}
    for o in g.ops:
        o.concurrent_bytes = delta.get(o.name, 0)
    tas = TensorAccessSequence(g, UniformLatency())
    assert JobFootprint(tas).vanilla_peak == 8 + 158
    # the sequential footprint is read without the graph's own concurrent_bytes
    assert sequential_activation_footprint(g) == [4, 112, 22, 58, 48]


def test_ops_that_ran_sooner_on_another_thread_lower_the_footprint():
    g = backprop_like_graph()
    delta = observed_concurrency_bytes(g, [{"x_op": 4, "filter": 112, "input_grad": 22, "pool_grad": 50}])
    assert delta == {"pool_grad": -8, "update": -8}
    # an op that allocates nothing holds no more than the last observation: 40 - 48
    delta = observed_concurrency_bytes(g, [{"x_op": 4, "filter": 112, "input_grad": 22, "pool_grad": 40}])
    assert delta["update"] == -18
    assert observed_concurrency_bytes(g, []) == {}
