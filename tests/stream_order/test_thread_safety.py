"""Note [Locks a compiler checks] (tf_plugin/thread_annotations.h): the pool,
the CounterBarrier, the swap channel and the host store compile under clang's
thread-safety analysis with its warnings as errors. The control: the same
source with one lock taken out must not compile, so the check is on and reads
the real annotations. Clang is the ziglang wheel's (the test extra)."""
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

COMPONENTS = ["tf_plugin/allocator/stream_aware_pool.cc", "tf_plugin/nodegroup/counter_barrier.cc",
              "tf_plugin/swap/swap_channel.cc", "tf_plugin/swap/host_store.cc"]
FLAGS = ["-std=c++17", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety", f"-I{REPO_ROOT}"]


def _clang(source, out):
    pytest.importorskip("ziglang", reason="the test extra's clang: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "ziglang", "c++", *FLAGS, "-c", "-o", str(out), str(source)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("source", COMPONENTS)
def test_each_component_passes_the_thread_safety_analysis(source, tmp_path):
    proc = _clang(REPO_ROOT / source, tmp_path / "out.o")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_lock_taken_out_does_not_compile(tmp_path):
    text = (REPO_ROOT / "tf_plugin/nodegroup/counter_barrier.cc").read_text()
    body = text.index("PipelineStats NodeGroupPipeline::Stats() const {")
    lock = text.index("  MutexLock lock(mu_);\n", body)
    unlocked = tmp_path / "counter_barrier_unlocked.cc"
    unlocked.write_text(text[:lock] + text[lock + len("  MutexLock lock(mu_);\n"):])
    proc = _clang(unlocked, tmp_path / "out.o")
    assert proc.returncode != 0
    assert "requires holding mutex 'mu_'" in proc.stderr, proc.stderr[-3000:]
