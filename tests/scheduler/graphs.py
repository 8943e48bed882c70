"""Hand-built job graphs whose plans are worked out by hand in the tests."""
from tensile_tf.scheduler import GraphBuilder, JobGraph


def fig1_graph(name: str = "job") -> JobGraph:
    """Seed 000 Fig. 1: the peak is in the optimizer phase (u2's scratch), while
    parameter w1, already updated by u1, idles until the next iteration's f1.

    Unit latencies; per-step footprint (bytes), persistent x+w1+w2 = 210:
      0 load 220 | 1 f1 230 | 2 f2 231 | 3 b2 331 | 4 b1 431 | 5 u1 411 | 6 metric 312 | 7 u2 510
    """
    b = GraphBuilder(name)
    b.tensor("x", 10, "input").tensor("w1", 100, "parameter").tensor("w2", 100, "parameter")
    b.op("load", inputs=["x"], outputs={"xx": 10})
    b.op("f1", inputs=["xx", "w1"], outputs={"a": 10})
    b.op("f2", inputs=["a", "w2"], outputs={"loss": 1})
    b.op("b2", inputs=["loss", "w2"], outputs={"g2": 100, "ga": 10})
    b.op("b1", inputs=["ga", "xx"], outputs={"g1": 100})
    b.op("u1", inputs=["g1"], updates=["w1"])
    b.op("metric", inputs=["loss"], outputs={"m": 1})
    b.op("u2", inputs=["g2"], updates=["w2"], temp_bytes=200)
    return b.build()


FIG1_STEP_BYTES = [220, 230, 231, 331, 431, 411, 312, 510]


def recompute_graph(name: str = "rc") -> JobGraph:
    """A forward activation `a` kept for the backward op b1 while `big` makes the peak.

      0 f1 110 | 1 f2 120 | 2 f3 420 (x, a, h, big) | 3 f4 420 | 4 b1 130
    Dropping `a` after f2 and re-running f1 before b1 gives 320 at f3 and f4.
    """
    b = GraphBuilder(name)
    b.tensor("x", 10, "input")
    b.op("f1", inputs=["x"], outputs={"a": 100})
    b.op("f2", inputs=["a"], outputs={"h": 10})
    b.op("f3", inputs=["h"], outputs={"big": 300})
    b.op("f4", inputs=["big"], outputs={"s": 10})
    b.op("b1", inputs=["s", "a"], outputs={"g": 10})
    return b.build()
