"""The TensorFlow adapters: everything here imports TensorFlow and the plugin
(the pure planning they serve is ``tensile_tf.scheduler``).

In the order a job's step meets them (``tensile_tf.pipeline`` names the phases):

* ``pool``: the device pool as TensorFlow's allocator (install, stats, trace,
  ``JobStream``), the facade over ``tf_plugin``;
* ``capture``: a job's step as a ``JobGraph`` (ops, tensors, sizes) and its
  op latencies, measured on real steps;
* ``step_memory``: what the pool's event trace of real steps adds to the
  graph (scratch buffers, forwarded buffers, views, concurrency, data held
  beside the step) and the executor's order of the ops;
* ``rewrite``: a plan made into the step TensorFlow runs (swap ops,
  recomputation, variable swaps, views, the plan-order chain);
* ``determinism``: the Grappler passes turned off so plans train bit for bit;
* ``calibration``: the cold-start latency predictor fitted on this machine.
"""
