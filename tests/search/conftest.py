"""Helpers for search tests: the CLI in a subprocess (its own pool), search
YAML files, and a throwaway PostgreSQL server for multi-worker tests."""
import glob
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, install_runtime
from tests.forkserver import run_fresh

install_runtime()  # in-process drivers train real jobs: the pool before any TF op


def cli_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["COLUMNS"] = "200"
    return env


def search_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "tensile_tf", "search", *map(str, args)]


def run_search_cli(*args, timeout=240) -> subprocess.CompletedProcess:
    # forked from an interpreter that imported TensorFlow (Note [Children forked from one import] in tests/forkserver.py)
    return run_fresh(search_cmd(*args)[1:], env=cli_env(), cwd=REPO_ROOT, timeout=timeout)


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def explain(proc) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-4000:]}"


# ------------------------------------------------------------ PostgreSQL

def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _install_postgres() -> str | None:
    """apt-get install postgresql; None on success, else why not."""
    if os.geteuid() != 0:
        return "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
    if shutil.which("apt-get") is None:
        return "PostgreSQL is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}"
    return None


def _ensure_psycopg2() -> str | None:
    try:
        import psycopg2  # noqa: F401
        return None
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "psycopg2-binary"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return f"psycopg2 is missing and `pip install psycopg2-binary` failed: {proc.stderr.strip()[-500:]}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory):
    """A PostgreSQL server on 127.0.0.1:<free port> with its data in a temp
    dir, run as an unprivileged user (the package's `postgres` user when we
    are root); yields a SQLAlchemy URL; stops the server afterwards."""
    why = _ensure_psycopg2()
    if why:
        pytest.skip(why)
    if _pg_bin() is None:
        why = _install_postgres()
        if why:
            pytest.skip(why)
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL was installed but initdb was not found under /usr/lib/postgresql")
    root = tmp_path_factory.mktemp("pg")
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = "postgres"
        try:
            import pwd
            pw = pwd.getpwnam(user)
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        os.chmod(root, 0o755)
        os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chown(sock, pw.pw_uid, pw.pw_gid)
        for parent in list(root.parents)[:-1]:  # the server user must reach its data dir
            try:
                os.chmod(parent, os.stat(parent).st_mode | 0o005)
            except PermissionError:
                pass
        prefix = ["runuser", "-u", user, "--"]
    port = _free_port()

    def pg(*cmd, check=True):
        proc = subprocess.run(prefix + [str(bindir / cmd[0]), *cmd[1:]], capture_output=True, text=True,
                              timeout=120)
        if check and proc.returncode != 0:
            pytest.skip(f"{cmd[0]} failed: {proc.stderr.strip()[-800:]}")
        return proc

    pg("initdb", "-D", str(data), "-A", "trust", "-U", "tensile", "--no-sync")
    log = root / "server.log"
    if prefix:
        subprocess.run(prefix + ["touch", str(log)], check=False)
    pg("pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o",
       f"-p {port} -h 127.0.0.1 -k {sock} -c fsync=off", "start")
    try:
        pg("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "tensile", "search")
        url = f"postgresql+psycopg2://tensile@127.0.0.1:{port}/search"
        deadline = time.time() + 30
        import sqlalchemy
        while True:
            try:
                sqlalchemy.create_engine(url).connect().close()
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        yield url
    finally:
        pg("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop", check=False)
