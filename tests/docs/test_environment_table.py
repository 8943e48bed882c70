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


CPP_READ = re.compile(r'(?:getenv|EnvByteCount)\(\s*"(TENSILE_[A-Z0-9_]+)"')


def test_cpp_reads_only_the_c_interfaces_own_variables():
    """Note [One call into the plugin] (tensile_tf/tf/plugin_settings.py): the plugin's settings reach
    C++ in one call; only the pool's C interface, for programs without Python, reads the environment."""
    reads = {}
    for path in sorted((REPO_ROOT / "tf_plugin").rglob("*")):
        if path.suffix in (".cc", ".h"):
            for name in CPP_READ.findall(path.read_text(errors="replace")):
                reads.setdefault(str(path.relative_to(REPO_ROOT)), set()).add(name)
    assert set(reads) == {"tf_plugin/allocator/pool_c_abi.cc"}, reads
    rows = {v.name: v for v in ENVIRONMENT}
    assert all("pool_c_abi.cc" in rows[name].read_by for name in reads["tf_plugin/allocator/pool_c_abi.cc"])


def test_the_plugins_settings_are_the_tables_rows_with_its_defaults():
    from tensile_tf.tf.plugin_settings import VARIABLES, PluginSettings
    from tensile_tf.units import parse_bytes

    rows = {v.name: v for v in ENVIRONMENT}
    defaults = PluginSettings()
    for field_name, variable in VARIABLES.items():
        row = rows[variable]
        assert "tensile_tf/tf/plugin_settings.py" in row.read_by
        shown = row.default.split(":")[0]
        value = getattr(defaults, field_name)
        expected = parse_bytes(shown) if row.unit.startswith("bytes (") else type(value)(shown)
        assert value == expected, (variable, row.default, value)
    # every field has its variable, and a variable set but unreadable names itself
    assert set(VARIABLES) == {f.name for f in __import__("dataclasses").fields(PluginSettings)}
    for variable, bad in (("TENSILE_HOST_BYTES", "lots"), ("TENSILE_POOL_STITCH", "yes"),
                          ("TENSILE_POOL_TRACE_EVENTS", "0"), ("TENSILE_SWAP_THREAD_NICE", "high")):
        try:
            PluginSettings.from_environment({variable: bad})
        except ValueError as e:
            assert str(e).startswith(f"{variable}={bad!r}: "), e
        else:
            raise AssertionError(f"{variable}={bad!r} was taken")
    assert PluginSettings.from_environment({"TENSILE_HOST_BYTES": "3GiB", "TENSILE_SWAP_BANDWIDTH": "1e9"}) == \
        PluginSettings(host_bytes=3 << 30, swap_bandwidth_bytes_per_s=1e9)
