"""Plan execution benchmark (issue 5): measured MSR, time ratio (EOR) and CBR
of TENSILE plans executed in TensorFlow, per model, for 1 and 2 concurrent
jobs, on an unlimited and on a capped swap link.

    python benchmarks/plan_execution_bench.py [--models vgg16,resnet50,...] [--jobs 1,2]
        [--budget-frac 0.5] [--steps 4] [--cap-mib-s 110] [--json OUT]

Each configuration runs in a fresh process (benchmarks/plan_execution_reference.py,
its own device pool, deterministic ops): once vanilla, then planned for a
budget of ``budget-frac`` x the planner's predicted vanilla pool peak, on each
link. Metrics (DESIGN.md, TENSILE's definitions):

- VMP / EMP: the pool's measured peak per step, the largest over the steps
  after the first (the first planned step pays for the variables' first
  trip to the host);
- MSR = (VMP - EMP) / VMP;
- time ratio = EOR = median planned step / median vanilla step;
- CBR = MSR / EOR;
- bit-for-bit: every loss and every model and optimizer variable equal.

The capped link: a GPU moves PCIe 3.0 x16 bytes (~12 GB/s) in the time it
computes ~15.7 TFLOP (V100 fp32). This machine's CPU runs the benchmark's
own matmul at F FLOP/s, so the link that keeps the transfer-to-compute ratio
is 12e9 * F / 15.7e12 bytes/s; the script measures F and prints the cap.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "benchmarks", "plan_execution_reference.py")
sys.path.insert(0, ROOT)

from tensile_tf.config.device_links import DEVICE_LINKS, device_link_bandwidth  # noqa: E402  (pure: no TF)

# name -> (model for the reference script, input shape "HxWxC" or "SxD")
MODELS = {
    "vgg16": ("VGG16", "64x64x3"),
    "resnet50": ("ResNet50", "64x64x3"),
    "inceptionv3": ("InceptionV3", "75x75x3"),
    "densenet121": ("DenseNet121", "64x64x3"),
    "transformer": ("transformer_encoder", "64x128"),
    # models the planner was never tuned on (issue 43: plan-order cost of a step with few swaps)
    "mobilenetv2": ("MobileNetV2", "64x64x3"),
    "efficientnetb0": ("EfficientNetB0", "64x64x3"),
}
DEFAULT_MODELS = "vgg16,resnet50,inceptionv3,densenet121,transformer"
GPU_LINK_BYTES_PER_S = 12e9      # PCIe 3.0 x16, practical
GPU_FLOPS = 15.7e12              # V100 fp32


def cpu_flops() -> float:
    """FLOP/s of a 1024^3 float32 matmul in this process (best of 5)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best


def capped_link(cap_mib_s: float | None) -> float:
    """The capped link in bytes/s: as given, or derived from this CPU's matmul rate (printed)."""
    if cap_mib_s:
        print(f"capped link {cap_mib_s:.1f} MiB/s (given)", flush=True)
        return cap_mib_s * 2**20
    flops = cpu_flops()
    cap = GPU_LINK_BYTES_PER_S * flops / GPU_FLOPS
    print(f"CPU matmul {flops / 1e9:.1f} GFLOP/s -> capped link {cap / 2**20:.1f} MiB/s "
          f"(PCIe 3.0 x16 12 GB/s : V100 15.7 TFLOP/s)", flush=True)
    return cap


def link_bandwidth(link: str, cap: float, vanilla: dict) -> tuple[float, str]:
    """The link's bytes per second for a configuration, and what it stands for: ``unlimited``
    (0: a memcpy), ``capped`` (``cap``), or a device link (tensile_tf/config/device_links.py)
    at its share of the measured vanilla peak per measured vanilla step."""
    if link == "unlimited":
        return 0.0, "unlimited: a memcpy, no device"
    if link == "capped":
        return cap, f"capped: a V100's PCIe 3 x16 scaled by this CPU's FLOP rate ({cap / 2**20:.1f} MiB/s)"
    if link not in DEVICE_LINKS:
        raise SystemExit(f"--links: {link!r} is not unlimited, capped or a device link ({', '.join(DEVICE_LINKS)})")
    vmp, step = max(vanilla["peaks"][1:]), statistics.median(vanilla["step_s"][1:])
    bw = float(device_link_bandwidth(DEVICE_LINKS[link], [vmp], [step]))
    return bw, (f"{DEVICE_LINKS[link].describe(bw)} (vanilla peak {vmp / 2**20:.1f} MiB per "
                f"{step * 1e3:.0f} ms step)")


def run(model: str, shape: str, jobs: int, steps: int, *, planned: bool, budget_frac: float,
        bandwidth: float, strategy: str = "tensile", batch: int = 16, grappler_memory: str = "",
        recompute_segments: int = -1, budget_bytes: int = 0, no_recompute: bool = False,
        step_order: str = "plan", paired_vanilla: bool = False, chained: bool = False, link_lanes: int = 1,
        combined_bandwidth: float = 0.0) -> dict:
    cmd = [sys.executable, REFERENCE, "--model", model, "--input-shape", shape, "--batch", str(batch),
           "--steps", str(steps), "--jobs", str(jobs), "--recompute-segments", str(recompute_segments)]
    if grappler_memory:
        cmd += ["--grappler-memory", grappler_memory]
    if planned:
        cmd += ["--planned", "--budget-frac", str(budget_frac), "--bandwidth", str(bandwidth),
                "--strategy", strategy, "--budget-bytes", str(budget_bytes), "--step-order", step_order,
                "--link-lanes", str(link_lanes), "--combined-bandwidth", str(combined_bandwidth)]
        if no_recompute:
            cmd.append("--no-recompute")
        if paired_vanilla:
            cmd.append("--paired-vanilla")
        if chained:
            cmd.append("--chained")
    env = dict(os.environ, PYTHONPATH=ROOT, TENSILE_POOL_BYTES="8GiB", TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-800:]}
    return json.loads(lines[-1])


def vanilla_runs(models: str, jobs: str, steps: int, batch: int = 16):
    """(name, model, input shape, jobs, its vanilla run) per configuration of
    the comma-separated ``models`` and ``jobs``; a failed vanilla run is
    printed and skipped."""
    for name in models.split(","):
        model, shape = MODELS[name]
        for k in (int(x) for x in jobs.split(",")):
            vanilla = run(model, shape, k, steps, planned=False, budget_frac=0, bandwidth=0, batch=batch)
            if "error" in vanilla:
                print(f"{name} x{k}: vanilla run failed: {vanilla['error']}", flush=True)
                continue
            yield name, model, shape, k, vanilla


def compare(vanilla: dict, planned: dict) -> dict:
    vmp, emp = max(vanilla["peaks"][1:]), max(planned["peaks"][1:])
    vtc, etc = statistics.median(vanilla["step_s"][1:]), statistics.median(planned["step_s"][1:])
    msr, eor = (vmp - emp) / vmp, etc / vtc
    same = all(vanilla["jobs"][j]["losses"] == planned["jobs"][j]["losses"]
               and vanilla["jobs"][j]["weights_sha256"] == planned["jobs"][j]["weights_sha256"]
               for j in vanilla["jobs"])
    plan = planned.get("plan")   # None: a method without a plan of ours (Grappler's memory optimizer)
    ch = planned["swap"]["channel"]
    reports = [j["report"] for j in planned["jobs"].values() if "report" in j]
    losses_v = [x for j in vanilla["jobs"].values() for x in j["loss_values"]]
    losses_p = [x for j in planned["jobs"].values() for x in j["loss_values"]]
    return {
        "vmp_MiB": vmp / 2**20, "emp_MiB": emp / 2**20, "msr": msr, "eor": eor, "cbr": msr / eor,
        "vanilla_step_ms": vtc * 1e3, "planned_step_ms": etc * 1e3,
        "predicted_msr": 1 - plan["pool_planned_peak"] / plan["pool_vanilla_peak"] if plan else None,
        "deadline_bound_msr": plan["link_bound"]["deadline_bound_msr"] if plan and "link_bound" in plan else None,
        "budget_met": plan["budget_met"] if plan else None, "planning_s": planned.get("planning_s"),
        "swapped_MiB_per_step": sum(r["swapped_bytes_per_step"] for r in reports) / 2**20,
        "recomputed_ops": sum(r["recomputed_ops"] for r in reports),
        "late_swap_ins": ch["late_swap_ins"], "bit_for_bit": same,
        "max_loss_difference": max((abs(a - b) for a, b in zip(losses_v, losses_p)), default=0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)}")
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--step-orders", default="plan",
                    help="plan (chained in plan order, free inside unchained runs), free, auto, and/or "
                         "chained (every op chained: no unchained runs); one planned run each")
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", default=None, help="write all rows as JSON here")
    ap.add_argument("--links", default="unlimited,capped",
                    help="unlimited, capped, and/or a device link: h200-pcie5, h200-pcie5-bf16 (its share of the "
                         "measured vanilla peak per measured vanilla step; tensile_tf/config/device_links.py)")
    ap.add_argument("--cap-mib-s", type=float, default=None,
                    help="the capped link in MiB/s (default: derived from this CPU's measured matmul rate; "
                         "pin it when other work shares the CPU, which lowers the measured rate)")
    a = ap.parse_args()
    cap = capped_link(a.cap_mib_s)
    rows = []
    for name, model, shape, k, vanilla in vanilla_runs(a.models, a.jobs, a.steps):
        for link, order in ((lk, o) for lk in a.links.split(",") for o in a.step_orders.split(",")):
            bw, stands_for = link_bandwidth(link, cap, vanilla)
            print(f"link {stands_for}, step order {order}", flush=True)
            planned = run(model, shape, k, a.steps, planned=True, budget_frac=a.budget_frac, bandwidth=bw,
                          step_order="plan" if order == "chained" else order, chained=order == "chained")
            if "error" in planned:
                print(f"{name} x{k} {link} {order}: planned run failed: {planned['error']}", flush=True)
                continue
            row = {"model": name, "input": shape, "jobs": k, "link": link, "link_stands_for": stands_for,
                   "step_order": order, "link_MiB_s": None if bw == 0 else bw / 2**20, **compare(vanilla, planned)}
            rows.append(row)
            print(f"{name:12s} x{k} {link:9s} {order:7s} VMP {row['vmp_MiB']:7.1f} EMP {row['emp_MiB']:7.1f} MiB  "
                  f"MSR {row['msr']:6.1%} (pred {row['predicted_msr']:6.1%})  EOR {row['eor']:5.2f}  "
                  f"CBR {row['cbr']:5.2f}  swap {row['swapped_MiB_per_step']:7.1f} MiB/step  "
                  f"recomp {row['recomputed_ops']:3d}  late {row['late_swap_ins']:3d}  "
                  f"step {row['vanilla_step_ms']:.0f}->{row['planned_step_ms']:.0f} ms  "
                  f"bit-for-bit {'yes' if row['bit_for_bit'] else 'NO'}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
