"""Loads the plugin library into TensorFlow, or explains why it cannot.

Two facts decide the order (DESIGN.md):
* the allocator factory must be registered before TensorFlow builds its CPU
  device, or TensorFlow dies on a fatal CHECK, so "too late" is detected here
  first and raised as a Python error;
* TF_CPU_ALLOCATOR_USE_BFC makes TensorFlow bypass the allocator registry.
* Note [oneDNN's graph rewrites are off]: on x86 CPUs with AVX-512
  TensorFlow turns oneDNN on by default, and its layout pass merges op pairs
  (Conv2D + BiasAdd, Conv2DBackpropFilter + BiasAddGrad, Pad + Conv2D) after
  our rewrites, moving both ops' control edges onto the merged op. A control
  edge that a plan, a recomputation gate or a node-group barrier put between
  the two halves of such a pair becomes a cycle ("N nodes in a cycle") when
  the step is instantiated. The emulated accelerator has no such CPU-only
  pass, so the plugin sets TF_ENABLE_ONEDNN_OPTS=0 unless the user set it,
  which TensorFlow reads once, at import; if TensorFlow was imported first
  with oneDNN on, a warning says so. (The node-group partition is safe
  either way: Note [Nodes TensorFlow merges stay in one group].) It also
  keeps the CPU kernels' numerics the same on every machine.
The same .so is then imported as a Python module (pybind11 bindings): the
dynamic loader hands back the already loaded library, so TensorFlow and Python
share one device pool.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

LIBRARY_NAME = "_tensile_plugin"


class PluginLoadError(ImportError):
    """The plugin library cannot be loaded into this process."""


class PluginLoadedTooLateError(PluginLoadError):
    """TensorFlow created its devices before the plugin could register."""


def _library_path() -> Path:
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{LIBRARY_NAME}{suffix}"
        if candidate.exists():
            return candidate
    raise PluginLoadError(
        f"tf_plugin: the compiled library {LIBRARY_NAME}*.so is missing from {here}. "
        "Build it with `pip install -e .` (or `python setup.py build_ext --inplace`) "
        "from the repository root."
    )


def onednn_rewrites_enabled() -> bool:
    """Whether TensorFlow in this process runs oneDNN's graph rewrites."""
    from tf_plugin.tf_internals import onednn_rewrites_enabled as enabled

    return enabled()


# Lines TensorFlow's import writes to the process's stderr (from C++, before
# its logging is set up, so TF_CPP_MIN_LOG_LEVEL cannot silence them) when it
# probes for a GPU on a machine that has none. They say nothing about the run.
GPU_PROBE_NOISE = (
    "Could not find cuda drivers on your machine",
    "All log messages before absl::InitializeLog() is called",
    "Unable to register cuDNN factory", "Unable to register cuFFT factory", "Unable to register cuBLAS factory",
    "TF-TRT Warning: Could not find TensorRT",
    "computation placer already registered",
    "oneDNN custom operations are on",
    "failed call to cuInit",
)


class gpu_probe_noise_filtered:
    """Runs ``import tensorflow`` (``tensorflow_import=True``), or TensorFlow's
    device creation, with the process's stderr (file descriptor 2, which C++
    writes to) going through a pipe that passes on every line that is not
    GPU-probe noise (``GPU_PROBE_NOISE``). Anything else TensorFlow says then
    still reaches the console, as it comes. ``TENSILE_SHOW_TF_IMPORT_LOG=1`` turns the
    filter off."""

    def __init__(self, tensorflow_import: bool = False):
        self.tensorflow_import = tensorflow_import

    def __enter__(self):
        self.active = os.environ.get("TENSILE_SHOW_TF_IMPORT_LOG", "") not in ("1", "true", "yes") and \
            not (self.tensorflow_import and "tensorflow" in sys.modules)
        if self.active:
            import threading

            sys.stderr.flush()
            read_end, write_end = os.pipe()
            self.saved_fd = os.dup(2)
            os.dup2(write_end, 2)
            os.close(write_end)
            # Lines pass through as they come, so a hard crash still shows its message.
            self.pump = threading.Thread(target=self._pass_through, args=(read_end,), daemon=True)
            self.pump.start()
        return self

    def _pass_through(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not any(noise.encode() in line for noise in GPU_PROBE_NOISE):
                    os.write(self.saved_fd, line)

    def __exit__(self, *exc):
        if not self.active:
            return False
        sys.stderr.flush()
        os.dup2(self.saved_fd, 2)   # the pipe's last writer goes: the pump reads to its end
        self.pump.join(timeout=10)
        os.close(self.saved_fd)
        return False


def load_plugin():
    """Imports TensorFlow, registers the pool allocator and ops, returns the module."""
    already = sys.modules.get(f"tf_plugin.{LIBRARY_NAME}")
    if already is not None:
        return already
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true", "yes"):
        raise PluginLoadError(
            "tf_plugin: TF_CPU_ALLOCATOR_USE_BFC is set, which makes TensorFlow build its own "
            "BFC allocator and bypass the tensile device pool. Unset it (e.g. `unset "
            "TF_CPU_ALLOCATOR_USE_BFC`) before importing tensile_tf."
        )
    # Note [oneDNN's graph rewrites are off]
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    with gpu_probe_noise_filtered(tensorflow_import=True):
        import tensorflow as tf

    if onednn_rewrites_enabled():
        warnings.warn(
            "tf_plugin: TensorFlow runs with oneDNN on (imported before tensile_tf, or TF_ENABLE_ONEDNN_OPTS=1), so oneDNN's graph "
            "rewrites merge ops across the control edges that TENSILE plans insert, and a planned step "
            "can fail with 'N nodes in a cycle'. Import tensile_tf before tensorflow, or set "
            "TF_ENABLE_ONEDNN_OPTS=0 before starting Python.", RuntimeWarning, stacklevel=3)
    from tf_plugin.tf_internals import tensorflow_devices_exist

    if tensorflow_devices_exist():
        raise PluginLoadedTooLateError(
            "tf_plugin: TensorFlow already created its devices, so the tensile device pool can no "
            "longer become their allocator. Call `tensile_tf.install()` (it loads the plugin; "
            "importing tensile_tf alone does not) before TensorFlow's first op, variable, "
            "list_logical_devices() or tf.function call, ideally right after `import tensile_tf`, "
            "which goes before `import tensorflow`."
        )
    path = _library_path()
    try:
        tf.load_op_library(str(path))
    except tf.errors.NotFoundError as e:
        raise PluginLoadError(
            f"tf_plugin: {path.name} does not load into TensorFlow {tf.__version__} ({e}). "
            "It was probably built against another TensorFlow: rebuild with `pip install -e .`."
        ) from e
    spec = importlib.util.spec_from_file_location(f"tf_plugin.{LIBRARY_NAME}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[spec.name] = module
    built = getattr(module, "BUILT_AGAINST_TF", None)
    if built is not None and built != tf.__version__:
        raise PluginLoadError(
            f"tf_plugin: the library was built against TensorFlow {built} but TensorFlow "
            f"{tf.__version__} is running; rebuild with `pip install -e .`."
        )
    return module
