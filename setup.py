"""Builds tf_plugin._tensile_plugin: the StreamAwarePool, its TensorFlow
allocator adapter and custom ops, and the pybind11 bindings, as ONE shared
library. TensorFlow loads it with tf.load_op_library (registering the allocator
factory and the ops); Python imports the same file as a module.

Also builds tf_plugin._pool_replay: the same pool core with its host backends
(synchronous and asynchronous) and the trace replay, WITHOUT TensorFlow, for
the stream-ordering race test (tf_plugin/allocator/trace_replay.h). The CUDA
backend is not built here: benchmarks/gpu/CMakeLists.txt builds it where CUDA
is found.

The library must be built against the exact TensorFlow that loads it (C++ ABI,
op registry). TENSORFLOW_PIN below is the single source of that version: the
runtime dependency and the isolated build environment (pyproject.toml) both
pin it, this script refuses any other, and the loader checks it again.
"""
import os
import sys

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

TENSORFLOW_PIN = "2.21.0"


def tensorflow_flags():
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - build-time guard
        sys.exit(f"tensile-tf build: TensorFlow {TENSORFLOW_PIN} must be installed "
                 f"in the build environment ({e}). Run: pip install tensorflow=={TENSORFLOW_PIN}")
    if tf.__version__ != TENSORFLOW_PIN:
        sys.exit(f"tensile-tf build: found TensorFlow {tf.__version__} but the plugin is "
                 f"pinned to {TENSORFLOW_PIN}; a mismatched build would not load. "
                 f"Install tensorflow=={TENSORFLOW_PIN}.")
    lib_dir = os.path.dirname(tf.__file__)
    return tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(), lib_dir


compile_flags, link_flags, tf_lib_dir = tensorflow_flags()
sources = [
    "tf_plugin/allocator/stream_aware_pool.cc",
    "tf_plugin/allocator/async_host_backend.cc",
    "tf_plugin/allocator/device_pool.cc",
    "tf_plugin/allocator/tf_pool_allocator.cc",
    "tf_plugin/allocator/bindings.cc",
    "tf_plugin/ops/bind_step_op.cc",
    "tf_plugin/nodegroup/counter_barrier.cc",
    "tf_plugin/nodegroup/boundary_op.cc",
    "tf_plugin/nodegroup/bindings.cc",
    "tf_plugin/swap/host_store.cc",
    "tf_plugin/swap/swap_channel.cc",
    "tf_plugin/swap/swap_ops.cc",
    "tf_plugin/swap/transfers.cc",
    "tf_plugin/swap/plan_table_ops.cc",
    "tf_plugin/swap/swap_bindings.cc",
]
plugin = Pybind11Extension(
    "tf_plugin._tensile_plugin",
    sources=sources,
    include_dirs=["."],
    define_macros=[("TENSILE_BUILT_AGAINST_TF", f'"{TENSORFLOW_PIN}"')],
    extra_compile_args=[f for f in compile_flags if not f.startswith("--std")] + ["-O2"],
    extra_link_args=link_flags + [f"-Wl,-rpath,{tf_lib_dir}"],
    cxx_std=17,
    depends=[
        "tf_plugin/allocator/stream_aware_pool.h",
        "tf_plugin/allocator/pool_backend.h",
        "tf_plugin/allocator/event_trace.h",
        "tf_plugin/allocator/device_pool.h",
        "tf_plugin/allocator/async_host_backend.h",
        "tf_plugin/allocator/stream_kernels.h",
        "tf_plugin/nodegroup/counter_barrier.h",
        "tf_plugin/swap/host_copy.h",
        "tf_plugin/swap/host_store.h",
        "tf_plugin/swap/swap_channel.h",
    ],
)

pool_core_headers = [
    "tf_plugin/allocator/stream_aware_pool.h",
    "tf_plugin/allocator/pool_backend.h",
    "tf_plugin/allocator/event_trace.h",
    "tf_plugin/allocator/free_chunk_set.h",
    "tf_plugin/allocator/stream_kernels.h",
    "tf_plugin/allocator/async_host_backend.h",
    "tf_plugin/allocator/trace_replay.h",
]
pool_replay = Pybind11Extension(
    "tf_plugin._pool_replay",
    sources=[
        "tf_plugin/allocator/stream_aware_pool.cc",
        "tf_plugin/allocator/async_host_backend.cc",
        "tf_plugin/allocator/trace_replay.cc",
        "tf_plugin/allocator/replay_bindings.cc",
    ],
    include_dirs=["."],
    # Hidden: the same pool classes live in _tensile_plugin; neither library may bind the
    # other's symbols when both are loaded in one process.
    extra_compile_args=["-O2", "-pthread", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
    cxx_std=17,
    depends=pool_core_headers,
)

setup(ext_modules=[plugin, pool_replay], cmdclass={"build_ext": build_ext})
