"""`tensile calibrate` end to end: real models measured on this machine, a
predictor fitted and cached, and cold starts that use it; a broken or stale
cache is reported and never stops a cold start (Note [Predictor cache] in
tensile_tf/scheduler/latency_predictor.py)."""

import os

def _cold_capture(monkeypatch, cache) -> dict:
    """A cold start's capture of a small MLP, in this process, with the
    predictor cached at ``cache``: its latency source and the warnings."""
    import warnings

    import keras
    import tensorflow as tf

    from tensile_tf.jobs import zoo
    from tensile_tf.jobs.job import supervised_train_step
    from tensile_tf.pipeline import JobToPlan, capture_cold
    from tensile_tf.tf import calibration
    from tensile_tf.tf.pool import JobStream

    monkeypatch.setenv("TENSILE_LATENCY_PREDICTOR", str(cache))
    monkeypatch.setattr(calibration, "_warned", set())   # one warning per reason and process
    model = zoo.mlp((784,), 10)
    opt = keras.optimizers.Adam(1e-3)
    step = tf.function(supervised_train_step(model, opt, keras.losses.SparseCategoricalCrossentropy()))
    x, y = tf.random.stateless_normal([64, 784], seed=[1, 2]), tf.zeros([64], tf.int32)
    stream = JobStream(f"cold-{cache.stat().st_size}")
    with warnings.catch_warnings(record=True) as caught, stream.eager_scope():   # as JobPlanning.capture_cold
        warnings.simplefilter("always")
        c = capture_cold(JobToPlan("cold", step, (x, y), optimizer=opt))
    lat = c.planner_job.latencies
    stats = stream.stats()   # what the capture allocated in the pool, all through the job's stream
    stream.release()
    return {"source": lat.source, "warnings": [str(w.message) for w in caught],
            "positive": all(lat.latency_s(o) > 0 for o in c.graph.ops),
            "allocated": stats.get("allocated", 0), "current": stats.get("current", 0)}


def test_calibrate_caches_a_predictor_that_cold_starts_use(tmp_path, monkeypatch):
    # the command in this process (its pool is this process's: --pool says so), real models measured
    from tests.e2e.test_bad_inputs import cli_in_process

    cache = tmp_path / "predictor.joblib"
    cache.write_bytes(b"truncated")   # a cache a crash left behind
    broken = _cold_capture(monkeypatch, cache)
    assert broken["source"] == "cold-start (bytes touched)", broken
    assert any("unreadable" in w and "tensile calibrate" in w for w in broken["warnings"]), broken
    assert broken["positive"], broken

    # what the warning says to do rebuilds it
    code, out, err = cli_in_process("calibrate", "--models", "mlp-b32,small_cnn-b16", "--cache", str(cache),
                                    "--repeats", "2", "--pool", os.environ["TENSILE_POOL_BYTES"])
    assert code == 0, err[-3000:]
    rows = [line.split() for line in out.splitlines() if line.startswith(("mlp-b32", "small_cnn-b16"))]
    assert [r[0] for r in rows] == ["mlp-b32", "small_cnn-b16"], out
    for r in rows:   # each held-out model: learned, bytes-touched and MLP-alone errors, all measured
        assert r[2].endswith("%") and r[3].endswith("%") and r[4].endswith("%"), out
    assert f"wrote {cache}" in out

    assert "kernels timed alone are predicted at" in out, out
    learned = _cold_capture(monkeypatch, cache)
    # the MLP's matrix products ran alone on their shapes (Note [Kernels timed alone])
    assert learned["source"].startswith("cold-start (learned on 2 models; "), learned
    assert learned["source"].endswith(" kernels timed alone)"), learned
    assert learned["positive"] and learned["warnings"] == [], learned
    # its kernels' runs allocated through the job's stream (megabytes) and kept none of it: both
    # captures hold only what their trace made (the optimizer's slots, about 0.9 MiB)
    ran = learned["allocated"] - broken["allocated"]
    assert ran > 1 << 20 and abs(learned["current"] - broken["current"]) < 1 << 16, (learned, broken)


def test_calibrate_refuses_unknown_or_too_few_models(tmp_path):
    from tests.e2e.test_bad_inputs import cli_in_process

    pool = os.environ["TENSILE_POOL_BYTES"]   # this process's pool: the command runs in it
    code, _, err = cli_in_process("calibrate", "--models", "mlp-b32", "--cache", str(tmp_path / "p.joblib"),
                                  "--pool", pool)
    assert code == 2 and "at least two" in err, err
    code, _, err = cli_in_process("calibrate", "--models", "mlp-b32,nope", "--cache", str(tmp_path / "p.joblib"),
                                  "--pool", pool)
    assert code == 2 and "unknown ['nope']" in err, err
    assert not (tmp_path / "p.joblib").exists()
