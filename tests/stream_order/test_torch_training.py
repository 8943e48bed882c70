"""benchmarks/gpu/torch_training.py without PyTorch and without a GPU (issue 44): its arguments,
the plan, the child protocol and every comparison, with the two children replaced by records
written here (the children are the only part that needs PyTorch and a GPU). Where PyTorch is
installed, the child itself also runs on the CPU with tiny shapes (caching allocator only:
PyTorch takes pluggable allocators for CUDA alone)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "torch_training.py"
spec = importlib.util.spec_from_file_location("torch_training", SCRIPT)
tt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tt)

MiB = 1 << 20
TOGETHER = "resnet50+transformer"


def losses(seed: int, n: int = 5) -> list[str]:
    return [float(seed + i / 8).hex() for i in range(n)]


def record(allocator: str, *, peaks=(300 * MiB, 40 * MiB, 320 * MiB), step_ms=(10.0, 12.0, 11.0),
           stats=None) -> dict:
    """A child's record as child_main prints it."""
    r = {"kind": "torch_child", "allocator": allocator, "device": "NVIDIA H200", "phases": {}}
    for key, peak in zip(("resnet50", "transformer", TOGETHER), peaks):
        jobs = key.split("+")
        phase = {"step_ms": list(step_ms), "losses": {j: losses(1 if j == "resnet50" else 2) for j in jobs},
                 "peak_allocated": peak}
        if allocator == "caching":
            phase["peak_reserved"] = peak + 20 * MiB
        else:
            phase["pool"] = {"backend": "cuda (vmm arena, stitch 2048 KiB, event per free)", "capacity": 8 << 30,
                             "invariant_error": "", **(stats or {}).get(key, dict.fromkeys(
                                 ("syncs", "allocator_syncs", "stream_waits", "stitched", "num_ooms"), 0))}
        r["phases"][key] = phase
    return r


def run_main(argv, records, tmp_path, capsys):
    lib = tmp_path / "libtensile_pool_c.so"
    lib.write_bytes(b"")
    calls = []

    def runner(cmd, timeout, log):
        calls.append(cmd)
        return records[cmd[cmd.index("--child") + 1]]

    rc = tt.main(["--lib", str(lib), *argv], runner=runner)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return rc, lines, calls


def test_figures_when_the_losses_match(tmp_path, capsys):
    stats = {"transformer": {"syncs": 2, "allocator_syncs": 1, "stream_waits": 3, "stitched": 0, "num_ooms": 0},
             TOGETHER: {"syncs": 7, "allocator_syncs": 4, "stream_waits": 9, "stitched": 1, "num_ooms": 0}}
    pool = record("pool", peaks=(300 * MiB, 40 * MiB, 320 * MiB), step_ms=(10.0, 12.0, 30.0), stats=stats)
    caching = record("caching", peaks=(310 * MiB, 50 * MiB, 350 * MiB), step_ms=(10.0, 11.0, 12.0))
    rc, lines, calls = run_main([], {"pool": pool, "caching": caching}, tmp_path, capsys)
    assert rc == 0 and [c[c.index("--child") + 1] for c in calls] == ["pool", "caching"]
    by = {(f["figure"], f.get("allocator"), f.get("measure")): f for f in lines}
    assert all(f["kind"] == "torch_training" and f["device"] == "NVIDIA H200" for f in lines)
    loss = by[("losses", None, None)]
    assert loss["equal_bitwise"] and loss["differences"] == [] and loss["steps_per_phase"] == 5
    assert loss["together_equals_alone"] == {"pool": True, "caching": True}
    t = by[("step_time", None, None)]
    assert (t["pool_ms"], t["caching_ms"], t["ratio"]) == (12.0, 11.0, 12.0 / 11.0)
    f = by[("footprint", "pool", "peak_allocated")]
    assert f["alone"] == [300 * MiB, 40 * MiB] and f["together_over_sum"] == 320 / 340
    assert by[("footprint", "caching", "peak_reserved")]["together_over_sum"] == 370 / 400
    s = by[("pool_stats", None, None)]
    assert (s["syncs"], s["stream_waits"], s["stitched"]) == (7, 9, 1)
    assert s["together"] == {"syncs": 5, "allocator_syncs": 3, "stream_waits": 6, "stitched": 1, "num_ooms": 0}


def test_a_loss_that_differs_fails_and_says_where(tmp_path, capsys):
    pool, caching = record("pool"), record("caching")
    pool["phases"][TOGETHER]["losses"]["transformer"][3] = float(9.5).hex()
    rc, lines, _ = run_main([], {"pool": pool, "caching": caching}, tmp_path, capsys)
    assert rc == 1
    loss = lines[0]
    assert not loss["equal_bitwise"]
    assert loss["differences"] == [{"phase": TOGETHER, "job": "transformer", "step": 3}]
    assert loss["together_equals_alone"] == {"pool": False, "caching": True}


def test_a_failed_child_is_a_line_and_exit_1(tmp_path, capsys):
    rc, lines, _ = run_main([], {"pool": {"failed": "exit 1: CUDA error"}, "caching": record("caching")},
                            tmp_path, capsys)
    assert rc == 1 and lines == [{"kind": "torch_training", "figure": "child_failed", "allocator": "pool",
                                  "why": "exit 1: CUDA error"}]


def test_first_difference():
    assert tt.first_difference(["a", "b"], ["a", "b"]) is None
    assert tt.first_difference(["a", "b"], ["a", "c"]) == 1
    assert tt.first_difference(["a"], ["a", "b"]) == 1


def test_arguments_and_the_child_command_round_trip():
    args = tt.parse_args(["--lib", "/x/lib.so", "--steps", "4", "--image", "96", "--no-stitch", "--pool-gib", "2"])
    cmd = tt.child_command(args, "pool")
    assert cmd[:2] == [sys.executable, str(SCRIPT)]
    child = tt.parse_args(cmd[2:])
    assert (child.child, child.lib, child.steps, child.image, child.no_stitch, child.pool_gib) == \
        ("pool", "/x/lib.so", 4, 96, True, 2.0)
    with pytest.raises(SystemExit):
        tt.parse_args(["--child", "pool", "--device", "cpu"])
    with pytest.raises(SystemExit):
        tt.parse_args(["--steps", "0"])


def test_dry_run_plans_without_pytorch(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--lib", str(tmp_path / "none.so")],
                         capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    assert plan["figure"] == "plan" and plan["lib_built"] is False
    assert plan["phases"] == ["resnet50", "transformer", TOGETHER]
    assert [c.split("--child ")[1].split()[0] for c in plan["children"]] == ["pool", "caching"]


def test_without_the_library_it_says_so(tmp_path, capsys):
    assert tt.main(["--lib", str(tmp_path / "none.so")]) == 1
    assert "not built" in json.loads(capsys.readouterr().out)["why"]


def test_run_child_reads_the_record_and_reports_failures(tmp_path):
    rec = {"kind": "torch_child", "allocator": "caching", "phases": {}}
    ok = [sys.executable, "-c", f"import json; print('noise'); print(json.dumps({rec!r}))"]
    assert tt.run_child(ok, 60, tmp_path / "ok.log") == rec
    bad = [sys.executable, "-c", "import sys; sys.exit('no CUDA here')"]
    assert tt.run_child(bad, 60, None) == {"failed": "exit 1: no CUDA here\n"}


def test_the_child_trains_on_the_cpu_where_pytorch_is():
    pytest.importorskip("torch", reason="PyTorch not installed (the GPU machines have it)")
    out = subprocess.run([sys.executable, str(SCRIPT), "--child", "caching", "--device", "cpu", "--image", "32",
                          "--steps", "1", "--warmup", "0", "--resnet-batch", "2", "--transformer-batch", "2"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    r = json.loads(out.splitlines()[-1])
    for job in ("resnet50", "transformer"):
        assert len(r["phases"][job]["losses"][job]) == 1
        assert r["phases"][TOGETHER]["losses"][job] == r["phases"][job]["losses"][job]
