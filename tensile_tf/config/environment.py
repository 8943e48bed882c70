"""Every environment variable tensile-tf reads, in one table (issue 57: three of them were read in
C++ and documented nowhere).

Each row says the variable, who reads it (Python or the C++ plugin, and where), its default, its
unit and what it does. docs/configuration.md's table of environment variables is made from this
table (``markdown_table``) and a test holds the two equal; another test scans the Python and C++
sources and fails when code reads a ``TENSILE_*`` variable that is not here. The plugin's settings
(pool, swap link, host store) are read in one place, ``tensile_tf/tf/plugin_settings.py``, and handed
to C++ in one call (Note [One call into the plugin]); C++ reads only the C interface's own. The YAML keys a run
reads are the schema's (``config.schema``); where a variable and a key set the same thing, the key
wins and the row says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvironmentVariable:
    name: str
    read_by: str        # the file that reads it
    default: str
    unit: str
    doc: str


ENVIRONMENT = (
    EnvironmentVariable("TENSILE_POOL_BYTES", "tensile_tf/tf/plugin_settings.py, tf_plugin/allocator/pool_c_abi.cc "
                        "(the C interface's pool)", "4GiB",
                        "bytes (1GiB, 512MiB, ...)",
                        "the device pool's capacity when no config or `tensile_tf.install(pool_bytes)` sets it "
                        "(a config's `pool:` wins)"),
    EnvironmentVariable("TENSILE_POOL_STITCH", "tensile_tf/tf/plugin_settings.py, tf_plugin/allocator/pool_c_abi.cc "
                        "(the C interface's pool)", "1",
                        "0 or 1", "0 turns off stitching large requests from free pieces "
                        "(Note in tf_plugin/allocator/stream_aware_pool.h)"),
    EnvironmentVariable("TENSILE_POOL_TRACE_EVENTS", "tensile_tf/tf/plugin_settings.py", "65536", "events",
                        "the pool's event ring; a whole run's per-job memory series needs at least the run's events"),
    EnvironmentVariable("TENSILE_POOL_BACKEND", "tf_plugin/allocator/pool_c_abi.cc", "cuda where built with CUDA, "
                        "else async-host", "host, async-host, cuda",
                        "the backend of the pool's C interface (benchmarks/gpu, docs/devices.md), not TensorFlow's pool"),
    EnvironmentVariable("TENSILE_POOL_DEVICE", "tf_plugin/allocator/pool_c_abi.cc", "0", "CUDA device index",
                        "the GPU the C interface's CUDA backend allocates on"),
    EnvironmentVariable("TENSILE_SWAP_BANDWIDTH", "tensile_tf/tf/plugin_settings.py", "0: unlimited",
                        "bytes per second", "caps the emulated swap link before a run sets it (a run's "
                        "`run.swap_bandwidth` wins, 12 GiB/s where unset: docs/planner.md)"),
    EnvironmentVariable("TENSILE_SWAP_THREAD_NICE", "tensile_tf/tf/plugin_settings.py", "-10", "nice value",
                        "the swap link's copy threads' priority; 0 or more leaves them at the process's"),
    EnvironmentVariable("TENSILE_HOST_BYTES", "tensile_tf/tf/plugin_settings.py", "16GiB", "bytes (16GiB, ...)",
                        "the host store's capacity for swapped-out tensors"),
    EnvironmentVariable("TENSILE_HOST_CACHE_BYTES", "tensile_tf/tf/plugin_settings.py", "2GiB", "bytes (2GiB, ...)",
                        "pinned host buffers kept for reuse after a swap-in; 0: none"),
    EnvironmentVariable("TENSILE_LATENCY_PREDICTOR", "tensile_tf/tf/calibration.py", "the user cache directory",
                        "path", "the cold-start latency predictor `tensile calibrate` writes and cold starts read"),
    EnvironmentVariable("TENSILE_SHOW_TF_IMPORT_LOG", "tf_plugin/_loader.py", "unset", "1, true or yes",
                        "shows TensorFlow's own import log (filtered by default)"),
)

#: ``TENSILE_*`` names in the sources that are not environment variables (macros, constants).
NOT_ENVIRONMENT = {
    "TENSILE_POOL_API": "the C interface's export macro (pool_c_abi.h)",
    "TENSILE_WITH_CUDA": "the build's CUDA macro (setup.py)",
    "TENSILE_BUILT_AGAINST_TF": "the TensorFlow version macro the plugin is built with (setup.py)",
    "TENSILE_OPS": "the rewrite's set of tensile op types (tensile_tf/tf/rewrite/graph_edit.py)",
    "TENSILE_TEST_FORK": "the test suite's own switch, never read by the package (tests/forkserver.py)",
}
NOT_ENVIRONMENT.update({f"TENSILE_{m}": "a thread-safety attribute macro (tf_plugin/thread_annotations.h)" for m in (
    "THREAD_ANNOTATION", "CAPABILITY", "SCOPED_CAPABILITY", "GUARDED_BY", "PT_GUARDED_BY", "REQUIRES", "ACQUIRE",
    "RELEASE", "EXCLUDES", "NO_THREAD_SAFETY_ANALYSIS")})


def in_effect() -> dict[str, str | None]:
    """Each variable's value in this process (None: unset, its default applies): results.json's
    ``settings.environment``."""
    return {v.name: os.environ.get(v.name) for v in ENVIRONMENT}


def markdown_table() -> str:
    """The rows as docs/configuration.md shows them."""
    lines = ["| variable | default | unit | what it does | read by |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{v.name}` | {v.default} | {v.unit} | {v.doc} | `{v.read_by}` |" for v in ENVIRONMENT]
    return "\n".join(lines)
