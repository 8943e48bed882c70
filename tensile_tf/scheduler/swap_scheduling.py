"""Swap Event Scheduling (seed 000 §IV-C, Algorithm 2).

Greedy, as in the seed: take the tensors resident at the pool peak (MPT),
largest first, and for each infer the feasible intervals of its Swap-Out and
Swap-In events: the swap-out starts after the tensor's last write (its TGA, or
the optimizer update for parameters and slots) and ends before the peak; the
swap-in starts after the peak and after the swap-out ends, and ends before the
next access (TUA) it serves. The swap-out goes as early as the channel allows,
the swap-in as late as it allows. A tensor is only swapped out if its swap-in
fits too: no schedule needs a passive swap-in (§IV-C, first difficulty).

All jobs share ONE swap channel (the PCIe link of the seed): transfers never
overlap on a lane of it, at any of their repetitions over the planning
horizon. The seed's link has one lane for both directions; a GPU's has one
per direction (Note [A lane per direction]). A job's
share of swapped tensors is capped by its max swapping rate (Algorithm 2
line 36: SON[j] / SON <= MSR[j]).

Updated parameters and optimizer slots may be swapped across iterations: out
after their update in the optimizing phase, in before their first use in the
next iteration (Algorithm 2 lines 8-9 and 33-34, Fig. 1(c)). With unrolled step
indices that is just the gap from the last access to the first access + n.

Departures from the seed, each a fix of a weak spot:
* The seed schedules one swap-out per tensor and then greedily swaps it in for
  every later access (line 43). Here a later gap is only scheduled when the
  tensor is resident at a later peak, reusing the host copy (no second
  swap-out) while its version is current; channel time is not spent on gaps
  that do not lower a peak.
* A swap-out may overlap reads of the tensor (both only read it); the seed
  forbids overlapping any access. It must still start after the last write.
* A swap-in starts at an op boundary, Note [Swap-ins at op boundaries].

Note [Swap-ins at op boundaries]
Algorithm 2 places a swap-in as late as the channel allows: it ends exactly
when the op it serves starts. The runtime starts it delta t seconds after its
trigger op (the last op that ends before it, seed 000 §III-D) ends, so it
arrives in time only if every op between runs no faster than its latency and
the copy no slower than the link: no slack at all. Measured on the
Transformer's 3x batch (batch 48, planned for 17.3 MiB, 10 steps): 230 of 420
checked swap-ins came late and the step took 195 ms; the same plan with every
delta t at 0 had 67 late and took 154 ms, peaking 1.3 MiB higher than its
unchanged prediction. So a swap-in starts when its trigger op ends (delta t
0) wherever the channel is free from then, and the planner counts the
tensor back from that op on: the slack is up to one op's latency, and the
prediction holds the memory it costs.

Note [A lane per direction]
The seed assumes "there can only be one tensor being swapped
simultaneously": one lane for both directions. A GPU has a copy engine per
direction: the H200 of docs/design.md moves pinned copies at 55 GB/s
host-to-device and 55 GB/s device-to-host, and 92-94 GB/s both at once
(PCIe 5). With ``lanes=2`` swap-outs book the device-to-host lane and
swap-ins the host-to-device lane, so an out and an in may overlap in time;
transfers of one direction still run one at a time. Each lane runs at the
each-way rate; an optional combined cap C (both directions together) is
modelled conservatively and simply: every lane is booked at min(each-way,
C / 2) whether the other lane is busy or not (``lane_bandwidth``), so the
two lanes never move more than C together. For the H200 (C = 92/55 of the
each-way rate, ``DeviceLink.both_ways``) a lane books 0.84 of the each-way
rate: a transfer alone takes up to 1.2x its real time. ``lanes=1`` is the
seed's link, bit for bit as before. The tags a reservation returns name
their lane (``lane_of``); ``busy_intervals(lane)`` lists one lane.

Note [One swap per gap]
A gap of a tensor is swapped at most once. A swap booked for one peak brings
its tensor back before the access it serves; were a later peak inside the
same gap to find it resident again and book the gap a second time, the
footprint would take the tensor off twice over the steps both absences
cover, and the plan would predict less than its steps hold. A property
search found exactly that (a 5-byte plan under its 6-byte working-set
floor; a swap-only plan under its deadline bound), caused by rounding:
steps started at ``end - latency``, a hair past the end of the step before,
so a swap-in timed at op k's end counted as running in op k and the tensor
as back one op early. A step now starts exactly where the one before ends
(``access_sequence``), and ``scheduling_swap`` refuses a gap already booked
(``_booked_in_gap``). Within one pass the channel only fills, so moving
the booked swap-in after the later peak would need channel time the first
booking, placed as late as the channel allowed, did not find. None of the
saved ResNet50 captures (capped or unlimited link) had a doubly absent
step, so their plans are unchanged.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

import numpy as np

from tensile_tf.scheduler.peak_analysis import PeakAnalysis
from tensile_tf.scheduler.swap_channel import IN, OUT, SwapChannel
from tensile_tf.scheduler.state import JobState, SwapDecision

_EPS = 1e-12

def rate_allows(jobs: Sequence[JobState], js: JobState) -> bool:
    """Algorithm 2 line 36: a job may swap out another tensor while its share of all
    swapped-out tensors is within its max swapping rate."""
    total = sum(len(x.swapped_out) for x in jobs)
    return total == 0 or len(js.swapped_out) / total <= js.max_swapping_rate + 1e-12


def find_gap(js: JobState, i: int, m: int) -> tuple[int, int] | None:
    """The unrolled access gap (p, q) of tensor i that contains step m, or None when
    tensor i is accessed at m or has no access on one side of m."""
    tas = js.tas
    A = tas.acc[i]
    if not A:
        return None
    pos = bisect_left(A, m)
    if pos < len(A) and A[pos] == m:
        return None
    persistent = bool(tas.persistent[i])
    if pos == 0:
        return (A[-1] - tas.n, A[0]) if persistent else None
    if pos == len(A):
        return (A[-1], A[0] + tas.n) if persistent else None
    return A[pos - 1], A[pos]


def _at_trigger_end(js: JobState, channel: SwapChannel, start: float, lo: float, d: float) -> float:
    """Note [Swap-ins at op boundaries]: the end of the swap-in's trigger op,
    when that is no earlier than ``lo`` and the channel is free from then;
    else ``start``."""
    trigger, delta, _ = js.tas.trigger_of(start)
    at_end = start - delta
    if trigger is None or delta <= _EPS or at_end < lo - _EPS:
        return start
    return at_end if channel.is_free(js.j, at_end, d, direction=IN) else start


def _booked_in_gap(js: JobState, i: int, p: int, q: int) -> SwapDecision | None:
    """The decision already booked for tensor i over the gap (p, q) (unrolled
    indices that may differ by whole iterations), if any."""
    n = js.tas.n
    return next((d for d in _decisions_of(js, i) if d.q - d.p == q - p and (d.p - p) % n == 0), None)


def _decisions_of(js: JobState, i: int) -> list[SwapDecision]:
    """Job js's decisions for tensor i, from an index kept beside ``js.decisions`` (decisions are only
    appended to that list, and a rebuild starts a new one)."""
    kept = js.__dict__.get("_decisions_by_tensor")
    if kept is None or kept[0] is not js.decisions:
        kept = js.__dict__["_decisions_by_tensor"] = [js.decisions, 0, {}]
    decs, seen, by_tensor = kept
    for d in decs[seen:]:
        by_tensor.setdefault(d.i, []).append(d)
    kept[1] = len(decs)
    return by_tensor.get(i, [])


def scheduling_swap(jobs: Sequence[JobState], channel: SwapChannel, js: JobState, i: int,
                    m: int, gap: tuple[int, int] | None = None) -> SwapDecision | None:
    """Algorithm 2's scheduling_swap for tensor i of job js, so that it is off the
    device while step m runs. Reserves channel time and returns the decision, or
    returns None (nothing reserved) when no feasible swap-out/swap-in pair exists."""
    tas = js.tas
    gap = gap or find_gap(js, i, m)
    if gap is None:
        return None
    p, q = gap
    size = int(tas.size[i])
    d = channel.duration(size)
    if d <= 0:
        return None
    if _booked_in_gap(js, i, p, q) is not None:
        return None      # Note [One swap per gap]
    w = tas.last_write_le(i, p)
    version_key = (i, w % tas.n) if w is not None else (i, -1)
    peak_start = tas.start_u(m)
    out_tag = -1
    out_start: float | None = None
    rel_copy = js.host_copies.get(version_key)
    if rel_copy is not None:
        out_end = (tas.end_u(w) if w is not None else tas.start_u(p)) + rel_copy
        if out_end > peak_start + _EPS:
            rel_copy = None
    if rel_copy is None:
        if not rate_allows(jobs, js) and i not in js.swapped_out:
            return None
        lo = tas.end_u(w) if w is not None else tas.start_u(p)
        hi = peak_start - d
        if hi < lo - _EPS:
            return None
        out_start = channel.earliest(js.j, lo, hi, d, direction=OUT)
        if out_start is None:
            return None
        out_end = out_start + d
        out_tag = channel.reserve(js.j, out_start, d, direction=OUT)
    release_step = max(p, tas.step_done_by_u(out_end))
    if release_step >= m:
        if out_tag >= 0:
            channel.release(out_tag)
        return None
    in_lo = max(out_end, tas.end_u(m))
    in_hi = tas.start_u(q) - d
    in_start = channel.latest(js.j, in_lo, in_hi, d, direction=IN) if in_hi >= in_lo - _EPS else None
    if in_start is None:
        if out_tag >= 0:  # Algorithm 2 line 21: SE.remove(swap_out_event)
            channel.release(out_tag)
        return None
    in_start = _at_trigger_end(js, channel, in_start, in_lo, d)
    in_step = tas.step_at_u(in_start)
    if not m < in_step <= q - 1:
        if out_tag >= 0:
            channel.release(out_tag)
        return None
    in_tag = channel.reserve(js.j, in_start, d, direction=IN)
    dec = SwapDecision(js.j, i, p, q, m, out_start, d, in_start, d, release_step, in_step,
                       out_tag=out_tag, in_tag=in_tag, version=w,
                       names=(tas.unrolled_name(p), tas.unrolled_name(q), tas.unrolled_name(m)))
    dec.absent = js.fp.add_absence(i, release_step + 1, in_step)
    if out_tag >= 0:
        js.swapped_out.add(i)
        js.host_copies[version_key] = out_end - (tas.end_u(w) if w is not None else tas.start_u(p))
    js.decisions.append(dec)
    return dec


def swap_scheduling(jobs: Sequence[JobState], channel: SwapChannel, peak: PeakAnalysis, *,
                    need_bytes: int | None = None, failures: set | None = None) -> list[SwapDecision]:
    """Algorithm 2: walk MPT largest first and schedule every tensor that can be
    swapped around the peak (stopping early once ``need_bytes`` are off the peak).
    ``failures`` caches (job, tensor, peak step) tries that failed: the channel only
    fills up during the swap phase, so they would fail again."""
    failures = failures if failures is not None else set()
    parts_j, parts_i, parts_s = [], [], []
    for j, idx in peak.mpt.items():
        tas = jobs[j].tas
        idx = idx[tas.swappable[idx]]
        parts_j.append(np.full(len(idx), j, dtype=np.int64))
        parts_i.append(idx)
        parts_s.append(tas.size[idx])
    if not parts_i:
        return []
    cj, ci, cs = (np.concatenate(x) for x in (parts_j, parts_i, parts_s))
    order = np.lexsort((ci, cj, -cs))          # largest first, ties by job then tensor
    cands = zip(cs[order].tolist(), cj[order].tolist(), ci[order].tolist())
    done: list[SwapDecision] = []
    saved = 0
    for size, j, i in cands:
        if need_bytes is not None and saved >= need_bytes:
            break
        m = peak.job_steps[j]
        key = (j, i, m)
        if key in failures:
            continue
        dec = scheduling_swap(jobs, channel, jobs[j], i, m)
        if dec is None:
            failures.add(key)
            continue
        done.append(dec)
        saved += size
    return done
