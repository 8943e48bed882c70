"""The child interpreter the exact planner solves in where TensorFlow is loaded (Note [CP-SAT
beside TensorFlow] in exact_planner.py), kept for the process's later solves.

Note [One solver child per process]
Each isolated solve used to start its own interpreter, which spent about 0.8 s of CPU starting
and importing OR-Tools and this package before it solved anything (2.0-2.3 s of wall on a loaded
2-core machine); a suite worker that had run TensorFlow paid it for every solve of
tests/scheduler/test_exact_planner.py (10.2 s and 13.1 s for its two property tests). The first
isolated solve now starts one child that reads one request per line (the pickled problem's
path, the result's path) and answers one line each; later solves reuse it. The scheduler starts
no threads and is called from one (tests/scheduler/test_purity.py); a solve that finds the kept
child busy all the same (a caller's second thread) gets a child of its own for that solve. A
child that died (a crash in CP-SAT, a timeout that killed it) is replaced by the next solve. It
ends when its parent does (its input closes), and holds OR-Tools' memory until then.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Callable

_SERVE = ("from tensile_tf.scheduler.exact_planner import solve_pickled\n"
          "from tensile_tf.scheduler.solver_child import serve\n"
          "serve(solve_pickled)")


class SolverChild:
    """The kept child (module docstring); ``solve`` pickles in, pickles out."""

    _busy = False
    _proc: subprocess.Popen | None = None
    _owner = 0      # the process that started it (a forked copy of this one starts its own)
    started = 0     # children started in this process (a test reads it)

    @classmethod
    def solve(cls, given: str, result: str, timeout_s: float) -> None:
        """Solves the problem pickled at ``given`` into ``result`` in the kept child; raises
        RuntimeError where it failed (one that gave no answer in ``timeout_s`` is killed, and the
        next solve starts another)."""
        if cls._busy:   # another thread's solve: a child of its own, not kept
            proc = _start()
            try:
                _ask(proc, given, result, timeout_s)
            finally:
                proc.kill()
                proc.wait()
            return
        cls._busy = True
        try:
            proc = cls._kept()
            if proc is None:
                proc = cls._proc = _start()
                cls._owner, cls.started = os.getpid(), cls.started + 1
            _ask(proc, given, result, timeout_s)   # a child it killed or that ended is replaced next time
        finally:
            cls._busy = False

    @classmethod
    def _kept(cls) -> subprocess.Popen | None:
        """This process's kept child, where it is still running."""
        proc = cls._proc if cls._owner == os.getpid() else None
        return proc if proc is not None and proc.poll() is None else None

    @classmethod
    def pid(cls) -> int | None:
        """The kept child's process id (None: none is running)."""
        proc = cls._kept()
        return proc.pid if proc is not None else None


def _start() -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)


def _ask(proc: subprocess.Popen, given: str, result: str, timeout_s: float) -> None:
    """One solve in ``proc``; raises RuntimeError where it failed (a child that gave no answer in
    ``timeout_s`` is killed)."""
    try:
        proc.stdin.write((json.dumps([given, result]) + "\n").encode())
        proc.stdin.flush()
    except OSError:   # it ended before the request: its answer is read as none below
        pass
    reply = _read_line(proc, timeout_s)
    if reply is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"exact planner: its child interpreter gave no answer (exit code {proc.returncode})")
    if "error" in reply:
        raise RuntimeError(f"exact planner: its child interpreter failed: {reply['error']}")


def _read_line(proc: subprocess.Popen, timeout_s: float) -> dict | None:
    """The child's next answer, or None where it ended or ``timeout_s`` passed first."""
    fd, buf, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 1)   # byte by byte: nothing of a next answer is read ahead
        if not chunk:
            return None
        buf += chunk
    return json.loads(buf)


def serve(solve_pickled: Callable[[str, str], None]) -> None:
    """The child's side: ``solve_pickled(given, result)`` (exact_planner's) per request line,
    one answer line each."""
    import traceback

    out = sys.stdout
    sys.stdout = sys.stderr    # nothing a solve prints mixes with the answers
    for line in sys.stdin:
        given, result = json.loads(line)
        try:
            solve_pickled(given, result)
            answer = {"ok": True}
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it there
            answer = {"error": traceback.format_exc()[-2000:]}
        out.write(json.dumps(answer) + "\n")
        out.flush()
