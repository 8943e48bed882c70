"""Comparing planning methods over repeated runs (``benchmarks/baseline_suite.py
--repeats``). Pure: rows of measured results in, one summary row per method out.

Note [Paired repeats]. Two concurrent ResNet50 jobs on the capped link
measured a vanilla peak 6% apart between runs (798-847 MiB) and a plan's MSR
as far apart (Capuchin 2.3-13.3% with one policy), so one run per row ranked
TENSILE above Capuchin in three of five runs and below in two. ``--repeats R``
runs the whole row group R times, each repeat with its own vanilla run, and
then prints per method the median MSR, EOR and CBR and, against each other
method, in how many repeats its CBR was at least the other's: a method is
compared only with runs made beside it, on the same vanilla.
"""
from __future__ import annotations

import statistics


def paired_summary(rows: list[dict]) -> list[dict]:
    """Note [Paired repeats]: per row group and method, the medians over the
    repeats, and against each other method the repeats where its CBR was at
    least the other's (both measured in the same repeat). ``rows``: one per
    run, with ``model``, ``jobs``, ``link``, ``strategy``, ``repeat``, ``msr``,
    ``eor``, ``cbr`` and ``vmp_MiB``."""
    out = []
    groups: dict[tuple, dict[str, dict[int, dict]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["jobs"], r["link"]), {}).setdefault(r["strategy"], {})[r["repeat"]] = r
    for (model, jobs, link), by_method in groups.items():
        for method, runs in by_method.items():
            wins = {}
            for other, other_runs in by_method.items():
                if other != method:
                    both = sorted(set(runs) & set(other_runs))
                    wins[other] = (sum(runs[i]["cbr"] >= other_runs[i]["cbr"] for i in both), len(both))
            out.append({"model": model, "jobs": jobs, "link": link, "strategy": method, "summary": True,
                        "repeats": len(runs), "cbr_runs": [runs[i]["cbr"] for i in sorted(runs)],
                        **{f"median_{key}": statistics.median(r[key] for r in runs.values())
                           for key in ("msr", "eor", "cbr", "vmp_MiB")},
                        "cbr_at_least": {o: f"{w} of {n}" for o, (w, n) in wins.items()}})
    return out


def summary_line(summary: dict) -> str:
    """One summary row of ``paired_summary`` as the benchmark prints it."""
    return (f"{summary['model']:12s} x{summary['jobs']} {summary['link']:9s} {summary['strategy']:14s} over "
            f"{summary['repeats']} repeats: median MSR {summary['median_msr']:6.1%} EOR {summary['median_eor']:5.2f} "
            f"CBR {summary['median_cbr']:5.2f} (runs {', '.join(f'{c:.2f}' for c in summary['cbr_runs'])}); "
            "CBR at least " + ", ".join(f"{o}'s in {v}" for o, v in summary["cbr_at_least"].items()))
