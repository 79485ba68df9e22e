"""Every document the code, configs and docs name exists in the repository: a `docs/…` path or a `*.md` name in a
tracked .py/.yaml/.md/Makefile file resolves against the repository root, the referring file's folder or docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".yaml", ".yml", ".md"}
# `docs/<path>` (any file) or a path/name ending in .md; not part of a URL, a longer name or an absolute path
REFERENCE = re.compile(r"(?<![\w./:~$-])((?:\.\.?/)*(?:docs/[\w./-]*[\w-]|[\w./-]*[\w-]\.md)(?![\w/{*-]))")
# Files the toolkit writes or that live in other projects, not documents of this repository.
OUTPUT_NAMES = {"metrics.md", "table.md", "summary.md", "summary_val.md", "t.md", "m.md"}
OUTSIDE = {"data/README.md"}  # LLaMA-Factory's data/README (docs/toolkits.md)
OUTPUT_FOLDERS = ("runs/", "OUT/", "DIR/", "HARD_LW_RUNS/")


def tracked_files(root: Path) -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return [root / name for name in names if Path(name).suffix in SUFFIXES or Path(name).name == "Makefile"]


def is_reference(token: str) -> bool:
    name = token.rsplit("/", 1)[-1]
    if name in OUTPUT_NAMES or token in OUTSIDE or token.startswith(OUTPUT_FOLDERS):
        return False
    return token.startswith(("docs/", "./", "../")) or token.endswith(".md")


def dangling(root: Path) -> list[str]:
    """'file:line: reference' for every reference that names no file or folder of the tree under `root`."""
    found = []
    for path in tracked_files(root):
        if not path.is_file() or path == Path(__file__).resolve():  # this file's examples
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            line = line.replace('"docs" / "', "docs/")  # REPO / "docs" / "x.md" in Python
            for token in REFERENCE.findall(line):
                token = token.rstrip(".")
                if not is_reference(token):
                    continue
                if not any((base / token).exists() for base in (root, path.parent, root / "docs")):
                    found.append(f"{path.relative_to(root)}:{number}: {token}")
    return found


def test_every_referenced_document_exists():
    missing = dangling(REPO)
    assert not missing, "references to documents the repository lacks:\n" + "\n".join(missing)


def test_a_missing_page_is_caught(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("see [there](there.md) and here.md\n")
    (tmp_path / "mod.py").write_text(
        '"""Defined in docs/here.md; the rest in docs/methods/gone.md §2."""\n# writes OUT/summary.md and table.md\n'
    )
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert dangling(tmp_path) == ["docs/here.md:1: there.md", "mod.py:1: docs/methods/gone.md"]
