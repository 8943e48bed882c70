"""Issue 19's baseline suite: TENSILE against the planners a user would pick
instead, in the same harness, one process per configuration
(tests/tf/plan_execution_reference.py: its own pool, deterministic ops).

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
(bandwidth x step / 2), as an MSR ceiling for swap-only plans
(bound / VMP); ``of bound`` is MSR as a share of it.

    PYTHONPATH=. python benchmarks/baseline_suite.py --models transformer,resnet50 --jobs 1 \\
        [--strategies tensile,vdnn,capuchin] [--budget-frac 0.5] [--cap-mib-s 110] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plan_execution_bench import capped_link, compare, run, vanilla_runs  # noqa: E402


#: TensorFlow's own memory optimizer (Grappler), by strategy name: its recomputation heuristics
#: (cheap forward ops feeding gradient_tape/ ops re-run), and MANUAL mode with a recompute hint on
#: every forward op (tf_plugin.tf_internals.mark_for_recomputation).
GRAPPLER = {"grappler-heuristics": "RECOMPUTATION_HEURISTICS", "grappler-manual": "MANUAL"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer,resnet50")
    ap.add_argument("--jobs", default="1")
    ap.add_argument("--strategies", default="tensile,vdnn,capuchin,grappler-heuristics,grappler-manual,recompute-grad")
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--links", default="unlimited,capped")
    ap.add_argument("--cap-mib-s", type=float, default=None,
                    help="the capped link in MiB/s (default: from this CPU's matmul rate, as plan_execution_bench)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cap = capped_link(a.cap_mib_s)
    rows = []
    for name, model, shape, k, vanilla in vanilla_runs(a.models, a.jobs, a.steps):
        vmp = max(vanilla["peaks"][1:])
        vanilla_step = statistics.median(vanilla["step_s"][1:])
        for link in a.links.split(","):
            bw = 0.0 if link == "unlimited" else cap
            bound = None if bw == 0 else min(1.0, bw * vanilla_step / 2 / vmp)
            for strategy in a.strategies.split(","):
                if strategy in GRAPPLER or strategy == "recompute-grad":
                    if bw:
                        continue   # recomputation only: the link plays no part
                    planned = run(model, shape, k, a.steps, planned=False, budget_frac=0, bandwidth=0,
                                  grappler_memory=GRAPPLER.get(strategy, ""),
                                  recompute_segments=0 if strategy == "recompute-grad" else -1)
                else:
                    planned = run(model, shape, k, a.steps, planned=True, budget_frac=a.budget_frac,
                                  bandwidth=bw, strategy=strategy)
                if "error" in planned:
                    print(f"{name} x{k} {link} {strategy}: failed: {planned['error']}", flush=True)
                    continue
                row = {"model": name, "jobs": k, "link": link, "strategy": strategy,
                       "link_MiB_s": None if bw == 0 else bw / 2**20, "link_bound_msr": bound,
                       **compare(vanilla, planned)}
                row["share_of_bound"] = row["msr"] / bound if bound else None
                rows.append(row)
                print(f"{name:12s} x{k} {link:9s} {strategy:9s} VMP {row['vmp_MiB']:7.1f} EMP {row['emp_MiB']:7.1f} "
                      f"MSR {row['msr']:6.1%} "
                      + (f"(pred {row['predicted_msr']:6.1%})" if row["predicted_msr"] is not None else "(no plan)     ")
                      + f"  EOR {row['eor']:5.2f}  "
                      f"CBR {row['cbr']:5.2f}  swap {row['swapped_MiB_per_step']:6.1f} MiB/step  "
                      f"recomp {row['recomputed_ops']:3d}  late {row['late_swap_ins']:3d}  "
                      + (f"bound {bound:6.1%} of bound {row['share_of_bound']:6.1%}  " if bound else "")
                      + f"bit-for-bit {'yes' if row['bit_for_bit'] else 'NO'}"
                      + ("" if row["bit_for_bit"] else f" (largest loss difference {row['max_loss_difference']:.3g})"),
                      flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
