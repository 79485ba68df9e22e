"""The layers stay as docs/architecture.md draws them: read from the code's own imports (AST, every import
statement, also those inside functions), so a shortcut taken anywhere fails here. The layer order is the table
in docs/architecture.md ("Layers"), parsed here: a package may import only packages of a lower layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGES = ("davir",)
SCRIPTS = ("train", "evaluate", "caption")
# The repository's entry to the jobs (`python -m preprocess`), a package treated like the scripts: not installed.
ENTRIES = ("preprocess",)
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES + ENTRIES:
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
    offenders = [
        f"{name} imports {target}"
        for name, targets in IMPORTS.items()
        if name.split(".")[0] == "davir"
        for target in sorted(targets)
        if target.split(".")[0] in (*ENTRIES, *SCRIPTS)
    ]
    assert not offenders, "davir/ must stand alone (docs/architecture.md):\n" + "\n".join(offenders)


def test_jobs_do_not_import_scripts():
    offenders = [
        f"{name} imports {target}"
        for name, targets in IMPORTS.items()
        if name.startswith("davir.jobs")
        for target in sorted(targets)
        if target.split(".")[0] in (*ENTRIES, *SCRIPTS)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_jobs_entry_is_thin():
    """preprocess/ only hands its command line to davir.cli.preprocess, as train.py does to davir.cli.train."""
    assert sorted(name for name in MODULES if name.split(".")[0] in ENTRIES) == ["preprocess", "preprocess.__main__"]
    assert IMPORTS["preprocess.__main__"] == {"davir.cli.preprocess"} and IMPORTS["preprocess"] == set()
    code = [line for line in MODULES["preprocess.__main__"].read_text().splitlines() if line.strip()]
    assert len(code) <= 10, code


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other through a chain of any length (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(imports.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in imports.get(node, ()):
                cycles.append(sorted(group))

    for node in sorted(imports):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle_of_any_length():
    cycles = import_cycles(IMPORTS)
    assert not cycles, "modules importing each other (through a chain):\n" + "\n".join(" -> ".join(c) for c in cycles)


def read_layers(text: str) -> dict[str, int]:
    """{package: layer} from the table under "## Layers" in docs/architecture.md (`| N | `pkg`, `pkg` | … |`)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for package in re.findall(r"`([\w.]+)`", cells[1]):
                layers[package] = int(cells[0])
    return layers


LAYERS = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))
# Entry points sit above everything they start: the scripts, `python -m` modules, the top package's lazy re-export.
ENTRY_POINTS = {"davir"}


def layer_of(module: str) -> tuple[str, int] | None:
    """The table's entry for a module: its longest listed prefix (`davir.io`, `davir.data`, `preprocess`, `train`)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return prefix, LAYERS[prefix]
    return None


def test_every_package_has_a_layer():
    missing = sorted(
        {
            name.split(".")[0] if name.split(".")[0] != "davir" else ".".join(name.split(".")[:2])
            for name in MODULES
            if name not in ENTRY_POINTS and layer_of(name) is None
        }
    )
    assert not missing, f"add these to the Layers table of docs/architecture.md: {missing}"


def layer_breaches(imports: dict[str, set[str]]) -> list[str]:
    breaches = []
    for name, targets in imports.items():
        if name in ENTRY_POINTS or name.endswith(".__main__") or layer_of(name) is None:
            continue
        own, rank = layer_of(name)
        for target in sorted(targets):
            found = layer_of(target)
            if found is None:
                continue
            other, other_rank = found
            if other != own and other_rank >= rank:
                breaches.append(f"{name} (layer {rank}, {own}) imports {target} (layer {other_rank}, {other})")
    return breaches


def test_imports_follow_the_layer_order():
    breaches = layer_breaches(IMPORTS)
    assert not breaches, "imports against the layer order of docs/architecture.md:\n" + "\n".join(breaches)


def climbs_out(line: str, parts: int) -> bool:
    """Whether a line builds a path from `__file__` above the top package of a file `parts` path parts deep
    (davir/x/y.py: parents[1] is davir/, parents[2] the folder holding it)."""
    if "__file__" not in line:
        return False
    ups = [int(k) for k in re.findall(r"parents\[(\d+)\]", line)]
    if ".parent" in line and "parents[" not in line:
        ups.append(len(re.findall(r"\.parent\b", line)) - 1)
    return any(k >= parts - 1 for k in ups)


def test_no_path_leaves_the_package():
    """A file found next to the package (configs/, assets/ of the repository) is missing from an installed wheel."""
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for name, path in MODULES.items()
        if name.split(".")[0] in PACKAGES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if climbs_out(line, len(path.relative_to(REPO).parts))
    ]
    assert not offenders, "paths outside the package (ship it as package data or take it as a setting):\n" + "\n".join(
        offenders
    )
    assert climbs_out('X = Path(__file__).resolve().parents[2] / "configs"', 3)
    assert not climbs_out('X = Path(__file__).resolve().parents[1] / "configs"', 3)
    assert climbs_out("X = Path(__file__).parent.parent.parent", 3)


def test_data_error_comes_from_davir_errors():
    """One home for the toolkit's exceptions: `from davir.errors import DataError`, never through another module."""
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module != "davir.errors"
                and any(alias.name in ("DataError", "OutputError") for alias in node.names)
            ):
                offenders.append(f"{name}: from {node.module} import DataError")
    assert not offenders, "\n".join(offenders)


def test_scripts_are_thin():
    for script in SCRIPTS:
        code = [line for line in MODULES[script].read_text().splitlines() if line.strip()]
        assert len(code) <= 30, f"{script}.py should parse arguments and call one davir function ({len(code)} lines)"


@pytest.mark.parametrize("package", ["davir"])
def test_modules_hold_one_idea(package):
    """A proxy the architecture page asks for: no module under davir/ over ~500 lines."""
    long = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        if name.split(".")[0] == package and len(path.read_text().splitlines()) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split along their ideas): {long}"


def test_the_checker_sees_a_planted_cycle(tmp_path, monkeypatch):
    """The import reader itself: a mutual import and a library→entry import are found."""
    (tmp_path / "a.py").write_text("def f():\n    from davir.b import g\n")
    (tmp_path / "b.py").write_text("from davir import a\nimport preprocess.__main__\n")
    monkeypatch.setitem(MODULES, "davir.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "davir.b", tmp_path / "b.py")
    imports_a = imported_modules("davir.a", tmp_path / "a.py")
    imports_b = imported_modules("davir.b", tmp_path / "b.py")
    assert imports_a == {"davir.b"}
    assert imports_b == {"davir.a", "preprocess.__main__"}


def test_the_checkers_see_a_long_cycle_and_a_climb():
    """A three-module cycle is one group; a lower layer importing a higher one is named with both layers."""
    chain = {"davir.x": {"davir.y"}, "davir.y": {"davir.z"}, "davir.z": {"davir.x"}, "davir.w": {"davir.x"}}
    assert import_cycles(chain) == [["davir.x", "davir.y", "davir.z"]]
    assert import_cycles({"davir.x": {"davir.y"}, "davir.y": set()}) == []
    climb = layer_breaches(
        {"davir.data.records": {"davir.training.loop"}, "davir.training.loop": {"davir.data.records"}}
    )
    assert len(climb) == 1 and climb[0].startswith("davir.data.records (layer")
    assert read_layers(
        "\n## Layers\n| 1 | `davir.a`, `davir.b` | x |\n| 2 | `davir.c` | y |\n## Next\n| 9 | `z` |"
    ) == {"davir.a": 1, "davir.b": 1, "davir.c": 2}


def _names_in(package: str, pattern: str) -> dict[str, str]:
    """{registered name: module} for every `pattern` match (a regex with one group) in the package's modules."""
    found = {}
    for name, path in MODULES.items():
        if name.startswith(package + "."):
            for match in re.finditer(pattern, path.read_text(encoding="utf-8")):
                found[match.group(1)] = name
    return found


def test_every_registry_holds_what_its_package_defines():
    """A reader, captioner, segmenter or retriever written in its package is reachable by name: each registry is
    complete once its package is imported (a module left out of an import line fails here, not for a user)."""
    from davir.data.formats import FORMATS
    from davir.models.lightweight.registry import METHODS
    from davir.preprocessing.retrievers import RETRIEVERS
    from davir.preprocessing.segmenters import SEGMENTERS
    from davir.training.tasks import TASK_MODULES, registered_methods

    formats = _names_in("davir.data.formats", r'@register_format\("(\w+)"')
    assert set(formats) == set(FORMATS) and len(formats) >= 6, (formats, sorted(FORMATS))
    methods = _names_in("davir.models.lightweight", r'@register_method\("(\w+)"')
    assert set(methods) == set(METHODS) >= {"subtraction", "scorer", "dirl", "rdd", "cheer"}
    segmenters = _names_in("davir.preprocessing.segmenters", r'\n    name = "(\w+)"')
    assert set(segmenters) == set(SEGMENTERS) >= {"classical", "sam"}
    retrievers = _names_in("davir.preprocessing.retrievers", r'\n    name = "(\w+)"')
    assert set(retrievers) == set(RETRIEVERS) >= {"clip", "fitted"}
    task_modules = set(_names_in("davir.training", r"(?s)^(.*\n@register_task(?:_family)?\()").values())
    assert task_modules == set(TASK_MODULES), (task_modules, TASK_MODULES)
    assert set(registered_methods()) >= {"davir", *METHODS}
