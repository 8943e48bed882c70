"""The exact planner's plans and the greedy planner's, each in the other's
terms (Note [The exact planner] in tensile_tf/scheduler/exact_planner.py):
a greedy plan as CP-SAT's hint, and a solution as the greedy planner's
decisions, from which its own ``_make_plan`` makes the ``Plan`` the runtime
runs. ``ex`` is the ``ExactPlanner`` whose model was solved."""
from __future__ import annotations

from tensile_tf.scheduler.plan import Plan, RecomputeEvent
from tensile_tf.scheduler.state import SwapDecision


def hint_greedy_plan(ex, m, greedy) -> None:
    """The greedy planner's plan as CP-SAT's first solution to improve on:
    every variable hinted (unused events off), the greedy events mapped
    onto the unplanned step's ops and times (a re-run step maps to the
    boundary before the op it serves)."""
    for v in ex.copy_vars:
        if v:
            m.add_hint(v[0], 0)
            m.add_hint(v[1], v[3])
    hinted: dict[int, tuple[int, int]] = {}           # gap -> (in tick, copy end tick)
    gap_index = {(g.j, g.i, g.p % ex.planner.jobs[g.j].tas.n, g.q - g.p): n
                 for n, g in enumerate(ex.cands.gaps)}
    rerun_index = {(r.j, r.i, r.p, r.q): y for r, y in ex.rerun_vars}
    chosen_reruns = set()
    copy_hint: dict[int, int] = {}
    for js in greedy.jobs:
        V, G = ex.vanilla[js.j], js.tas
        n = V.n

        def step(u: int) -> int | None:       # a greedy unrolled step -> the unplanned step's (None: a re-run)
            name, shift = G.unrolled_name(u)
            return V.unrolled_index((name, shift)) if name in V.step_index else None

        def when(t: float) -> float:          # a greedy time -> the unplanned step's time
            u = G.step_at_u(t)
            while step(u) is None:
                u += 1
                t = G.start_u(u)
            k = step(u)
            return min(V.start_u(k) + (t - G.start_u(u)), V.end_u(k))

        for ev in js.recomputes:
            if ev.release_after_op not in V.step_index:    # released after another re-run: outside the model
                continue
            key = (js.j, V.tindex[ev.target], V.step_index[ev.release_after_op], V.step_index[ev.before_op])
            if key in rerun_index:
                chosen_reruns.add(key)
        for d in js.decisions:
            p, q = step(d.p), step(d.q)
            gi = gap_index.get((d.j, d.i, p % n, q - p)) if p is not None and q is not None else None
            if gi is None or ex.gap_vars[gi] is None:
                continue
            shift = (p - ex.cands.gaps[gi].p) // n * ex.period_s
            copy = ex.cands.gaps[gi].copy
            if d.out_start is not None and ex.copy_vars[copy] is not None:
                copy_hint[copy] = ex._down(when(d.out_start) - shift)
            hinted[gi] = ex._down(when(d.in_start) - shift)
    for c, tick in copy_hint.items():
        o, s, dc, lo = ex.copy_vars[c]
        _set_hint(m, o, 1)
        _set_hint(m, s, max(lo, tick))
    for gi, (g, v) in enumerate(zip(ex.cands.gaps, ex.gap_vars)):
        if v is None:
            continue
        x, t, _, avars = v
        tas = ex.vanilla[g.j]
        use = gi in hinted and g.copy in copy_hint
        m.add_hint(x, int(use))
        m.add_hint(t, hinted[gi] if use else ex.copy_vars[g.copy][3])
        for u, a in avars:
            away = use and copy_hint[g.copy] + ex.copy_vars[g.copy][2] <= ex._up(tas.start_u(u)) \
                and hinted[gi] >= ex._down(tas.end_u(u))
            m.add_hint(a, int(away))
    for key, y in rerun_index.items():
        m.add_hint(y, int(key in chosen_reruns))

def _set_hint(m, var, value: int) -> None:
    """A hint that replaces an earlier one of the same variable."""
    proto = m.proto.solution_hint
    idx = var.index
    for pos, v in enumerate(proto.vars):
        if v == idx:
            proto.values[pos] = value
            return
    m.add_hint(var, value)


def plan_from_solution(ex, solver, status: str) -> tuple[Plan, int]:
    """The chosen events as the greedy planner's decisions, then its ``_make_plan``."""
    p = ex.planner
    vanilla = {js.j: js.tas for js in p.jobs}
    restructure = []
    for r, y in ex.rerun_vars:
        if solver.value(y):
            js = p.jobs[r.j]
            tas = vanilla[r.j]
            js.recomputes.append(RecomputeEvent(
                js.name, tas.tensor_names[r.i], tas.step_names[r.p % tas.n], tas.step_names[r.q % tas.n],
                tas.step_names[r.q % tas.n - 1] if r.q % tas.n > 0 else None, list(r.ops), r.size, r.time_s,
                r.size / r.time_s if r.time_s > 0 else float("inf")))
            restructure.append(r.j)
    p._rebuild(restructure=sorted(set(restructure)))
    moved = 0
    copies_used: dict[int, float] = {}
    def away_marks(g, v) -> list[tuple[float, float, int, int]]:
        """Where the model holds gap g away: (old time away from, old time back by,
        new first step, new step after), for each step and each re-run block."""
        old, new = vanilla[g.j], p.jobs[g.j].tas
        marks = []
        for u, a in v[3]:
            if solver.value(a):
                k = new.unrolled_index(old.unrolled_name(u))
                marks.append((old.start_u(u), old.end_u(u), k, k + 1))
        for r, y, b in ex.rerun_away.get(id(g), ()):
            if solver.value(y) and solver.value(b):
                k = new.unrolled_index(old.unrolled_name(r.q))
                marks.append((old.start_u(r.q), old.start_u(r.q), k - len(r.ops), k))
        return marks

    used = sorted(((g, v, away_marks(g, v)) for g, v in zip(ex.cands.gaps, ex.gap_vars)
                   if v is not None and solver.value(v[0])), key=lambda gv: (gv[0].j, gv[0].i, gv[0].p))
    used = [u for u in used if u[2]]
    first_away: dict[int, float] = {}      # host copy -> the start of the first step a gap holds away
    for g, v, marks in used:
        t0 = min(mk[0] for mk in marks)
        first_away[g.copy] = min(first_away.get(g.copy, t0), t0)
    for g, v, marks in used:
        js = p.jobs[g.j]
        old, new = vanilla[g.j], js.tas
        o, s, dc, _ = ex.copy_vars[g.copy]
        T = ex.period_s
        out_start = solver.value(s) * T / ex.resolution
        in_start = solver.value(v[1]) * T / ex.resolution

        def moved_time(t: float) -> float:
            u = old.step_at_u(t)
            return new.start_u(new.unrolled_index(old.unrolled_name(u))) + (t - old.start_u(u))

        # ticks rounded in the model's favour: snap to the steps it holds away (at most a tick)
        out_start = min(out_start, first_away[g.copy] - g.dur_s)
        in_start = max(in_start, max(mk[1] for mk in marks))
        out_s, in_s = moved_time(out_start), moved_time(in_start)
        pp, qq = (new.unrolled_index(old.unrolled_name(u)) for u in (g.p, g.q))
        out_end = out_s + g.dur_s
        if g.copy in copies_used:
            out_end, out_s = copies_used[g.copy], None
        # the steps the model holds away are away whatever a float boundary says
        release = min(max(pp, new.step_done_by_u(out_end)), min(mk[2] for mk in marks) - 1)
        in_step = max(new.step_at_u(in_s), max(mk[3] for mk in marks))
        if release + 1 >= in_step:
            continue
        w = new.last_write_le(g.i, pp)
        dec = SwapDecision(g.j, g.i, pp, qq, release + 1, out_s, g.dur_s, in_s, g.dur_s, release, in_step,
                           version=w, names=(new.unrolled_name(pp), new.unrolled_name(qq),
                                             new.unrolled_name(release + 1)))
        dec.absent = js.fp.add_absence(g.i, release + 1, in_step)
        if out_s is not None:
            copies_used[g.copy] = out_end
            js.swapped_out.add(g.i)
            js.host_copies[(g.i, w % new.n) if w is not None else (g.i, -1)] = \
                out_end - (new.end_u(w) if w is not None else new.start_u(pp))
            moved += g.size
        moved += g.size
        js.decisions.append(dec)
        p.order.append(dec)
    p.stop_reason = f"exact planner: {status}"
    return p._make_plan(0.0), moved
