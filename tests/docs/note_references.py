"""Where each ``Note [Name]`` is written, and which references to one name a
file that does not hold it ("Note [Plan order] in tensile_tf/tf/rewrite/
rewriter.py", or the module's dotted name). Pure text: no import."""
from __future__ import annotations

import re
from pathlib import Path

SOURCE_SUFFIXES = {".py", ".h", ".cc", ".md"}
SKIPPED = ("benchmarks/history/", ".git/")
# A note is written where its name starts a line, alone or followed by ":" or ". " and its text
# (docstrings, comments, "// Note [..]").
DEFINITION = re.compile(r"^\s*(?:#|//|\*)?\s*Note \[([^\]]+)\](?:[:.](?:\s.*)?)?\s*$", re.M)
# "Note [A] in path", "Notes [A], [B] in path", "(Note [A]) in path", "Note [A] (path)"
REFERENCE = re.compile(
    r"Notes?\s+((?:\[[^\]]+\][,\s]*(?:and\s+)?)+)\)?\s*(?:in|\()\s*`{0,2}"
    r"((?:tensile_tf|tf_plugin|benchmarks|tests)[\w/.]*[\w])`{0,2}")


def files(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.suffix in SOURCE_SUFFIXES and p.is_file()
            and not any(s in p.relative_to(root).as_posix() for s in SKIPPED)]


def definitions(root: Path) -> dict[str, set[str]]:
    """note name -> the files that write it (paths relative to root)."""
    found: dict[str, set[str]] = {}
    for p in files(root):
        if p.relative_to(root).parts[0] == "tests":
            continue   # tests cite notes ("# Note [X]: ..."); the code writes them
        for name in DEFINITION.findall(p.read_text(errors="replace")):
            found.setdefault(" ".join(name.split()), set()).add(p.relative_to(root).as_posix())
    return found


def target_files(root: Path, where: str) -> list[str]:
    """The files a reference's place names: a path (file or folder) or a dotted module."""
    candidates = [where] if "/" in where else [where.replace(".", "/") + ".py", where.replace(".", "/")]
    out = []
    for c in candidates:
        p = root / c.rstrip("/")
        if p.is_file():
            out.append(p.relative_to(root).as_posix())
        elif p.is_dir():
            out.extend(q.relative_to(root).as_posix() for q in files(p))
        elif (root / (c.rstrip("/") + "/__init__.py")).is_file():
            out.extend(q.relative_to(root).as_posix() for q in files(root / c.rstrip("/")))
    return out


def broken_references(root: Path) -> list[tuple[str, str, str, set[str]]]:
    """(file, note, place named, files that do write the note) for each
    reference whose place does not hold the note."""
    defs = definitions(root)
    broken = []
    for p in files(root):
        text = p.read_text(errors="replace")
        for names, where in REFERENCE.findall(text):
            targets = set(target_files(root, where))
            for name in re.findall(r"\[([^\]]+)\]", names):
                name = " ".join(name.split())
                if name not in defs:
                    continue   # a note of another project (TensorFlow's) or a name in prose
                if not targets & defs[name]:
                    broken.append((p.relative_to(root).as_posix(), name, where, defs[name]))
    return broken
