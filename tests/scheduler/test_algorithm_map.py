"""ALGORITHMS.md maps each seed algorithm to a file and symbol; every row
must name a file that exists and symbols defined in it (read as text, so the
check stays pure and covers the C++ headers too)."""
import re

from tests.conftest import REPO_ROOT


def _rows():
    text = (REPO_ROOT / "ALGORITHMS.md").read_text()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`"):
            yield cells


def _defined(source: str, symbol: str) -> bool:
    parts = re.split(r"\.|::", symbol)
    name = parts[-1]
    patterns = [rf"^\s*(def|class)\s+{name}\b", rf"\b{name}\s*\(", rf"^\s*class\s+{name}\b"]
    if len(parts) > 1:  # a method: its class must be there too
        if not re.search(rf"\b(class|struct)\s+{parts[0]}\b", source, re.M):
            return False
    return any(re.search(p, source, re.M) for p in patterns)


def test_every_algorithm_row_names_an_existing_symbol():
    rows = list(_rows())
    assert len(rows) >= 20
    for seed, algorithm, file_cell, symbol_cell in rows:
        path = REPO_ROOT / file_cell.strip("`")
        assert path.exists(), (algorithm, path)
        source = path.read_text()
        for symbol in re.findall(r"`([^`]+)`", symbol_cell):
            assert _defined(source, symbol), f"{algorithm}: {symbol} not defined in {path}"


def test_the_check_itself_can_fail():
    assert not _defined("def other():\n    pass\n", "swap_scheduling")
    assert not _defined("class Planner:\n    def plan(self): ...\n", "Missing.plan")
