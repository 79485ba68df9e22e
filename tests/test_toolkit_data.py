"""Datasets for LLaMA-Factory, ms-swift and TRL both ways (`python -m davir.data export --to …`, `import --from …`):
the synthetic set's splits go out and come back as the same pairs, captions and splits; each file follows its
toolkit's schema (docs/toolkits.md cites them), the EPC phrase comes from an entity cache, and TRL reads its export
with its own dataset code (datasets' JSON loader, TRL's vision collator, a Qwen2.5-VL processor)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from davir.cli.data import main as data_main  # noqa: E402
from davir.data.caches import EntityCache  # noqa: E402
from davir.data.formats import read_dataset  # noqa: E402
from davir.data.toolkits import TOOLKITS  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SPLITS = ("train", "val", "test")
PROMPT = EpcConfig().prompt


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo(synthetic_set):
    return synthetic_set(24, 0)


@pytest.fixture(scope="module")
def exported(demo, tmp_path_factory):
    """Every split of the demo set exported once to each toolkit format."""
    base = tmp_path_factory.mktemp("toolkit_exports")
    for toolkit in TOOLKITS:
        assert (
            data_main(
                [
                    "export",
                    "--to",
                    toolkit,
                    "--format",
                    "clevr_change",
                    "--root",
                    str(demo),
                    "--out",
                    str(base / toolkit),
                    "--name",
                    "demo",
                ]
            )
            == 0
        )
    return base


@pytest.mark.parametrize("toolkit", TOOLKITS)
def test_export_then_import_gives_the_same_pairs(demo, exported, tmp_path, toolkit, capsys):
    assert (
        data_main(
            ["import", str(exported / toolkit), "--from", toolkit, "--out", str(tmp_path / "back"), "--allow-outside"]
        )
        == 0
    )  # the export names the dataset's images by absolute paths
    assert "imported" in capsys.readouterr().out
    back = {row["id"]: row for row in _rows(tmp_path / "back" / "pairs.jsonl")}
    original = {pair.pair_id: pair for split in SPLITS for pair in read_dataset("clevr_change", demo, split).pairs}
    assert set(back) == set(original) and len(original) > 30
    for pair_id, pair in original.items():
        row = back[pair_id]
        assert (row["before"], row["after"]) == (str(pair.before.resolve()), str(pair.after.resolve()))
        assert tuple(row["captions"]) == pair.captions and row["split"] == pair.split
    # the imported folder reads back as a davir dataset with the same records per split
    for split in SPLITS:
        folder = read_dataset("folder", tmp_path / "back", split).pairs
        assert [(p.pair_id, p.captions) for p in folder] == [
            (p.pair_id, p.captions) for p in read_dataset("clevr_change", demo, split).pairs
        ]
    # one sample per reference caption, before image first
    summary = json.loads((exported / toolkit / "davir_export.json").read_text())
    train_captions = sum(len(p.captions) for p in original.values() if p.split == "train")
    assert summary["splits"]["train"]["samples"] == train_captions


def test_llamafactory_records_and_dataset_info(exported, demo):
    """LLaMA-Factory's multimodal ShareGPT form (its data/README and data/mllm_demo.json): OpenAI roles under
    `messages`, one `<image>` per entry of `images`, and a dataset_info.json entry naming the file and columns."""
    folder = exported / "llamafactory"
    info = json.loads((folder / "dataset_info.json").read_text())
    assert set(info) == {f"davir_demo_{split}" for split in SPLITS}
    entry = info["davir_demo_train"]
    assert entry == {
        "file_name": "train.jsonl",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
    pair = read_dataset("clevr_change", demo, "train").pairs[0]
    first = _rows(folder / "train.jsonl")[0]
    assert first == {
        "id": pair.pair_id,
        "images": [str(pair.before.resolve()), str(pair.after.resolve())],
        "messages": [
            {"role": "user", "content": "<image><image>" + PROMPT},
            {"role": "assistant", "content": pair.captions[0]},
        ],
    }
    for row in _rows(folder / "test.jsonl"):
        assert row["messages"][0]["content"].count("<image>") == len(row["images"]) == 2


def test_swift_records(exported, demo):
    """ms-swift's standard `messages` + `images` (its Custom Dataset page): `<image>` tags in the user turn."""
    pair = read_dataset("clevr_change", demo, "val").pairs[0]
    first = _rows(exported / "swift" / "val.jsonl")[0]
    assert first["messages"] == [
        {"role": "user", "content": "<image><image>" + PROMPT},
        {"role": "assistant", "content": pair.captions[0]},
    ]
    assert first["images"] == [str(pair.before.resolve()), str(pair.after.resolve())] and first["id"] == pair.pair_id
    assert not (exported / "swift" / "dataset_info.json").exists()


def test_epc_phrase_from_an_entity_cache(demo, tmp_path, capsys):
    pairs = read_dataset("clevr_change", demo, "test").pairs
    cache = EntityCache(tmp_path / "entities")
    cache.write_part("0", {pair.pair_id: [["small red cube", 0.9], ["large sphere", 0.5]] for pair in pairs[1:]})
    argv = [
        "export",
        "--to",
        "trl",
        "--format",
        "clevr_change",
        "--root",
        str(demo),
        "--split",
        "test",
        "--entities",
        str(tmp_path / "entities"),
        "--out",
        str(tmp_path / "trl"),
    ]
    # a pair the cache lacks: one line naming the command that makes the cache, nothing half-written
    assert data_main(argv) == 2
    assert "python -m preprocess entities" in capsys.readouterr().err
    assert not (tmp_path / "trl" / "test.jsonl").exists()
    cache.write_part("1", {pairs[0].pair_id: [["small red cube", 0.9]]})
    assert data_main([*argv, "--num-entities", "2"]) == 0
    rows = _rows(tmp_path / "trl" / "test.jsonl")
    texts = {row["prompt"][0]["content"][2]["text"] for row in rows}
    assert texts == {f"{PROMPT} Entity: small red cube.", f"{PROMPT} Entity: small red cube, large sphere."}
    assert [part["type"] for part in rows[0]["prompt"][0]["content"]] == ["image", "image", "text"]


def test_import_names_a_broken_record(exported, tmp_path, capsys):
    rows = _rows(exported / "swift" / "train.jsonl")
    rows[3]["images"] = rows[3]["images"][:1]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # that row is skipped and named, the others imported: exit 1 (docs/errors.md, toolkit datasets)
    assert (
        data_main(
            [
                "import",
                str(tmp_path / "train.jsonl"),
                "--from",
                "swift",
                "--out",
                str(tmp_path / "o"),
                "--allow-outside",
            ]
        )
        == 1
    )
    assert (
        f"skipped: {tmp_path / 'train.jsonl'}: line 4: 'images' must list two images, before then after "
        "(1 given)\n" in capsys.readouterr().err
    )
    assert len(_rows(tmp_path / "o" / "pairs.jsonl")) == len({row["id"] for row in rows if row is not rows[3]})
    assert (
        data_main(
            [
                "export",
                "--to",
                "trl",
                "--format",
                "clevr_change",
                "--root",
                str(tmp_path),
                "--split",
                "all",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_trl_reads_its_export_with_its_own_dataset_code(exported, demo, tmp_path):
    """datasets' JSON loader + TRL's vision collator and message preparation, with a Qwen2.5-VL processor: two
    pictures per sample (before, after), both in the user turn before the prompt, the caption in the labels."""
    from datasets import Image, Sequence, load_dataset
    from family_fixtures import write_chat_folder
    from transformers import AutoProcessor
    from trl.data_utils import is_conversational, prepare_multimodal_messages
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    dataset = load_dataset("json", data_files={"train": str(exported / "trl" / "train.jsonl")})["train"]
    dataset = dataset.cast_column("images", Sequence(Image()))
    pairs = read_dataset("clevr_change", demo, "train").pairs
    assert len(dataset) == sum(len(p.captions) for p in pairs) and is_conversational(dataset[0])
    example = dataset[0]
    assert example["id"] == pairs[0].pair_id and [im.size for im in example["images"]] == [(96, 72), (96, 72)]
    prepared = prepare_multimodal_messages(example["prompt"], images=example["images"])
    assert [part["type"] for part in prepared[0]["content"]] == ["image", "image", "text"]
    assert prepared[0]["content"][0]["image"] is example["images"][0]

    folder = write_chat_folder("qwen2_5_vl", tmp_path / "qwen", [c for p in pairs for c in p.captions] + [PROMPT])
    processor = AutoProcessor.from_pretrained(str(folder))
    batch = DataCollatorForVisionLanguageModeling(processor)([dataset[0], dataset[5]])
    assert batch["image_grid_thw"].shape[0] == 4  # two pictures per sample
    start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert (batch["input_ids"] == start).sum(dim=1).tolist() == [2, 2]
    text = processor.tokenizer.decode(batch["input_ids"][0])
    assert text.index("<|vision_end|>") < text.index(PROMPT) < text.index(pairs[0].captions[0])
