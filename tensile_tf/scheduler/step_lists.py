"""Per tensor, the sorted steps that access it, kept in one flat list (issue 56).

Note [Access lists kept flat]
A sequence kept ``acc`` and ``writes`` as a list per tensor: 23,500 lists
for ResNet50's 11,747 tensors, and a plan of 16 such jobs keeps about
nine sequences (each set of recomputations it tried, Note [Sequences built
once per recomputation set] in scheduler.planner_rebuilds). The first
garbage collection after the plan walked their 211,000 lists beside the
plan's own objects (gen-0, 140-250 ms inside a 2.7-3.4 s plan), and every
full collection of a run that keeps its planner for re-plans walks them
again. ``StepLists`` keeps them as one list of steps and one of offsets:
two containers a sequence. ``steps[i]`` is a new list each time (a slice),
so what a caller does with it never reaches the sequence.
"""
from __future__ import annotations

from itertools import accumulate, chain
from typing import Iterable, Iterator, Sequence

import numpy as np


class StepLists:
    """Per index i a sorted list of steps (``steps[i]``: a copy), stored flat."""

    __slots__ = ("flat", "ptr")

    def __init__(self, lists: Sequence[list[int]]):
        self.flat: list[int] = list(chain.from_iterable(lists))
        self.ptr: list[int] = [0, *accumulate(map(len, lists))]

    def __getitem__(self, i: int) -> list[int]:
        p = self.ptr
        return self.flat[p[i]:p[i + 1]]

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def __iter__(self) -> Iterator[list[int]]:
        f, p = self.flat, self.ptr
        return (f[p[i]:p[i + 1]] for i in range(len(p) - 1))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepLists):
            return self.flat == other.flat and self.ptr == other.ptr
        return isinstance(other, Iterable) and list(self) == list(other)   # type: ignore[arg-type]

    __hash__ = None   # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepLists({list(self)!r})"

    def lengths(self) -> np.ndarray:
        """How many steps each index has."""
        return np.diff(np.asarray(self.ptr, dtype=np.int64))

    def unpacked(self, moved: list[int] | None = None) -> list[list[int]]:
        """A new list per index (a build's working form), each step k at ``moved[k]`` where given."""
        f, p = self.flat, self.ptr
        if moved is not None:
            f = [moved[k] for k in f]
        return [f[p[i]:p[i + 1]] for i in range(len(p) - 1)]
