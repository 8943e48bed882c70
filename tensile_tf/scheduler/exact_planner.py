"""The exact planner: the yardstick the greedy TENSILE planner is measured
against. Pure like the rest of ``tensile_tf.scheduler``; it needs OR-Tools
(``pip install -e ".[exact]"``), and nothing that runs a job imports it.

Note [The exact planner]
The same footprint model (Note [op-granular footprint] in peak_analysis),
the same link (its bandwidth; one lane, or a lane per direction) and the
same candidate events as the greedy planner (Note [The exact model's
candidates] in scheduler.exact_candidates), solved by OR-Tools' CP-SAT:

* each host copy and each swap-in is an optional interval on its lane; a
  lane is a ``NoOverlap`` on the circle of one iteration (each interval is
  placed at its start modulo the period and again one period later, so two
  transfers that overlap across the iteration boundary are caught), which
  is what the greedy channel checks over its horizon for jobs of one
  period;
* a Boolean per (gap, step) says the tensor is away while the step runs;
  it holds only if the copy ended before the step started and the swap-in
  starts after it ended;
* per job, the peak is at least every step's footprint less what is away;
  only steps that can be above the job's floor (every candidate taken) are
  constrained;
* minimise: the pool peak (one job: its peak; several: the sum of their
  peaks, the runtime's rule for jobs running free, Note [Coincident peaks]
  in peak_analysis); then, at that peak, the least recomputation time.
  With a budget: the pool peak at most the budget, the least recomputation
  time, then the fewest bytes moved.

Times are integers: one iteration is ``resolution`` ticks. Every rounding
favours the model (durations down; a transfer's deadlines up, its
earliest starts down), so every greedy plan is a point of the model up to
its exclusions, and the solver's bound is a bound on every greedy plan.
Within its time limit CP-SAT returns its best plan and a proven lower bound;
``ExactResult.status`` says which (``optimal``: the two meet).

Its plans are ordinary ``Plan`` objects made by the greedy planner's own
``_make_plan`` from the chosen events, so the runtime runs them like any
plan; ``ExactResult.plan_peak_bytes`` is that plan's predicted peak on the
greedy planner's footprint, and equals ``peak_bytes`` unless a
recomputation moved a transfer (Note [The exact model's candidates]).
"""
from __future__ import annotations

import math
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

from tensile_tf.scheduler.exact_candidates import ExactCandidates, collect_candidates
from tensile_tf.scheduler.exact_plans import hint_greedy_plan, plan_from_solution
from tensile_tf.scheduler.plan import Plan
from tensile_tf.scheduler.solver_child import SolverChild
from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S, Planner, PlannerJob

INSTALL_HINT = 'the exact planner needs OR-Tools: pip install -e ".[exact]"'


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:   # pragma: no cover - the test extra installs it
        raise ImportError(INSTALL_HINT) from e
    return cp_model


@dataclass
class ExactResult:
    status: str                   # "optimal", "feasible", "infeasible" (budget proven unreachable), "unknown"
    plan: Plan | None             # the best plan found, as the runtime runs it
    peak_bytes: int | None        # its pool peak in the exact model
    plan_peak_bytes: int | None   # the same plan's predicted pool peak on the greedy planner's footprint
    bound_bytes: int              # proven: no plan in the model peaks lower
    recompute_s: float            # time the plan's recomputations add to the steps
    swapped_bytes: int            # bytes moved per iteration (outs + ins)
    solve_s: float
    variables: int

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"


class ExactPlanner:
    """CP-SAT over the greedy planner's candidate events (Note [The exact planner]).

    ``lanes``: 1 (the seed's single link) or 2 (a copy engine per direction:
    swap-outs and swap-ins on their own lanes, each at ``bandwidth``)."""

    def __init__(self, jobs: Sequence[PlannerJob], *, pool_bytes: int | None = None,
                 bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S, lanes: int = 1,
                 coincident_peaks: bool | None = None, recompute: bool = True, max_chain: int = 4,
                 time_limit_s: float = 10.0, workers: int = 2, resolution: int = 1_000_000,
                 isolate: bool | None = None):
        if lanes not in (1, 2):
            raise ValueError(f"exact planner: lanes must be 1 or 2, got {lanes!r}")
        coincident = len(jobs) > 1 if coincident_peaks is None else coincident_peaks
        if len(jobs) > 1 and not coincident:
            raise ValueError("exact planner: several jobs are planned for the sum of their peaks "
                             "(coincident_peaks=True, the runtime's rule for jobs running free)")
        self.lanes = lanes
        self.pool_bytes = pool_bytes
        self.bandwidth = float(bandwidth_bytes_per_s)
        self.recompute = recompute
        self.max_chain = max_chain
        self.time_limit_s = float(time_limit_s)
        self.workers = workers
        self.isolate = isolate       # Note [CP-SAT beside TensorFlow]; None: where TensorFlow is loaded
        self._args = (list(jobs), dict(pool_bytes=pool_bytes, bandwidth_bytes_per_s=bandwidth_bytes_per_s, lanes=lanes,
                                       coincident_peaks=coincident_peaks, recompute=recompute, max_chain=max_chain,
                                       time_limit_s=time_limit_s, workers=workers, resolution=resolution))
        self.resolution = int(resolution)
        # the greedy planner's own state: sequences, footprints, timeline and _make_plan
        self.planner = Planner(jobs, pool_bytes=pool_bytes, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                               coincident_peaks=coincident, max_chain=max_chain, unchain=False)
        self.planner._init_state()
        self.vanilla = {js.j: js.tas for js in self.planner.jobs}   # the unplanned sequences, before any plan
        periods = [js.tas.period_s for js in self.planner.jobs]
        if max(periods) - min(periods) > 1e-9 * max(periods):
            raise ValueError("exact planner: jobs of one iteration time only (the lanes are one circle); "
                             f"got periods {[round(p, 6) for p in periods]}")
        self.period_s = max(periods)
        self.cands: ExactCandidates = collect_candidates(self.planner.jobs, self.bandwidth, recompute=recompute,
                                                         max_chain=max_chain)

    # -- ticks ---------------------------------------------------------------------
    def _down(self, t: float) -> int:
        return math.floor(t / self.period_s * self.resolution + 1e-9)

    def _up(self, t: float) -> int:
        return math.ceil(t / self.period_s * self.resolution - 1e-9)

    # -- model -----------------------------------------------------------------------
    def _build(self):
        cp_model = _cp_model()
        m = cp_model.CpModel()
        R = self.resolution
        jobs = self.planner.jobs
        cands = self.cands
        lanes: dict[str, list] = {"out": [], "in": []}

        def circle(start, dur: int, present, off: int, lane: str) -> None:
            pos = m.new_int_var(0, R - 1, "")
            m.add_modulo_equality(pos, start + (R + off), R)
            lanes[lane].append(m.new_optional_fixed_size_interval_var(pos, dur, present, ""))
            lanes[lane].append(m.new_optional_fixed_size_interval_var(pos + R, dur, present, ""))

        self.copy_vars = []
        for c in cands.copies:
            d = self._down(c.dur_s)
            lo, hi = self._down(c.lo_s), self._up(c.hi_s) - d
            if hi < lo:
                self.copy_vars.append(None)
                continue
            o = m.new_bool_var("")
            s = m.new_int_var(lo, hi, "")
            circle(s, d, o, self._down(jobs[c.j].offset_s), "out")
            self.copy_vars.append((o, s, d, lo))
        self.gap_vars = []
        self.absent: dict[int, list[tuple[int, object, int]]] = {}   # job -> (local step, var, bytes)
        floors = cands.floors
        for g in cands.gaps:
            cv = self.copy_vars[g.copy]
            js = jobs[g.j]
            tas = js.tas
            d = self._down(g.dur_s)
            hi = self._up(tas.start_u(g.q)) - d
            steps = [u for u in range(g.away_from, g.away_to + 1)
                     if g.freed[u % tas.n] and js.fp.base[u % tas.n] > floors[g.j]]
            if cv is None or not steps or hi < cv[3]:
                self.gap_vars.append(None)
                continue
            o, s, dc, lo = cv
            x = m.new_bool_var("")
            t = m.new_int_var(lo, hi, "")
            m.add_implication(x, o)
            m.add(t >= s + dc).only_enforce_if(x)
            circle(t, d, x, self._down(js.offset_s), "in" if self.lanes == 2 else "out")
            avars = []
            for u in steps:
                a = m.new_bool_var("")
                m.add_implication(a, x)
                m.add(s + dc <= self._up(tas.start_u(u))).only_enforce_if(a)
                m.add(t >= self._down(tas.end_u(u))).only_enforce_if(a)
                avars.append((u, a))
                self.absent.setdefault(g.j, []).append((u % tas.n, a, g.size))
            self.gap_vars.append((x, t, d, avars))
        m.add_no_overlap(lanes["out"])
        if lanes["in"]:
            m.add_no_overlap(lanes["in"])
        self.rerun_vars = self._reruns(m)
        # peaks
        self.peaks = []
        for js in jobs:
            tas, base = js.tas, js.fp.base
            P = m.new_int_var(floors[js.j], int(base.max()), f"peak{js.j}")
            by_step: dict[int, list] = {}
            for k, a, size in self.absent.get(js.j, ()):
                by_step.setdefault(k, []).append((a, size))
            for r, y in self.rerun_vars:
                if r.j == js.j:
                    for u in range(r.p + 1, r.q):
                        by_step.setdefault(u % tas.n, []).append((y, r.size))
            for k in range(tas.n):
                if base[k] > floors[js.j]:
                    m.add(int(base[k]) - sum(size * v for v, size in by_step.get(k, ())) <= P)
            self.peaks.append(P)
        for r, y, save in self.rerun_points:
            m.add(r.base_bytes - sum(size * v for v, size in save) <= self.peaks[r.j]).only_enforce_if(y)
        self.model = m
        self.pool_peak = sum(self.peaks)
        if self.pool_bytes is not None:
            m.add(self.pool_peak <= self.pool_bytes)
        self.recompute_ticks = sum(self._down(r.time_s) * y for r, y in self.rerun_vars)
        moved = [(int(round(c.dur_s * self.bandwidth)), v[0]) for c, v in zip(cands.copies, self.copy_vars) if v]
        moved += [(g.size, v[0]) for g, v in zip(cands.gaps, self.gap_vars) if v]
        self.moved_bytes = sum(b * x for b, x in moved)
        # lexicographic: recomputation ticks first, then bytes moved
        self.cost = self.recompute_ticks * (sum(b for b, _ in moved) + 1) + self.moved_bytes
        return m

    def _reruns(self, m) -> list:
        """Recomputation candidates as Booleans (Note [The exact model's candidates])."""
        jobs = self.planner.jobs
        out = []
        self.rerun_points = []      # (candidate, its Boolean, what is away during its re-run block)
        self.rerun_away: dict[int, list] = {}   # id(gap) -> (re-run, its Boolean, the gap away during it)
        gaps_of: dict[tuple[int, int], list] = {}
        for g, v in zip(self.cands.gaps, self.gap_vars):
            if v is not None:
                gaps_of.setdefault((g.j, g.i), []).append((g, v))
        per_op: dict[tuple[int, int], list] = {}
        for r in self.cands.reruns:
            y = m.new_bool_var("")
            out.append((r, y))
            per_op.setdefault((r.j, r.q), []).append(y)
            for g, v in gaps_of.get((r.j, r.i), ()):
                if g.p == r.p and g.q == r.q:
                    m.add_implication(y, v[0].Not())     # swapped or recomputed, not both
            for x in r.inputs:                          # the chain's inputs stay over q
                for g, v in gaps_of.get((r.j, x), ()):
                    if g.p < r.q < g.q or g.p < r.q - 1 < g.q:
                        m.add_implication(y, v[0].Not())
        for ys in per_op.values():
            m.add_at_most_one(ys)
        by_target = {}
        for r, y in out:
            by_target.setdefault((r.j, r.i), []).append((r, y))
        for r, y in out:
            for x in r.inputs:
                for r2, y2 in by_target.get((r.j, x), ()):
                    if r2.p < r.q - 1 and r2.q > r.q:
                        m.add_bool_or([y.Not(), y2.Not()])
            tas = jobs[r.j].tas
            if r.base_bytes <= self.cands.floors[r.j]:
                continue
            save = []
            for g, v in (gv for key, lst in gaps_of.items() if key[0] == r.j for gv in lst):
                if g.p < r.q - 1 and g.q > r.q:
                    b = m.new_bool_var("")
                    m.add_implication(b, v[0])
                    o, s, dc, _ = self.copy_vars[g.copy]
                    m.add(s + dc <= self._up(tas.start_u(r.q))).only_enforce_if(b)
                    m.add(v[1] >= self._down(tas.start_u(r.q))).only_enforce_if(b)
                    save.append((b, g.size))
                    self.rerun_away.setdefault(id(g), []).append((r, y, b))
            for r2, y2 in out:
                if r2.j == r.j and r2.p < r.q - 1 and r2.q > r.q:
                    save.append((y2, r2.size))
            self.rerun_points.append((r, y, save))
        return out

    # -- solve -------------------------------------------------------------------------
    def solve(self, hint: Planner | None = None) -> ExactResult:
        """The best plan within the time limit, and a proven bound. ``hint``: a
        greedy planner after ``plan()``; its plan is solved first with every
        hinted variable fixed (CP-SAT can lose a mere hint in a large model),
        so the result is never worse than the greedy plan where that plan is
        a point of the model."""
        if "tensorflow" in sys.modules if self.isolate is None else self.isolate:
            return self._solve_in_child(hint)
        cp_model = _cp_model()
        t0 = time.perf_counter()
        m = self._build()
        minimise = self.pool_bytes is None
        m.minimize(self.pool_peak if minimise else self.cost)
        found = (cp_model.OPTIMAL, cp_model.FEASIBLE)
        best = None                      # the solver holding the best plan found
        if hint is not None:
            self._hint(m, hint)
            fixed = self._solver(self.time_limit_s, fixed=True)
            if fixed.solve(m) in found:
                best = fixed
        solver = self._solver(self.time_limit_s)
        st = solver.solve(m)
        if st == cp_model.INFEASIBLE:
            return self._result("infeasible", None, self._minimised_bound(), t0)
        if st in found and (best is None or solver.objective_value <= best.objective_value):
            best = solver
        bound = self._minimised_bound()
        if minimise:   # CP-SAT's bound holds even where it found no plan
            bound = max(bound, int(math.ceil(solver.best_objective_bound - 1e-6)))
        if best is None:
            return self._result("unknown", None, bound, t0)
        status = "optimal" if st == cp_model.OPTIMAL else "feasible"
        if minimise:   # at that peak, the least recomputation time, then the fewest bytes moved
            self._fix_hint(m, best)
            m.add(self.pool_peak <= int(best.value(self.pool_peak)))
            m.minimize(self.cost)
            second = self._solver(max(1.0, self.time_limit_s / 2))
            if second.solve(m) in found and second.objective_value <= self._cost_of(best):
                best = second
        return self._result(status, best, bound, t0)

    def _solver(self, seconds: float, fixed: bool = False):
        solver = _cp_model().CpSolver()
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = 0
        solver.parameters.max_time_in_seconds = seconds
        solver.parameters.fix_variables_to_their_hinted_value = fixed
        return solver

    def _cost_of(self, solver) -> int:
        return int(solver.value(self.cost))

    def _minimised_bound(self) -> int:
        """A proven lower bound on the pool peak: the floors (every candidate taken)."""
        return int(sum(self.cands.floors))

    def _fix_hint(self, m, solver) -> None:
        m.clear_hints()
        for v in self._all_vars():
            m.add_hint(v, solver.value(v))

    def _all_vars(self):
        for v in self.copy_vars:
            if v:
                yield v[0]
                yield v[1]
        for v in self.gap_vars:
            if v:
                yield v[0]
                yield v[1]
                for _, a in v[3]:
                    yield a
        for _, y in self.rerun_vars:
            yield y

    def _hint(self, m, greedy: Planner) -> None:
        hint_greedy_plan(self, m, greedy)

    # -- the plan ----------------------------------------------------------------------
    def _result(self, status: str, solver, bound: int, t0: float) -> ExactResult:
        nvars = len(self.model.proto.variables)
        if solver is None:
            return ExactResult(status, None, None, None, bound, 0.0, 0, time.perf_counter() - t0, nvars)
        peak = self._model_peak(solver)
        plan, moved = self._plan(solver, status)
        rec = sum(r.time_s for r, y in self.rerun_vars if solver.value(y))
        return ExactResult(status, plan, peak, plan.pool_planned_peak_bytes, min(bound, peak), rec, moved,
                           time.perf_counter() - t0, nvars)

    def _model_peak(self, solver) -> int:
        """The chosen plan's pool peak in the model (with a budget the peak
        variables only bound it from above)."""
        total = 0
        for js in self.planner.jobs:
            F = js.fp.base.astype(float).copy()
            for k, a, size in self.absent.get(js.j, ()):
                F[k] -= size * solver.value(a)
            for r, y in self.rerun_vars:
                if r.j == js.j and solver.value(y):
                    for u in range(r.p + 1, r.q):
                        F[u % js.tas.n] -= r.size
            top = float(F.max()) if len(F) else 0.0
            for r, y, save in self.rerun_points:
                if r.j == js.j and solver.value(y):
                    top = max(top, r.base_bytes - sum(size * solver.value(v) for v, size in save))
            total += int(top)
        return total

    def _plan(self, solver, status: str) -> tuple[Plan, int]:
        return plan_from_solution(self, solver, status)

    # -- Note [CP-SAT beside TensorFlow] ---------------------------------------------------
    def _solve_in_child(self, hint: Planner | None) -> ExactResult:
        """``solve`` in a child interpreter that imports OR-Tools and not
        TensorFlow: the jobs and the hint go to it pickled, the result comes back so."""
        with tempfile.TemporaryDirectory(prefix="tensile-exact-") as d:
            given, result = os.path.join(d, "given.pickle"), os.path.join(d, "result.pickle")
            with open(given, "wb") as f:
                pickle.dump((*self._args, hint), f)
            SolverChild.solve(given, result, timeout_s=3 * self.time_limit_s + 300)   # Note [One solver child per process]
            with open(result, "rb") as f:
                return pickle.load(f)


def solve_pickled(given: str, result: str) -> None:
    """The child's side of Note [CP-SAT beside TensorFlow]."""
    with open(given, "rb") as f:
        jobs, kwargs, hint = pickle.load(f)
    out = ExactPlanner(jobs, isolate=False, **kwargs).solve(hint)
    with open(result, "wb") as f:
        pickle.dump(out, f)


# Note [CP-SAT beside TensorFlow]
# CP-SAT crashed (a segmentation fault in CpSolver.solve, and in
# CpModel.export_to_file) in a process that had run TensorFlow with this
# project's plugin loaded: the suite's worker ran tests/tf/test_compare.py,
# then the exact planner's first solve took the worker down (OR-Tools and
# TensorFlow each bring their own protobuf and absl). So where TensorFlow
# is loaded (or ``isolate=True``), ``solve`` runs whole in a child
# interpreter that imports OR-Tools and not TensorFlow (one, kept for later
# solves: Note [One solver child per process] in solver_child.py); the jobs,
# the settings and the greedy hint go to it pickled, and its ``ExactResult``
# comes back so. A pure process (benchmarks/exact_gap_bench.py, the pure
# tests) solves in process.
