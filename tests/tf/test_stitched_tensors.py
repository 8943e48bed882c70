"""Note [Stitched allocations] through TensorFlow: in a fragmented device pool, a
kernel's output larger than any free chunk is served from stitched pieces, the kernel
computes into it what it computes anywhere, and other tensors' bytes are untouched.
Without stitching (TENSILE_POOL_STITCH=0) the same request is an OOM."""
from tests.conftest import last_json_line, run_python

CHILD = """
import json
import numpy as np
import tensile_tf
tensile_tf.install()
import tensorflow as tf

MiB = 1 << 20
rng = np.random.default_rng(0)
a, b = rng.standard_normal((1536, 8), dtype=np.float32), rng.standard_normal((8, 1024), dtype=np.float32)
# what this machine's kernel computes in one piece, before the pool is fragmented (numpy's BLAS
# may sum in another order: the comparison is the kernel's output against itself)
expected = tf.matmul(tf.constant(a), tf.constant(b)).numpy()
held = []
try:   # fill the 64 MiB pool with 2 MiB tensors, each a different value
    while True:
        held.append(tf.fill([MiB // 2], float(len(held))))
except tf.errors.ResourceExhaustedError:
    pass
for i in range(0, len(held), 2):   # every other one freed: 2 MiB holes between live tensors
    held[i] = None
s = tensile_tf.pool_stats()
out = {"free": s["capacity"] - s["current"], "largest": s["largest_free_chunk"]}
try:
    y = tf.matmul(tf.constant(a), tf.constant(b))       # 6 MiB
    z = y * 2.0 + 1.0
    out["matmul_exact"] = bool(np.array_equal(y.numpy(), expected))
    out["follow_up_exact"] = bool(np.array_equal(z.numpy(), y.numpy() * 2.0 + 1.0))
    stitched = [e for e in tensile_tf.pool_trace() if e["kind"] == "alloc" and e["offset"] >= s["capacity"]]
    out["stitched_ops"] = sorted({e["op"] for e in stitched})
    out["live_stitched"] = tensile_tf.pool_stats()["num_live_stitched"]
    del y, z
    out["live_stitched_after"] = tensile_tf.pool_stats()["num_live_stitched"]
except tf.errors.ResourceExhaustedError as e:
    out["oom"] = str(e).splitlines()[0][:200]
out["held_intact"] = all(t is None or bool(np.all(t.numpy() == float(i))) for i, t in enumerate(held))
out["stats"] = {k: tensile_tf.pool_stats()[k] for k in ("num_stitched", "stitching")}
print(json.dumps(out))
"""


def test_a_kernel_output_larger_than_any_hole_is_stitched_and_computed_exactly():
    r = last_json_line(run_python(CHILD, env={"TENSILE_POOL_BYTES": str(64 << 20)}))
    # The precondition: the bytes are free but no chunk holds 6 MiB.
    assert r["largest"] < 6 << 20 <= r["free"], r
    assert "oom" not in r, r
    assert r["matmul_exact"] and r["follow_up_exact"] and r["held_intact"], r
    assert r["stats"]["stitching"] and r["stats"]["num_stitched"] >= 1, r
    assert any(op.endswith("MatMul") for op in r["stitched_ops"]), r
    assert r["live_stitched"] >= 1 and r["live_stitched_after"] == 0, r


def test_without_stitching_the_same_request_is_an_oom():
    r = last_json_line(run_python(CHILD, env={"TENSILE_POOL_BYTES": str(64 << 20), "TENSILE_POOL_STITCH": "0"}))
    assert r["largest"] < 6 << 20 <= r["free"], r
    assert "out of memory" in r["oom"] or "OOM" in r["oom"], r
    assert r["held_intact"] and r["stats"] == {"num_stitched": 0, "stitching": False}, r


def test_a_bad_stitch_setting_is_refused_with_what_to_use():
    proc = run_python("import tensile_tf\ntensile_tf.install()\n", env={"TENSILE_POOL_STITCH": "yes"})
    assert proc.returncode != 0
    assert "TENSILE_POOL_STITCH='yes': use 1" in proc.stderr, proc.stderr[-2000:]
