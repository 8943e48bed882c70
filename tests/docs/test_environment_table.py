"""Issue 57: every ``TENSILE_*`` environment variable the code reads is in one
table (tensile_tf/config/environment.py), and docs/configuration.md shows that
table as it is."""
import re

from tensile_tf.config.environment import ENVIRONMENT, NOT_ENVIRONMENT, markdown_table
from tests.conftest import REPO_ROOT

NAME = re.compile(r"TENSILE_[A-Z0-9_]*[A-Z0-9]")


def names_in_sources(roots, suffixes=(".py", ".cc", ".h")):
    """Every TENSILE_* name the sources under ``roots`` mention, with a file that does."""
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in suffixes and path.is_file() and path.name != "environment.py":
                for name in NAME.findall(path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(REPO_ROOT)))
    return found


def test_every_variable_the_code_reads_is_in_the_table():
    found = names_in_sources([REPO_ROOT / "tensile_tf", REPO_ROOT / "tf_plugin"])
    assert "TENSILE_SWAP_THREAD_NICE" in found and "TENSILE_POOL_BYTES" in found   # the scan reads C++ and Python
    known = {v.name for v in ENVIRONMENT} | set(NOT_ENVIRONMENT)
    unknown = {name: where for name, where in found.items() if name not in known}
    assert unknown == {}, f"TENSILE_* names read but not in tensile_tf/config/environment.py: {unknown}"
    unused = sorted({v.name for v in ENVIRONMENT} - set(found))
    assert unused == [], f"rows for variables no code reads: {unused}"


def test_the_docs_show_the_table_as_it_is():
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    start = text.index("<!-- environment table: made from tensile_tf/config/environment.py -->\n")
    end = text.index("\n<!-- end of the environment table -->")
    shown = text[start:end].split("\n", 1)[1]
    assert shown == markdown_table(), "docs/configuration.md's environment table differs: paste markdown_table()"
