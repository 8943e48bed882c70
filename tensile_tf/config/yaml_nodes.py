"""A YAML config's node tree: where each key is (for errors that say file:line:column), the keys
given twice, and one parse that yields both the tree and the data (libyaml's C loader where
PyYAML has it: a 50,000-job config validated in 110 s with three pure-Python parses, issue 57)."""
from __future__ import annotations

from typing import Any

import yaml


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


def parse_once(text: str):
    """The YAML's node tree (key locations, duplicate keys) and its data, from one parse with
    libyaml's C loader where PyYAML has it (a 50,000-job config: issue 57)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
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
