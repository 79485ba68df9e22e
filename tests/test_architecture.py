"""The layers stay as docs/architecture.md draws them: read from the code's own imports (AST, every import
statement, also those inside functions), so a shortcut taken anywhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("davir", "preprocess")
SCRIPTS = ("train", "evaluate", "caption")
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            modules[module_name(path)] = path
    for script in SCRIPTS:
        modules[script] = REPO / f"{script}.py"
    return modules


MODULES = all_modules()


def imported_modules(name: str, path: Path) -> set[str]:
    """The project modules `name` imports: `from a.b import c` counts a.b.c when c is a module, else a.b."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            # `import davir.data.images` also names its parents; the innermost known module is what is used
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


IMPORTS = {name: imported_modules(name, path) for name, path in MODULES.items()}


def test_library_imports_neither_jobs_nor_scripts():
    offenders = [f"{name} imports {target}" for name, targets in IMPORTS.items() if name.split(".")[0] == "davir"
                 for target in sorted(targets) if target.split(".")[0] in ("preprocess", *SCRIPTS)]
    assert not offenders, "davir/ must stand alone (docs/architecture.md):\n" + "\n".join(offenders)


def test_jobs_do_not_import_scripts():
    offenders = [f"{name} imports {target}" for name, targets in IMPORTS.items() if name.split(".")[0] == "preprocess"
                 for target in sorted(targets) if target in SCRIPTS]
    assert not offenders, "\n".join(offenders)


def test_no_two_modules_import_each_other():
    pairs = sorted({tuple(sorted((a, b))) for a, targets in IMPORTS.items() for b in targets if a in IMPORTS.get(b, ())})
    assert not pairs, "modules importing each other:\n" + "\n".join(f"{a} <-> {b}" for a, b in pairs)


def test_scripts_are_thin():
    for script in SCRIPTS:
        code = [line for line in MODULES[script].read_text().splitlines() if line.strip()]
        assert len(code) <= 30, f"{script}.py should parse arguments and call one davir function ({len(code)} lines)"


@pytest.mark.parametrize("package", ["davir"])
def test_modules_hold_one_idea(package):
    """A proxy the architecture page asks for: no module under davir/ over ~500 lines."""
    long = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()
            if name.split(".")[0] == package and len(path.read_text().splitlines()) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split along their ideas): {long}"


def test_the_checker_sees_a_planted_cycle(tmp_path, monkeypatch):
    """The import reader itself: a mutual import and a library→job import are found."""
    (tmp_path / "a.py").write_text("def f():\n    from davir.b import g\n")
    (tmp_path / "b.py").write_text("from davir import a\nimport preprocess.masks\n")
    monkeypatch.setitem(MODULES, "davir.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "davir.b", tmp_path / "b.py")
    imports_a = imported_modules("davir.a", tmp_path / "a.py")
    imports_b = imported_modules("davir.b", tmp_path / "b.py")
    assert imports_a == {"davir.b"}
    assert imports_b == {"davir.a", "preprocess.masks"}
