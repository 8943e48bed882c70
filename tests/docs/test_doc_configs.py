"""Issue 57: every YAML config shown in the docs validates (the schema and the
checks that need no runtime), so an example a user copies is one the runtime
accepts. A block with ``jobs:`` is a run config, with ``search:`` a search
config; other blocks are fragments and are only parsed."""
import re

import pytest
import yaml

from tensile_tf.config.schema import config_from_data
from tensile_tf.config.validation import check_config, raise_problems
from tests.conftest import REPO_ROOT

DOCS = sorted([*(REPO_ROOT / "docs").glob("*.md"), REPO_ROOT / "README.md"])


def yaml_blocks():
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"```yaml\n(.*?)```", text, re.S):
            yield pytest.param(m.group(1), id=f"{path.name}:{text[:m.start()].count(chr(10)) + 2}")


BLOCKS = list(yaml_blocks())


def test_the_docs_show_at_least_one_config():
    assert any("jobs:" in b.values[0] for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS)
def test_every_yaml_block_in_the_docs_validates(block):
    data = yaml.safe_load(block)
    if isinstance(data, dict) and "search" in data and "jobs" not in data:
        from tensile_tf.search.config import search_config_from_data
        search_config_from_data(data, source="docs")
    elif isinstance(data, dict) and "jobs" in data:
        cfg = config_from_data(data, source="docs")
        raise_problems(check_config(cfg, references=False), source="docs", marks=None)
