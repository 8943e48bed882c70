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

Note [Data straight from the parser's events]
PyYAML's C loader parses in C but composes a node per scalar and constructs each through
Python's generic constructor (a call chain per scalar, and a tag resolved per scalar): of a
50,000-job config's 13.4 s ``tensile validate``, 6.5 s were the parse, and libyaml alone
delivers the same document's 950,014 events in 0.76 s. So ``parse_data`` builds the data
from the events (``data_from_events``): containers as they open, each distinct scalar's
tag resolved and its value constructed once by PyYAML's own resolver and safe constructors
(scalars are immutable, so a value is shared), anchors and aliases as PyYAML shares them.
Whatever only PyYAML's constructor handles (merge keys, tags of mappings and sequences,
a scalar tag with no safe constructor, a key that is a mapping or list, a repeated or
undefined anchor, a stream without exactly one document) hands the text to the C loader,
which builds it, or raises the error, as before. A syntax error is the parser's own, the
same in both. A property test holds the two to equal data on generated documents.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
try:
    from yaml._yaml import CParser as _CParser     # libyaml's parser, where PyYAML was built with it
except ImportError:
    _CParser = None


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


class _Unhandled(Exception):
    """The document uses what only PyYAML's constructor builds (Note [Data straight from the parser's events])."""


_SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "binary", "timestamp",
                                                            "str"))
_CONTAINER_TAGS = {yaml.MappingStartEvent: (None, "!", "tag:yaml.org,2002:map"),
                   yaml.SequenceStartEvent: (None, "!", "tag:yaml.org,2002:seq")}
_NO_KEY = object()


class _Scalars:
    """Each distinct scalar's value, its tag resolved and its value constructed once by PyYAML."""

    def __init__(self):
        self._resolver = yaml.resolver.Resolver()
        self._constructor = yaml.constructor.SafeConstructor()
        self.values: dict = {}

    def __call__(self, ev) -> Any:
        tag = ev.tag
        if tag is None or tag == "!":
            tag = self._resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag not in _SCALAR_TAGS:     # a merge key, `=`, or a tag only the full constructor knows
            raise _Unhandled(tag)
        node = yaml.ScalarNode(tag, ev.value, style=ev.style)
        value = self.values[(ev.tag, ev.value, ev.implicit)] = \
            self._constructor.yaml_constructors[tag](self._constructor, node)
        return value


def data_from_events(text: str) -> tuple[Any, bool]:
    """The data of a one-document YAML text built from libyaml's events, and whether a mapping gives a
    key twice; ``_Unhandled`` where only PyYAML's constructor builds it (Note [Data straight from the
    parser's events]). The parser's own errors (``yaml.YAMLError``) are raised as the C loader raises them."""
    parser = _CParser(text)
    try:
        get = parser.get_event
        get()                                        # the stream's start
        if type(get()) is not yaml.DocumentStartEvent:
            raise _Unhandled("no document")
        data, twice = _document(get)
        get()                                        # the document's end
        if type(get()) is not yaml.StreamEndEvent:
            raise _Unhandled("more than one document")
        return data, twice
    finally:
        parser.dispose()


def _document(get) -> tuple[Any, bool]:
    scalars, anchors = _Scalars(), {}
    values, twice = scalars.values, False
    stack: list[list] = []                           # [container, is a mapping, its pending key]
    Scalar, Alias, MapEnd, SeqEnd = yaml.ScalarEvent, yaml.AliasEvent, yaml.MappingEndEvent, yaml.SequenceEndEvent
    while True:
        ev = get()
        kind = type(ev)
        if kind is Scalar:
            value = values.get((ev.tag, ev.value, ev.implicit), _NO_KEY)
            if value is _NO_KEY:
                value = scalars(ev)
        elif kind is MapEnd or kind is SeqEnd:
            value = stack.pop()[0]
        elif kind is Alias:
            if ev.anchor not in anchors:
                raise _Unhandled("undefined alias")
            value = anchors[ev.anchor]
        elif kind in _CONTAINER_TAGS:
            if ev.tag not in _CONTAINER_TAGS[kind]:
                raise _Unhandled(ev.tag)
            value = {} if kind is yaml.MappingStartEvent else []
            stack.append([value, kind is yaml.MappingStartEvent, _NO_KEY])
        else:
            raise _Unhandled(kind.__name__)
        anchor = getattr(ev, "anchor", None) if kind is not Alias else None
        if anchor is not None:
            if anchor in anchors:
                raise _Unhandled("repeated anchor")
            anchors[anchor] = value
        if kind in _CONTAINER_TAGS:
            continue                                 # placed when it ends
        if not stack:
            return value, twice
        frame = stack[-1]
        if not frame[1]:
            frame[0].append(value)
        elif frame[2] is _NO_KEY:
            if isinstance(value, (dict, list)):
                raise _Unhandled("a key that is a mapping or list")
            frame[2] = value
        else:
            twice = twice or frame[2] in frame[0]
            frame[0][frame[2]] = value
            frame[2] = _NO_KEY


def parse_data(text: str) -> tuple[Any, bool]:
    """The YAML's data, and whether a mapping in it gives a key twice (Note [Marks only for errors]):
    from the parser's events where PyYAML has libyaml (Note [Data straight from the parser's events])."""
    if _CParser is not None:
        try:
            return data_from_events(text)
        except _Unhandled:
            pass
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
