"""Note [One call into the plugin] (tensile_tf/tf/plugin_settings.py): the environment's settings
reach the pool, the swap link and the host store through the one call, C++ reading none of them;
a config's ``pool:`` replaces the capacity alone; an unreadable value names its variable."""
from tests.conftest import last_json_line, run_python

CHILD = """
import json, sys
import tensile_tf
tensile_tf.install(sys.argv[1] if len(sys.argv) > 1 else None)
import tf_plugin
from tf_plugin import swap
from tensile_tf.tf.plugin_settings import in_effect
import dataclasses
print(json.dumps({"settings": dataclasses.asdict(in_effect()), "pool": tf_plugin.device_pool().capacity,
                  "host_store": swap.host_store_stats()["capacity"], "link": swap.swap_bandwidth()}))
"""

ENV = {"TENSILE_POOL_BYTES": "96MiB", "TENSILE_HOST_BYTES": "3GiB", "TENSILE_HOST_CACHE_BYTES": "0",
       "TENSILE_SWAP_BANDWIDTH": "1e9", "TENSILE_SWAP_THREAD_NICE": "0", "TENSILE_POOL_TRACE_EVENTS": "1000"}


def test_the_environment_reaches_the_plugin_in_one_call():
    got = last_json_line(run_python(CHILD, env=ENV))
    assert got["settings"] == {"pool_bytes": 96 << 20, "pool_stitch": True, "pool_trace_events": 1000,
                               "swap_bandwidth_bytes_per_s": 1e9, "swap_thread_nice": 0,
                               "host_bytes": 3 << 30, "host_cache_bytes": 0}
    # what the objects were created with: the settings, not C++'s defaults
    assert got["pool"] == 96 << 20 and got["host_store"] == 3 << 30 and got["link"] == 1e9


def test_a_configs_pool_replaces_the_capacity_alone():
    code = CHILD.replace("tensile_tf.install(sys.argv[1] if len(sys.argv) > 1 else None)", "tensile_tf.install('64MiB')")
    got = last_json_line(run_python(code, env=ENV))
    assert got["pool"] == 64 << 20 and got["settings"]["pool_bytes"] == 64 << 20
    assert got["settings"]["host_bytes"] == 3 << 30 and got["link"] == 1e9


def test_an_unreadable_setting_names_its_variable():
    proc = run_python("import tensile_tf\ntensile_tf.install()\n", env={"TENSILE_HOST_BYTES": "lots"})
    assert proc.returncode != 0
    assert "TENSILE_HOST_BYTES='lots': " in proc.stderr, proc.stderr[-2000:]
