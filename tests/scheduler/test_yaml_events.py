"""Note [Data straight from the parser's events] in tensile_tf/config/yaml_nodes.py: the data
built from libyaml's events equals PyYAML's C loader's on every document, and where only
PyYAML's constructor can build it, the loader's own result or error is what comes back."""
from __future__ import annotations

import datetime
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tensile_tf.config import yaml_nodes
from tensile_tf.config.yaml_nodes import _Unhandled, data_from_events, duplicate_keys, parse_data, parse_tree

pytestmark = pytest.mark.skipif(yaml_nodes._CParser is None, reason="PyYAML built without libyaml")

REPO = Path(__file__).resolve().parents[2]


def _loaded(text: str):
    return yaml.load(text, Loader=yaml.CSafeLoader)


def _same(a, b) -> bool:
    """Equal data, NaN equal to NaN, and of the same types (1 is not True, 1.0 not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["yes", "No", "on", "~", "0x1F", "0o17", "1_000", "1e3", ".inf", "-.Inf",
                                     ".NaN", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "null", "", " a b ",
                                     "12:30:00", "0b101", "+12", "010", "3.", "=", "<<", "a: b", "- x", "#c"]),
                    st.dates(), st.binary(max_size=8))
keys = st.one_of(st.text(max_size=8), st.integers(-100, 100), st.booleans(), st.none(),
                 st.sampled_from(["yes", "1.5", "~", "<<x"]))
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                         max_leaves=25)


@given(documents, st.sampled_from([None, True, False]), st.booleans())
def test_data_built_from_events_equals_the_c_loaders_data(data, flow, canonical):
    text = yaml.safe_dump({"d": data}, default_flow_style=flow, canonical=canonical, allow_unicode=True)
    expected = _loaded(text)
    built, twice = data_from_events(text)     # the events path itself: no fallback taken
    assert _same(built, expected), text
    assert not twice


SHARED = """\
base: &base {lr: 0.1, layers: [1, 2]}
again: *base
scalar: &s 12
uses: [*s, *s]
when: 2001-12-14 21:59:43.10 -5
raw: !!binary aGVsbG8=
text: !!str 12
float: !!float 3
plain: [12, yes, ~, 1.5]
quoted: ['12', 'yes', '~', "1.5"]
"""


def test_anchors_aliases_and_scalar_tags_as_pyyaml_builds_them():
    built, twice = data_from_events(SHARED)
    assert _same(built, _loaded(SHARED)) and not twice
    assert built["again"] is built["base"]            # an alias is the anchored object, as PyYAML shares it
    assert built["plain"] == [12, True, None, 1.5] and built["quoted"] == ["12", "yes", "~", "1.5"]
    assert isinstance(built["when"], datetime.datetime) and built["raw"] == b"hello" and built["text"] == "12"


# what only PyYAML's constructor builds, or an error only it raises: the loader's result, or error, comes back
HANDED_ON = {
    "merge key": "a: &a {x: 1}\nb:\n  <<: *a\n  y: 2\n",
    "value key": "=: 1\n",
    "set tag": "!!set {a, b}\n",
    "omap tag": "!!omap [a: 1, b: 2]\n",
    "python tag": "a: !!python/tuple [1, 2]\n",
    "local tag": "a: !mine 3\n",
    "mapping as key": "? {a: 1}\n: 2\n",
    "list as key": "? [a, b]\n: c\n",
    "undefined alias": "a: *nowhere\n",
    "repeated anchor": "a: &x 1\nb: &x 2\n",
    "two documents": "--- 1\n--- 2\n",
    "no document": "",
    "comment only": "# nothing\n",
}


@pytest.mark.parametrize("name", sorted(HANDED_ON))
def test_what_only_pyyaml_builds_is_handed_to_its_loader(name):
    text = HANDED_ON[name]
    with pytest.raises(_Unhandled):
        data_from_events(text)
    try:
        expected = _loaded(text)
    except yaml.YAMLError as e:
        with pytest.raises(type(e)) as got:
            parse_data(text)
        assert str(got.value) == str(e)
    else:
        assert _same(parse_data(text)[0], expected)


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: b: c\n", "a:\n\t- 1\n", "- a\nb: c\n", "a: 'x\n"])
def test_a_syntax_error_is_the_parsers_own(text):
    with pytest.raises(yaml.YAMLError) as expected:
        _loaded(text)
    with pytest.raises(type(expected.value)) as got:
        parse_data(text)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("text", ["a: 1\na: 2\n", "x:\n  - {k: 1, k: 2}\n", "a: 1\nb: {c: 1}\nb: 2\n"])
def test_a_key_given_twice_is_noted_where_the_tree_finds_it(text):
    data, twice = data_from_events(text)
    assert twice and duplicate_keys(parse_tree(text))
    assert _same(data, _loaded(text))     # the later value kept, as PyYAML keeps it


def test_every_yaml_file_of_the_repository_reads_as_the_loader_reads_it():
    paths = [p for p in REPO.rglob("*.yaml") if ".git" not in p.parts]
    assert len(paths) > 10
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:     # a bad config that is not UTF-8: read_yaml's own error
            continue
        try:
            expected = _loaded(text)
        except yaml.YAMLError as e:     # tests/e2e/bad_configs holds some
            with pytest.raises(type(e)) as got:
                parse_data(text)
            assert str(got.value) == str(e), path
        else:
            assert _same(parse_data(text)[0], expected), path
