"""Note [Graph-dependent Grappler rewrites]: the Grappler settings under which a
rewritten step computes what the original computes, in every job thread."""
from tests.conftest import last_json_line, run_python

CHECK = """
import json, threading
import tensile_tf
tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context
from tensile_tf.tf.determinism import disable_graph_dependent_rewrites, graph_dependent_rewrites_enabled


def rewrite_options():
    c = config_pb2.ConfigProto()
    c.ParseFromString(context.context().function_call_options.config_proto_serialized)
    o = c.graph_options.rewrite_options
    return {"memory": rewriter_config_pb2.RewriterConfig.MemOptType.Name(o.memory_optimization),
            "arithmetic": rewriter_config_pb2.RewriterConfig.Toggle.Name(o.arithmetic_optimization),
            "constant_folding": rewriter_config_pb2.RewriterConfig.Toggle.Name(o.constant_folding)}


before = (graph_dependent_rewrites_enabled(), rewrite_options())
disable_graph_dependent_rewrites()
seen = {}
t = threading.Thread(target=lambda: seen.update(rewrite_options()))  # a job thread, started afterwards
t.start(); t.join()
print(json.dumps({"before": before, "after": graph_dependent_rewrites_enabled(), "this_thread": rewrite_options(),
                  "new_thread": seen}))
"""


def test_rewrites_that_depend_on_graph_or_schedule_are_off_in_every_thread():
    r = last_json_line(run_python(CHECK))
    enabled_before, options_before = r["before"]
    assert enabled_before and options_before["memory"] != "NO_MEM_OPT"
    assert r["after"] is False
    off = {"memory": "NO_MEM_OPT", "arithmetic": "OFF", "constant_folding": "OFF"}
    assert r["this_thread"] == off and r["new_thread"] == off
