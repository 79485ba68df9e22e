"""Which tokens TRL trains on, for the TRL export (`python -m davir.data export --to trl`) and for davir's
`DavirSFTTrainer`, on every chat family's toy folder: the caption and its end of turn, as davir's own training
scores them — not the prompt, not the image placeholders (issue 50, item 3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.data.formats import read_dataset  # noqa: E402
from davir.data.toolkits import export_toolkit  # noqa: E402
from davir.integrations.prompts import epc_prompt_for  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAMILIES = ("qwen2_5_vl", "llava_onevision", "smolvlm", "qwen3_vl", "internvl", "gemma3")
# What each family's chat template writes between the assistant's opening and the caption (SmolVLM: "Assistant:"
# then a space before the answer). Every chat family davir registers is here.
LEAD = {"qwen2_5_vl": "", "llava_onevision": "", "smolvlm": " ", "qwen3_vl": "", "internvl": "", "gemma3": ""}


@pytest.fixture(scope="module")
def setup(synthetic_set, tmp_path_factory):
    root = synthetic_set(24, 0)
    base = tmp_path_factory.mktemp("trl_loss")
    export_toolkit("trl", "clevr_change", root, ["train"], base / "trl", prompt_for=epc_prompt_for())
    pairs = read_dataset("clevr_change", root, "train").pairs
    texts = [c for p in pairs for c in p.captions] + [EpcConfig().prompt, EpcConfig().entity_prefix]
    folders = {family: write_chat_folder(family, base / family, texts) for family in FAMILIES}
    return SimpleNamespace(base=base, folders=folders)


def _dataset(path: Path):
    from datasets import Image, Sequence, load_dataset

    return load_dataset("json", data_files={"train": str(path)})["train"].cast_column("images", Sequence(Image()))


def _caption(row: dict) -> str:
    turns = row["completion"] if "completion" in row else row["messages"][1:]
    return turns[0]["content"][0]["text"]


def _trainer(setup, family: str, dataset, cls=None, **kwargs):
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    torch.manual_seed(0)
    model = get_family(family).model_class.from_pretrained(str(setup.folders[family]))
    processor = AutoProcessor.from_pretrained(str(setup.folders[family]))
    args = SFTConfig(
        output_dir=str(setup.base / f"run_{family}"),
        max_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        max_length=None,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    return (cls or SFTTrainer)(
        model=model, args=args, train_dataset=dataset, processing_class=processor, **kwargs
    ), processor


def _labelled(batch, row: int) -> list[int]:
    labels = batch["labels"][row]
    return labels[labels != -100].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_trl_trains_on_the_caption_of_the_export(setup, family):
    """TRL's own SFTTrainer and vision collator on the export: the loss is on the caption, the end of turn and the
    newline the template writes after it — 10 of the 69-166 tokens of a sample, none of them an image placeholder
    (with `messages`, every token: 86, 166 and 71)."""
    dataset = _dataset(setup.base / "trl" / "train.jsonl")
    trainer, processor = _trainer(setup, family, dataset)
    tokenizer, end = processor.tokenizer, get_family(family).end_of_turn
    rows = [dataset[0], dataset[1]]
    batch = trainer.data_collator([dict(row) for row in rows])
    for number, row in enumerate(rows):
        caption = tokenizer(LEAD[family] + _caption(row), add_special_tokens=False)["input_ids"]
        expected = caption + tokenizer(end + "\n", add_special_tokens=False)["input_ids"]
        assert _labelled(batch, number) == expected and len(expected) == len(caption) + 2 == 10
        assert int(batch["attention_mask"][number].sum()) > 65  # the prompt and both pictures are in the input


@pytest.mark.parametrize("family", FAMILIES)
def test_davir_sft_trainer_trains_on_caption_and_end_of_turn(setup, family, tmp_path):
    """DavirSFTTrainer: the caption and its end of turn, exactly as davir's own training — for the export and for
    a `messages` dataset (the form of earlier exports) alike."""
    from davir.integrations.trl import DavirSFTTrainer, DavirTrlSettings

    rows = [json.loads(line) for line in (setup.base / "trl" / "train.jsonl").read_text().splitlines()[:2]]
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(
            json.dumps({"id": r["id"], "images": r["images"], "messages": r["prompt"] + r["completion"]}) + "\n"
            for r in rows
        )
    )
    for path in (setup.base / "trl" / "train.jsonl", messages):
        dataset = _dataset(path)
        trainer, processor = _trainer(
            setup, family, dataset, DavirSFTTrainer, davir=DavirTrlSettings(family=family, image_size=64)
        )
        tokenizer = processor.tokenizer
        end = tokenizer.convert_tokens_to_ids(get_family(family).end_of_turn)
        batch = trainer.data_collator([dataset[0], dataset[1]])
        for number in range(2):
            caption = tokenizer(LEAD[family] + _caption(dataset[number]), add_special_tokens=False)["input_ids"]
            assert _labelled(batch, number) == caption + [end] and len(caption) == 8


def test_every_registered_chat_family_is_checked_here_and_in_the_command_path():
    from davir.models.families import FAMILIES as REGISTERED
    from tests.test_family_commands import CHAT_FAMILIES

    chat = {name for name in REGISTERED.names() if name != "instructblip"}
    assert set(FAMILIES) == chat == set(CHAT_FAMILIES) == set(LEAD)
