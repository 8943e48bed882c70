"""`tensile calibrate` end to end: real models measured on this machine, a
predictor fitted and cached, and cold starts that use it; a broken or stale
cache is reported and never stops a cold start (Note [Predictor cache] in
tensile_tf/scheduler/latency_predictor.py)."""

from tests.conftest import last_json_line, run_python
from tests.e2e.test_cli import tensile

COLD_CAPTURE = """
import json, warnings
import tensile_tf
tensile_tf.install("512MiB")
import keras, tensorflow as tf
from tensile_tf.jobs import zoo
from tensile_tf.pipeline import JobToPlan, capture_cold
from tensile_tf.jobs.job import supervised_train_step
model = zoo.mlp((784,), 10)
opt = keras.optimizers.Adam(1e-3)
step = tf.function(supervised_train_step(model, opt, keras.losses.SparseCategoricalCrossentropy()))
x, y = tf.random.normal([64, 784]), tf.zeros([64], tf.int32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    c = capture_cold(JobToPlan("cold", step, (x, y), optimizer=opt))
lat = c.planner_job.latencies
print(json.dumps({"source": lat.source, "warnings": [str(w.message) for w in caught],
                  "positive": all(lat.latency_s(o) > 0 for o in c.graph.ops)}))
"""


def test_calibrate_caches_a_predictor_that_cold_starts_use(tmp_path):
    cache = tmp_path / "predictor.joblib"
    proc = tensile("calibrate", "--models", "mlp-b32,small_cnn-b16", "--cache", str(cache), "--repeats", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("mlp-b32", "small_cnn-b16"))]
    assert [r[0] for r in rows] == ["mlp-b32", "small_cnn-b16"], proc.stdout
    for r in rows:   # each held-out model: learned and bytes-touched errors, both measured
        assert r[2].endswith("%") and r[3].endswith("%"), proc.stdout
    assert cache.exists() and f"wrote {cache}" in proc.stdout

    learned = last_json_line(run_python(COLD_CAPTURE, env={"TENSILE_LATENCY_PREDICTOR": str(cache)}))
    assert learned["source"].startswith("cold-start (learned on 2 models"), learned
    assert learned["positive"] and learned["warnings"] == [], learned

    cache.write_bytes(b"truncated")
    broken = last_json_line(run_python(COLD_CAPTURE, env={"TENSILE_LATENCY_PREDICTOR": str(cache)}))
    assert broken["source"] == "cold-start (bytes touched)", broken
    assert any("unreadable" in w and "tensile calibrate" in w for w in broken["warnings"]), broken

    # what the warning says to do rebuilds it
    proc = tensile("calibrate", "--models", "mlp-b32,small_cnn-b16", "--cache", str(cache), "--repeats", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = last_json_line(run_python(COLD_CAPTURE, env={"TENSILE_LATENCY_PREDICTOR": str(cache)}))
    assert rebuilt["source"].startswith("cold-start (learned on 2 models") and rebuilt["warnings"] == [], rebuilt


def test_calibrate_refuses_unknown_or_too_few_models(tmp_path):
    proc = tensile("calibrate", "--models", "mlp-b32", "--cache", str(tmp_path / "p.joblib"))
    assert proc.returncode == 2 and "at least two" in proc.stderr, proc.stderr
    proc = tensile("calibrate", "--models", "mlp-b32,nope", "--cache", str(tmp_path / "p.joblib"))
    assert proc.returncode == 2 and "unknown ['nope']" in proc.stderr, proc.stderr
    assert not (tmp_path / "p.joblib").exists()
