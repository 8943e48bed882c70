"""Issue 19's baseline suite: TENSILE against the planners a user would pick
instead, in the same harness, one process per configuration
(benchmarks/plan_execution_reference.py: its own pool, deterministic ops).

TensorFlow's own memory optimizer (Grappler, run on the unplanned step):
``grappler-heuristics`` (RECOMPUTATION_HEURISTICS) and ``grappler-manual``
(MANUAL, a recompute hint on every forward op), both recomputing for TF2's
``gradient_tape/`` ops; ``recompute-grad``: gradient checkpointing,
``tf.recompute_grad`` over sqrt(n) consecutive segments of a chain model's
layers (the MLP, VGG16; others are refused). Policies on the same access sequences, swap ops and
link, so only the policy differs (tensile_tf/scheduler/baselines.py): ``tensile`` (Algorithm 3),
``vdnn`` (vDNN_all: every layer input out after its forward use, prefetched
one layer ahead), ``capuchin`` (seed 003: FreeTime-ranked swaps with
in-triggers, then recomputation by MSPS). Each is planned for the same
budget (``--budget-frac`` of the predicted unplanned peak; vDNN ignores it).

Per model, jobs and link: the measured peaks (VMP vanilla, EMP planned), MSR,
time ratio (EOR), CBR = MSR / EOR, bit for bit (losses and every variable
equal to the vanilla run), and on the capped link the **link bound**: the
bytes the link can move out and back within the vanilla step
(bandwidth x step / 2 on one lane, bandwidth x step on a lane per
direction), as an MSR ceiling for swap-only plans (bound / VMP); ``of
bound`` is MSR as a share of it. Every method of a row plans and runs
under the same link and lanes (``--link-lanes``; default: two lanes for a
device link, one otherwise, Note [Lanes of a device link] in
tensile_tf/config/device_links.py); each row says its ``link_lanes``.

``tensile-swap`` is TENSILE without recomputation, the plan the link bounds
speak of; ``tensile-free`` is TENSILE planned for a step whose ops run free
on the executor's threads instead of chained in plan order, ``tensile-auto``
free only when that plan meets the budget (Note [Free-order plans] in
tensile_tf/scheduler/peak_analysis.py). The capped-link rows also give the **deadline-aware link bound**
(tensile_tf/scheduler/link_bound.py, from the run's own capture): the lowest
peak any swap-only plan could reach when each tensor's out- and in-transfer
must fit between its last write, the peak and its next access.

``--largest-batch``: the largest batch each method trains in a fixed pool,
the measured vanilla peak at ``--batch`` (the base batch). For each batch of
``--batch-factors`` x base, ascending: a vanilla run (the time ratio's
reference) and each method planned for ``--pool-margin`` x the pool; the
method trains that batch when its measured peak is at most the pool, and
stops at the first batch it does not. Batch multiplier = largest batch /
base, unconstrained and among batches at time ratio <= 1.5. The runs use a
large pool and compare the measured peak with the fixed one (a real pool of
that size would refuse the vanilla probe step that captures the job).

    PYTHONPATH=. python benchmarks/baseline_suite.py --models transformer,resnet50 --jobs 1 \\
        [--strategies tensile,vdnn,capuchin] [--budget-frac 0.5] [--cap-mib-s 110] [--json OUT]
    PYTHONPATH=. python benchmarks/baseline_suite.py --largest-batch --models transformer \\
        --strategies tensile,capuchin,vdnn --links unlimited [--batch-factors 1.5,2,3,4]

Note [Paired vanilla steps]. A time ratio divides the planned step's median by
the unplanned one's, and the two came from separate processes run a minute
apart: on the 2-core VM the same unplanned Transformer step (batch 48) took a
median 110-117 ms in two runs and 84-89 ms in three runs a quarter of an hour later,
so one plan's ratio read 1.5 to 1.9 depending on when its reference ran.
``--largest-batch --paired`` builds the planned job's unplanned twin in the
same process (same seed: same weights and batches) and steps it right after
each planned step (``plan_execution_reference.py --paired-vanilla``): the
ratio is of steps that ran side by side in time, and bit for bit compares
the two jobs of that process. The peaks are each job's pool peak less what
the other job holds meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plan_execution_bench import capped_link, compare, link_bandwidth, run, vanilla_runs  # noqa: E402
from tensile_tf.config.device_links import DEVICE_LINKS, combined_bandwidth, link_lanes  # noqa: E402
from tensile_tf.scheduler.paired_repeats import paired_summary, summary_line  # noqa: E402
from tensile_tf.scheduler.swap_channel import lane_bandwidth  # noqa: E402


#: TensorFlow's own memory optimizer (Grappler), by strategy name: its recomputation heuristics
#: (cheap forward ops feeding gradient_tape/ ops re-run), and MANUAL mode with a recompute hint on
#: every forward op (tf_plugin.tf_internals.mark_for_recomputation).
GRAPPLER = {"grappler-heuristics": "RECOMPUTATION_HEURISTICS", "grappler-manual": "MANUAL"}
#: TENSILE without recomputation (the plan the link bounds speak of); TENSILE
#: planned for steps that run free of plan order, and free only when that plan
#: meets the budget (Note [Free-order plans] in tensile_tf/scheduler/peak_analysis.py).
TENSILE_VARIANTS = {"tensile-swap": "plan", "tensile-free": "free", "tensile-auto": "auto"}


def lanes_of(a, link: str, bw: float) -> tuple[int, float]:
    """The link's lanes (``--link-lanes``, else two for a device link) and its
    combined cap, bytes/s (0: none), the same for every method of a row."""
    device = link if link in DEVICE_LINKS else None
    lanes = link_lanes(device, a.link_lanes)
    return lanes, combined_bandwidth(device, bw, lanes) or 0.0


def run_method(strategy: str, model: str, shape: str, k: int, steps: int, *, budget_frac: float,
               bandwidth: float, batch: int, budget_bytes: int = 0, paired_vanilla: bool = False,
               lanes: tuple[int, float] = (1, 0.0)) -> dict:
    """One configuration under one method (module docstring), in its own process, on ``lanes``
    (``lanes_of``)."""
    if strategy in GRAPPLER or strategy == "recompute-grad":
        return run(model, shape, k, steps, planned=False, budget_frac=0, bandwidth=0, batch=batch,
                   grappler_memory=GRAPPLER.get(strategy, ""),
                   recompute_segments=0 if strategy == "recompute-grad" else -1)
    return run(model, shape, k, steps, planned=True, budget_frac=budget_frac, bandwidth=bandwidth,
               strategy="tensile" if strategy in TENSILE_VARIANTS else strategy, batch=batch,
               budget_bytes=budget_bytes, no_recompute=strategy == "tensile-swap",
               step_order=TENSILE_VARIANTS.get(strategy, "plan"), paired_vanilla=paired_vanilla,
               link_lanes=lanes[0], combined_bandwidth=lanes[1])


def largest_batch(a, cap: float) -> list[dict]:
    """--largest-batch (module docstring): per model and method, each batch tried and the multipliers."""
    rows = []
    factors = [float(x) for x in a.batch_factors.split(",")]
    for name, model, shape, k, base in vanilla_runs(a.models, a.jobs, a.steps, batch=a.batch):
        pool = max(base["peaks"][1:])
        print(f"{name} x{k}: pool = vanilla peak at batch {a.batch} = {pool / 2**20:.1f} MiB", flush=True)
        vanilla_at = {a.batch: base}
        for link in a.links.split(","):
            bw, stands_for = link_bandwidth(link, cap, base)
            lanes = lanes_of(a, link, bw)
            print(f"link {stands_for}, {lanes[0]} lane(s)", flush=True)
            for strategy in a.strategies.split(","):
                if bw and (strategy in GRAPPLER or strategy == "recompute-grad"):
                    continue
                best = {"any": a.batch, "eor_1.5": a.batch}
                paired = a.paired and k == 1 and strategy not in GRAPPLER and strategy != "recompute-grad"
                for f in factors:
                    b = int(round(a.batch * f))
                    got = run_method(strategy, model, shape, k, a.steps, budget_frac=0, bandwidth=bw, batch=b,
                                     budget_bytes=int(pool * a.pool_margin), paired_vanilla=paired, lanes=lanes)
                    if paired:   # Note [Paired vanilla steps]: the reference ran beside the plan
                        van = got.get("paired_vanilla") or {"error": got.get("error", "no paired vanilla run")}
                    else:
                        if b not in vanilla_at:
                            vanilla_at[b] = run(model, shape, k, a.steps, planned=False, budget_frac=0, bandwidth=0,
                                                batch=b)
                        van = vanilla_at[b]
                    if "error" in got or "error" in van:
                        print(f"{name} x{k} {link} {strategy} batch {b}: failed: {(got.get('error') or van.get('error'))[-300:]}",
                              flush=True)
                        break
                    row = {"model": name, "jobs": k, "link": link, "link_stands_for": stands_for,
                           "link_lanes": lanes[0], "strategy": strategy, "batch": b, "pool_MiB": pool / 2**20,
                           "paired": paired,
                           **compare(van, got)}
                    row["fits"] = max(got["peaks"][1:]) <= pool
                    floor = (got.get("plan") or {}).get("working_set_floor")
                    row["working_set_floor_MiB"] = floor / 2**20 if floor else None
                    rows.append(row)
                    print(f"{name:12s} x{k} {link:9s} {strategy:14s} batch {b:4d}: peak {row['emp_MiB']:7.1f} of "
                          f"{pool / 2**20:.1f} MiB {'fits' if row['fits'] else 'does not fit'}  EOR {row['eor']:5.2f}  "
                          + (f"floor {floor / 2**20:6.1f} MiB  " if floor else "")
                          + f"swap {row['swapped_MiB_per_step']:7.1f} MiB/step recomp {row['recomputed_ops']:4d}  "
                          f"bit-for-bit {'yes' if row['bit_for_bit'] else 'NO'}", flush=True)
                    if not row["fits"]:
                        break
                    best["any"] = b
                    if row["eor"] <= 1.5:
                        best["eor_1.5"] = b
                summary = {"model": name, "jobs": k, "link": link, "strategy": strategy, "summary": True,
                           "base_batch": a.batch, "largest_batch": best["any"], "largest_batch_eor_1.5": best["eor_1.5"],
                           "multiplier": best["any"] / a.batch, "multiplier_eor_1.5": best["eor_1.5"] / a.batch}
                rows.append(summary)
                print(f"{name:12s} x{k} {link:9s} {strategy:14s} largest batch {best['any']} "
                      f"({summary['multiplier']:.2f}x), at EOR <= 1.5: {best['eor_1.5']} "
                      f"({summary['multiplier_eor_1.5']:.2f}x)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer,resnet50")
    ap.add_argument("--jobs", default="1")
    ap.add_argument("--strategies", default="tensile,tensile-auto,tensile-swap,vdnn,capuchin,grappler-heuristics,grappler-manual,"
                                            "recompute-grad")
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--links", default="unlimited,capped",
                    help="unlimited, capped, and/or a device link: h200-pcie5, h200-pcie5-bf16 (its share of the "
                         "measured vanilla peak per measured vanilla step; tensile_tf/config/device_links.py)")
    ap.add_argument("--link-lanes", type=int, choices=(1, 2), default=None,
                    help="the swap link's lanes for every method: 1 (one transfer at a time) or 2 (a lane per "
                         "direction) (default: 2 for a device link, 1 for unlimited and capped)")
    ap.add_argument("--cap-mib-s", type=float, default=None,
                    help="the capped link in MiB/s (default: from this CPU's matmul rate, as plan_execution_bench)")
    ap.add_argument("--largest-batch", action="store_true", help="the batch-multiplier runs (module docstring)")
    ap.add_argument("--batch-factors", default="1.5,2,3,4,6,8")
    ap.add_argument("--pool-margin", type=float, default=0.85,
                    help="--largest-batch: plan for this fraction of the fixed pool (0.85: below the 0.90 a run "
                         "plans a job for, 1 - POOL_HEADROOM in tensile_tf/runtime/admission.py; at 0.90 the "
                         "Transformer's 3x rows peaked at 19.8 MiB in a 20.3 MiB pool and swapped no fewer bytes, "
                         "benchmarks/RESULTS.md)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each row group this many times and print medians and paired wins (Note [Paired repeats])")
    ap.add_argument("--json", default=None)
    ap.add_argument("--paired", action="store_true",
                    help="--largest-batch, one job: the time ratio and bit for bit from the plan's unplanned twin, "
                         "stepped right after each planned step in the same process (Note [Paired vanilla steps])")
    a = ap.parse_args()
    cap = capped_link(a.cap_mib_s)
    if a.largest_batch:
        rows = largest_batch(a, cap)
    else:
        rows = [dict(r, repeat=i) for i in range(a.repeats) for r in compare_methods(a, cap)]
        if a.repeats > 1:   # Note [Paired repeats] in tensile_tf/scheduler/paired_repeats.py
            summaries = paired_summary(rows)
            for summary in summaries:
                print(summary_line(summary), flush=True)
            rows += summaries
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def compare_methods(a, cap: float) -> list[dict]:
    """Per model, jobs, link and method at the base batch: one row each (module docstring)."""
    rows = []
    for name, model, shape, k, vanilla in vanilla_runs(a.models, a.jobs, a.steps, batch=a.batch):
        vmp = max(vanilla["peaks"][1:])
        vanilla_step = statistics.median(vanilla["step_s"][1:])
        for link in a.links.split(","):
            bw, stands_for = link_bandwidth(link, cap, vanilla)
            lanes = lanes_of(a, link, bw)
            print(f"link {stands_for}, {lanes[0]} lane(s)", flush=True)
            # bytes a lane moves in a step; one lane carries each byte out and back, two carry it once each
            rate = lane_bandwidth(bw, lanes[0], lanes[1] or None) if bw else 0.0
            bound = None if bw == 0 else min(1.0, rate * vanilla_step / (2 if lanes[0] == 1 else 1) / vmp)
            for strategy in a.strategies.split(","):
                if bw and (strategy in GRAPPLER or strategy == "recompute-grad"):
                    continue   # recomputation only: the link plays no part
                planned = run_method(strategy, model, shape, k, a.steps, budget_frac=a.budget_frac, bandwidth=bw,
                                     batch=a.batch, lanes=lanes)
                if "error" in planned:
                    print(f"{name} x{k} {link} {strategy}: failed: {planned['error']}", flush=True)
                    continue
                row = {"model": name, "jobs": k, "link": link, "link_stands_for": stands_for,
                       "link_lanes": lanes[0], "strategy": strategy,
                       "link_MiB_s": None if bw == 0 else bw / 2**20, "link_bound_msr": bound,
                       **compare(vanilla, planned)}
                row["share_of_bound"] = row["msr"] / bound if bound else None
                dl = row["deadline_bound_msr"]
                row["share_of_deadline_bound"] = row["msr"] / dl if dl and dl > 0 else None   # <= 0: no swap plan helps
                rows.append(row)
                print(f"{name:12s} x{k} {link:9s} {strategy:14s} VMP {row['vmp_MiB']:7.1f} EMP {row['emp_MiB']:7.1f} "
                      f"MSR {row['msr']:6.1%} "
                      + (f"(pred {row['predicted_msr']:6.1%})" if row["predicted_msr"] is not None else "(no plan)     ")
                      + f"  EOR {row['eor']:5.2f}  "
                      f"CBR {row['cbr']:5.2f}  swap {row['swapped_MiB_per_step']:6.1f} MiB/step  "
                      f"recomp {row['recomputed_ops']:3d}  late {row['late_swap_ins']:3d}  "
                      + (f"bound {bound:6.1%} of bound {row['share_of_bound']:6.1%}  " if bound else "")
                      + (f"deadline bound {dl:6.1%} " if dl is not None else "")
                      + (f"of it {row['share_of_deadline_bound']:6.1%}  " if row["share_of_deadline_bound"] else "")
                      + f"bit-for-bit {'yes' if row['bit_for_bit'] else 'NO'}"
                      + ("" if row["bit_for_bit"] else f" (largest loss difference {row['max_loss_difference']:.3g})"),
                      flush=True)
    return rows


if __name__ == "__main__":
    main()
