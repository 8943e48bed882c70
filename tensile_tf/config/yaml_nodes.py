"""A YAML config's data, and its node tree: where each key is (for errors that say
file:line:column) and the keys given twice (libyaml's C loader where
PyYAML has it: a 50,000-job config validated in 110 s with three pure-Python parses, issue 57).

Note [Marks only for errors]
Where each key is (``mark_map``) is needed only to say where a mistake is, and the node tree
that holds it cost a 50,000-job config more than its data (PyYAML's resolver and the tree, in
Python, per scalar). So a config is read once for its data (``parse_data``, the C parser,
noting whether any mapping gives a key twice), and the marks are a ``LazyMarks`` that parses
the text again for its tree only when an error is formatted. A key given twice is reported
from the tree (``duplicate_keys``), parsed then.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _FlaggingLoader(_Loader):
    """The C loader that notes a mapping giving one key twice (reported from the tree), and that
    resolves each distinct plain scalar's tag once (PyYAML's resolver is Python: 800,000 scalars
    of a 50,000-job config took most of its parse)."""

    twice = False

    def __init__(self, text):
        super().__init__(text)
        self._tags: dict = {}

    def resolve(self, kind, value, implicit):
        if kind is not yaml.ScalarNode:
            return super().resolve(kind, value, implicit)
        key = (value, implicit)
        tag = self._tags.get(key)
        if tag is None:
            tag = self._tags[key] = super().resolve(kind, value, implicit)
        return tag

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            self.twice = self.twice or len(keys) != len(set(keys))
        return super().construct_mapping(node, deep=deep)


def parse_data(text: str) -> tuple[Any, bool]:
    """The YAML's data, and whether a mapping in it gives a key twice (Note [Marks only for errors])."""
    loader = _FlaggingLoader(text)
    try:
        return loader.get_single_data(), loader.twice
    finally:
        loader.dispose()


class LazyMarks(Mapping):
    """``mark_map`` of a YAML text, made on first use (Note [Marks only for errors])."""

    def __init__(self, text: str):
        self._text, self._marks = text, None

    def _loaded(self) -> dict:
        if self._marks is None:
            node = parse_tree(self._text)
            self._marks = mark_map(node) if node is not None else {}
        return self._marks

    def __getitem__(self, key):
        return self._loaded()[key]

    def __iter__(self) -> Iterator:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


def mark_map(node: yaml.Node, path: tuple = ()) -> dict[tuple, yaml.Mark]:
    """Maps each path (keys and list indexes) in a YAML node tree to where it
    starts: a mapping entry to its key, a list item to the item."""
    marks = {path: node.start_mark}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            marks.update(mark_map(value_node, path + (key_node.value,)))
            marks[path + (key_node.value,)] = key_node.start_mark
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.update(mark_map(item, path + (i,)))
    return marks


def parse_tree(text: str) -> yaml.Node | None:
    """The YAML's node tree (key locations, keys given twice), with libyaml's C parser where PyYAML
    has it; only where an error is to be placed (Note [Marks only for errors])."""
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def duplicate_keys(node: yaml.Node, path: tuple = ()) -> list[tuple[tuple, yaml.Mark, yaml.Mark]]:
    """(path, where, where first) of every key given twice in one mapping."""
    found = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Mark] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                found.append((path + (key,), key_node.start_mark, seen[key]))
            seen.setdefault(key, key_node.start_mark)
            found += duplicate_keys(value_node, path + (key,))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, path + (i,))
    return found
