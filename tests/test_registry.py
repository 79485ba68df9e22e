"""davir.registry.Registry: the one registry idiom (call or decorator, lazy modules, errors naming the choices)."""

from __future__ import annotations

import sys
import types

import pytest

from davir.errors import DataError
from davir.registry import Registry, import_modules


def test_register_by_call_and_decorator_keeps_order_and_refuses_a_second_entry():
    things = Registry("thing")
    things.register("b", 2)

    @things.register("a")
    class A:
        pass

    assert things.names() == ("b", "a") and things["a"] is A and things["b"] == 2 and len(things) == 2
    things.register("a", A)  # the same object again: a no-op (a module imported twice)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.register("a", 3)
    things.register("a", 3, replace=True)
    assert things["a"] == 3
    things.unregister("a")
    assert "a" not in things and things.get("a", "none") == "none"


def test_unknown_name_raises_the_registry_error_naming_every_choice():
    things = Registry("model family", error=ValueError, lazy={"x": "nowhere.x"})
    things.register("y", 1)
    with pytest.raises(ValueError, match=r"unknown model family 'z'; choose from x, y"):
        things["z"]
    with pytest.raises(ValueError, match=r"model.family='z' is not a registered model family; choose from x, y"):
        things.check("z", key="model.family")
    assert things.check("x") == "x"
    with pytest.raises(DataError):
        Registry("reader")["nope"]


def test_a_lazy_entry_imports_its_module_only_when_asked(monkeypatch):
    things = Registry("thing", lazy={"late": "davir_test_lazy_module"})
    imported = []

    def exec_module():
        imported.append(True)
        things.register("late", "the entry")

    module = types.ModuleType("davir_test_lazy_module")

    class Loader:
        @staticmethod
        def create_module(spec):
            return module

        @staticmethod
        def exec_module(mod):
            exec_module()

    import importlib.util

    class Finder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "davir_test_lazy_module":
                return importlib.util.spec_from_loader(name, Loader)
            return None

    monkeypatch.setattr(sys, "meta_path", [Finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "davir_test_lazy_module", raising=False)
    assert things.names() == ("late",) and "late" in things and imported == []
    assert things["late"] == "the entry" and imported == [True]
    assert things.items() == [("late", "the entry")]


def test_a_lazy_module_that_forgets_to_register_is_named():
    things = Registry("thing", lazy={"json_thing": "json"})
    with pytest.raises(ImportError, match="json did not register thing 'json_thing'"):
        things["json_thing"]


def test_import_modules_names_the_module_a_config_could_not_import():
    import_modules(["json"], key="imports")
    with pytest.raises(DataError, match=r"imports: cannot import 'no_such_module_davir'"):
        import_modules(["no_such_module_davir"], key="imports")


def test_a_dataset_reader_is_one_function_and_one_registration(tmp_path):
    """A toy format (a tab-separated before/after/caption file per split) registered here: read_dataset, the stats
    and the image check of `davir.data` take it by name, with the split names it declares."""
    import numpy as np
    from PIL import Image

    from davir.data.formats import FORMATS, read_dataset, register_format
    from davir.data.records import ChangePair, DatasetIndex
    from davir.data.stats import dataset_stats
    from davir.data.verify import verify_dataset

    @register_format("toy_tsv", splits=("train", "test"))
    def read_toy_tsv(root, split):
        rows = [line.split("\t") for line in (root / f"{split}.tsv").read_text().splitlines()]
        return DatasetIndex(
            "toy_tsv",
            root,
            split,
            [ChangePair(f"{split}-{n}", root / b, root / a, (c,), split) for n, (b, a, c) in enumerate(rows)],
        )

    try:
        for name in ("a.png", "b.png"):
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name)
        (tmp_path / "test.tsv").write_text("a.png\tb.png\tthe cube moved\na.png\tmissing.png\tnothing changed\n")
        (tmp_path / "train.tsv").write_text("a.png\tb.png\ta ball appeared\n")
        index = read_dataset("toy_tsv", tmp_path, "test")
        assert [p.captions for p in index.pairs] == [("the cube moved",), ("nothing changed",)]
        assert FORMATS["toy_tsv"].splits == ("train", "test") and "toy_tsv" in FORMATS
        with pytest.raises(DataError, match="format 'toy_tsv' has no split 'val'; choose from train, test"):
            read_dataset("toy_tsv", tmp_path, "val")
        stats = dataset_stats("toy_tsv", tmp_path)
        assert {split: stats["splits"][split]["pairs"] for split in stats["splits"]} == {"train": 1, "test": 2}
        checks = {check.split: check for check in verify_dataset("toy_tsv", tmp_path)}
        assert set(checks) == {"train", "test"}
        assert [problem for problem in checks["test"].problems] and not checks["train"].problems
    finally:
        FORMATS.unregister("toy_tsv")
    with pytest.raises(DataError, match="unknown dataset format 'toy_tsv'"):
        read_dataset("toy_tsv", tmp_path, "test")
