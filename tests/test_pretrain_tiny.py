"""The tiny-checkpoint pretraining (davir.pretrain_tiny) and the synthetic caption parser (davir.metrics.synthetic)."""

from __future__ import annotations

import json

import pytest
import torch

from davir.cli.pretrain_tiny import main
from davir.data.synthetic import (
    CHANGE_TEMPLATES,
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
    SynthConfig,
    generate_dataset,
    load_scenes,
)
from davir.errors import DataError
from davir.metrics.synthetic import (
    PairTruth,
    format_synthetic_table,
    pair_truths,
    parse_caption,
    parse_object_phrase,
    score_synthetic,
)
from davir.models.tokenizer import build_word_tokenizer
from davir.models.vlm.build import build_davir_model
from davir.models.vlm.config import DavirModelConfig
from davir.pretrain_tiny import (
    CHANGE_PROMPT,
    INFO_FILE,
    LAST_FOLDER,
    EntityNoise,
    SceneTensors,
    add_language_layers,
    build_tiny_model,
    change_type_weights,
    description_loss,
    noisy_entities,
    sample_change_batch,
    save_checkpoint,
    vocabulary_texts,
)

RED_BALL = {"size": "small", "color": "red", "material": "metal", "shape": "sphere"}


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    generate_dataset(root, SynthConfig(scenes=10, seed=3, width=128, height=96), workers=1)
    return root


# ----------------------------------------------------------------------------------------------- caption parser


@pytest.mark.parametrize("change_type", sorted(CHANGE_TEMPLATES))
def test_every_template_parses_back_with_synonyms(change_type):
    new = "blue" if change_type == "color" else "rubber"
    for template in CHANGE_TEMPLATES[change_type]:
        for phrase in ("small red metal sphere", "tiny red shiny ball", "small red metallic sphere"):
            parsed = parse_caption(template.format(obj=phrase, new=new))
            assert parsed.change_type == change_type, template
            assert parsed.attributes == RED_BALL, template
            if change_type in ("color", "material"):
                assert parsed.new == new


def test_no_change_captions_and_punctuation():
    for caption in NO_CHANGE_CAPTIONS:
        assert parse_caption(caption.capitalize() + " .").change_type == "none"
    # "has been moved" also fits "the {obj} moved" with obj = "... has been": the valid object reading wins.
    parsed = parse_caption("The big gray matte block has been moved.")
    assert parsed.change_type == "move"
    assert parsed.attributes == {"size": "large", "color": "gray", "material": "rubber", "shape": "cube"}


def test_wrong_captions():
    assert parse_caption("").change_type is None
    assert parse_caption("a dog is running").change_type is None
    assert parse_caption("the small red metal sphere changed to sphere").change_type is None  # no colour/material
    assert parse_caption("the small red metal sphere").change_type is None  # truncated
    garbled = parse_caption("the small small red sphere moved")  # type readable, object not
    assert garbled.change_type == "move" and garbled.attributes is None
    assert parse_object_phrase("small red metal dog") is None
    assert parse_object_phrase("red cube") == {"color": "red", "shape": "cube"}


def test_vocabulary_covers_every_generator_word():
    tokenizer = build_word_tokenizer(vocabulary_texts())
    texts = [
        CHANGE_PROMPT + " Entity: small red metal sphere, large gray rubber cube.",
        *NO_CHANGE_CAPTIONS,
        "small red metal sphere , large gray rubber cube",
    ]
    for table in (SIZE_WORDS, COLOR_WORDS, MATERIAL_WORDS, SHAPE_WORDS):
        texts.extend(word for words in table.values() for word in words)
    for templates in CHANGE_TEMPLATES.values():
        texts.extend(t.format(obj="tiny cyan shiny block", new="purple") for t in templates)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, text
    assert tokenizer("a dog")["input_ids"][-1] == tokenizer.unk_token_id  # an unknown word does map to <unk>


def test_score_synthetic_counts_by_hand():
    truths = {
        "a.png": PairTruth("color", RED_BALL, "blue"),
        "a.png_n": PairTruth("none"),
        "b.png": PairTruth("drop", {"size": "large", "color": "gray", "material": "rubber", "shape": "cube"}),
        "b.png_n": PairTruth("none"),
    }
    predictions = {
        "a.png": "the tiny red shiny ball turned green",  # type and object right, new value wrong
        "a.png_n": "nothing has changed",  # right
        "b.png": "the large gray metal cube is gone",  # type right, material wrong
        "b.png_n": "the large gray rubber cube moved",  # wrong type
    }
    scores = score_synthetic(predictions, truths).to_dict()
    assert scores["overall"] == {"pairs": 4, "type_accuracy": 0.75, "object_accuracy": 0.5, "exact_accuracy": 0.25}
    assert scores["per_type"]["none"]["type_accuracy"] == 0.5
    assert scores["confusion"]["none"] == {"none": 1, "move": 1}
    with pytest.raises(DataError, match="no truth"):
        score_synthetic({"c.png": "there is no change"}, truths)
    table = format_synthetic_table(score_synthetic(predictions, truths))
    assert "| color | 100.0 | 100.0 | 0.0 | 1 |" in table
    assert "| drop | 100.0 | 0.0 | 0.0 | 1 |" in table
    assert "| none | 50.0 | — | 50.0 | 2 |" in table
    assert "| total | 75.0 | 50.0 | 25.0 | 4 |" in table


def test_evaluate_prints_synthetic_accuracy(synth_root, tmp_path, capsys):
    from davir.cli import evaluate

    scenes = load_scenes(synth_root)
    test_ids = [k for k, r in scenes.items() if r["split"] == "test"]
    assert test_ids
    predictions = {}
    for scene_id in test_ids:  # semantic pairs right, distractor pairs wrongly "moved"
        predictions[f"{scene_id}.png"] = scenes[scene_id]["captions"][0]
        predictions[f"{scene_id}.png_n"] = f"the {scenes[scene_id]['change']['subject']} moved"
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(predictions))
    out = tmp_path / "metrics.json"
    assert (
        evaluate.main(
            [
                "--predictions",
                str(path),
                "--format",
                "clevr_change",
                "--root",
                str(synth_root),
                "--split",
                "test",
                "--metrics",
                "BLEU",
                "--no-spice",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "| none | 0.0 | — | 0.0 |" in capsys.readouterr().out
    overall = json.loads(out.read_text())["synthetic"]["overall"]
    assert overall["type_accuracy"] == 0.5 and overall["object_accuracy"] == 1.0


def test_synthetic_accuracy_matches_ids_as_the_caption_metrics_do(synth_root, tmp_path):
    """A predictions file naming scene 3 "3" / "3_n" (no padding, no extension) scores the same pairs as one naming
    it "000003.png": the caption metrics align those spellings, so the accuracy table must count them too."""
    from davir.cli import evaluate

    scenes = load_scenes(synth_root)
    test_ids = [k for k, r in scenes.items() if r["split"] == "test"]
    overall = {}
    for spelling, name in (("{}.png", "padded"), ("{}", "plain")):
        predictions = {}
        for scene_id in test_ids:
            key = spelling.format(scene_id if name == "padded" else int(scene_id))
            predictions[key] = scenes[scene_id]["captions"][0]
            predictions[key + "_n"] = "the two scenes seem identical"
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(predictions))
        out = tmp_path / f"{name}_metrics.json"
        arguments = ["--predictions", str(path), "--format", "clevr_change", "--root", str(synth_root)]
        arguments += ["--split", "test", "--metrics", "BLEU", "--no-spice", "--out", str(out)]
        assert evaluate.main(arguments) == 0
        overall[name] = json.loads(out.read_text())["synthetic"]["overall"]
    assert overall["padded"]["pairs"] == 2 * len(test_ids)
    assert overall["plain"] == overall["padded"]


def test_generator_references_score_perfectly(synth_root):
    scenes = load_scenes(synth_root)
    truths = pair_truths(scenes)
    assert len(truths) == 20
    no_change = json.loads((synth_root / "no_change_captions.json").read_text())
    predictions = {}
    for scene_id, record in scenes.items():
        for _i, caption in enumerate(record["captions"]):  # every reference, synonyms included
            assert parse_caption(caption).attributes == truths[f"{scene_id}.png"].attributes, caption
        predictions[f"{scene_id}.png"] = record["captions"][-1]
        predictions[f"{scene_id}.png_n"] = no_change[f"CLEVR_default_{scene_id}.png"][0]
    overall = score_synthetic(predictions, truths).to_dict()["overall"]
    assert overall == {"pairs": 20, "type_accuracy": 1.0, "object_accuracy": 1.0, "exact_accuracy": 1.0}


# ----------------------------------------------------------------------------------------------- pretraining


def test_saved_folder_loads_as_instructblip_with_same_logits(tmp_path):
    torch.manual_seed(0)
    model = build_tiny_model(image_size=32, patch_size=8, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pixels = torch.randn(2, 3, 32, 32)
    loss = description_loss(model, pixels, ["small red metal sphere , large gray rubber cube", "tiny blue ball"])
    loss.backward()
    optimizer.step()  # weights differ from the seeded random init, so loading must really read them
    save_checkpoint(model, tmp_path / "ckpt", {"seed": 1})

    loaded = build_davir_model(DavirModelConfig(pretrained=str(tmp_path / "ckpt")))
    model.eval(), loaded.eval()
    before, after = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    prompts, captions = [CHANGE_PROMPT] * 2, ["the small red metal sphere moved", "there is no change"]
    with torch.no_grad():
        expected = model(before, after, prompts, captions).logits
        actual = loaded(before, after, prompts, captions).logits
    torch.testing.assert_close(actual, expected)
    # The saved word-level tokenizer knows every word the demo needs (no <unk>), entity prompts included.
    text = f"{CHANGE_PROMPT} Entity: small red metallic ball, big cyan matte cylinder."
    ids = loaded.tokenizer(text)["input_ids"]
    assert loaded.tokenizer.unk_token_id not in ids
    # Word for word (the word-level decoder keeps a space before ":").
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True).replace(" ", "") == text.lower().replace(" ", "")


def _quick_pretrain(out, data, *args: str) -> int:
    """A few steps of the CLI at 32 px (batch 4, one thread, no CIDEr) with ``args`` added."""
    return main(
        [
            "--out",
            str(out),
            "--data",
            str(data),
            "--batch-size",
            "4",
            "--image-size",
            "32",
            "--eval-every",
            "2",
            "--threads",
            "1",
            "--no-cider",
            "--quiet",
            *args,
        ]
    )


def test_cli_writes_a_loadable_checkpoint(synth_root, tmp_path):
    out = tmp_path / "tiny"
    code = _quick_pretrain(
        out, synth_root, "--desc-steps", "2", "--change-steps", "2", "--eval-scenes", "1", "--seed", "5"
    )
    assert code == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json", INFO_FILE} <= {
        p.name for p in out.iterdir()
    }
    info = json.loads((out / INFO_FILE).read_text())
    assert info["seed"] == 5 and "--desc-steps 2" in info["command"]
    assert [p["stage"] for p in info["curve"]] == ["describe", "change"]
    assert info["final_eval"]["type_accuracy"] is not None
    model = build_davir_model(DavirModelConfig(pretrained=str(out)))
    assert model.image_size == 32 and model.num_query_tokens == 16


def test_last_folder_holds_the_final_steps_weights_and_continues(synth_root, tmp_path):
    """OUT keeps the best scored point, OUT/last the final step's weights; `--init OUT/last` continues from it.
    Six steps from random weights score 0 at every point, so the best is the first (a tie keeps the earlier)."""
    from safetensors.torch import load_file

    out = tmp_path / "tiny"
    assert (
        _quick_pretrain(
            out, synth_root, "--desc-steps", "0", "--change-steps", "6", "--eval-every", "2", "--eval-scenes", "2"
        )
        == 0
    )
    info, last_info = (json.loads((folder / INFO_FILE).read_text()) for folder in (out, out / LAST_FOLDER))
    assert len(info["curve"]) == 3 and last_info["curve"] == info["curve"] and "last step" in last_info["weights"]
    best, last = (load_file(folder / "model.safetensors") for folder in (out, out / LAST_FOLDER))
    assert info["best"]["step"] == 2 and best.keys() == last.keys()
    assert not all(torch.equal(best[name], last[name]) for name in best)  # four more steps moved the weights
    more = tmp_path / "more"
    assert (
        _quick_pretrain(
            more,
            synth_root,
            "--init",
            str(out / LAST_FOLDER),
            "--desc-steps",
            "0",
            "--change-steps",
            "2",
            "--eval-scenes",
            "1",
        )
        == 0
    )
    chain = json.loads((more / INFO_FILE).read_text())["init"]
    assert chain["folder"] == str(out / LAST_FOLDER) and chain["init"] is None  # out itself started from random weights


def test_cli_pretrains_a_chat_family_with_both_stages(synth_root, tmp_path):
    """Qwen2.5-VL: the description stage puts one picture in the chat turn; the folder loads as a user's."""
    out = tmp_path / "tiny_qwen"
    code = _quick_pretrain(
        out, synth_root, "--family", "qwen2_5_vl", "--desc-steps", "2", "--change-steps", "2", "--eval-scenes", "1"
    )
    assert code == 0
    info = json.loads((out / INFO_FILE).read_text())
    assert info["family"] == "qwen2_5_vl" and [p["stage"] for p in info["curve"]] == ["describe", "change"]
    assert info["curve"][0]["description_exact"] == 0.0  # 2 steps from random weights describe nothing right
    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(out), image_size=32))
    assert type(model.core).__name__ == "Qwen2_5_VLForConditionalGeneration" and model.patch_grid == (4, 4)


def test_added_llm_layers_start_as_the_identity_and_load_from_the_folder(synth_root, tmp_path):
    """--add-llm-layers 2: the grown Qwen computes exactly the checkpoint's logits, its new layers are trainable
    (their output projections zero, the rest drawn), and the folder the CLI writes loads with 4 LLM layers."""
    model = build_tiny_model(family="qwen2_5_vl", image_size=32, seed=3)
    model.eval()
    ids = torch.tensor([[5, 9, 14, 22, 31, 40, 7, 3]])
    with torch.no_grad():
        before = model.core(input_ids=ids).logits
        assert add_language_layers(model, 2) == 4
        after = model.core(input_ids=ids).logits
    assert torch.equal(before, after)
    new = model.core.get_decoder().layers[3]
    assert (
        new.self_attn.layer_idx == 3 and not new.mlp.down_proj.weight.any() and new.self_attn.q_proj.weight.std() > 0.01
    )
    assert model.core.config.text_config.layer_types == ["full_attention"] * 4
    with pytest.raises(ValueError, match="add-llm-layers"):
        add_language_layers(model, -1)

    start, grown = tmp_path / "start", tmp_path / "grown"
    assert (
        _quick_pretrain(
            start,
            synth_root,
            "--family",
            "qwen2_5_vl",
            "--desc-steps",
            "1",
            "--change-steps",
            "0",
            "--eval-scenes",
            "1",
        )
        == 0
    )
    assert (
        _quick_pretrain(
            grown,
            synth_root,
            "--family",
            "qwen2_5_vl",
            "--init",
            str(start),
            "--add-llm-layers",
            "2",
            "--desc-steps",
            "0",
            "--change-steps",
            "2",
            "--eval-scenes",
            "1",
        )
        == 0
    )
    loaded = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(grown), image_size=32))
    assert len(loaded.core.get_decoder().layers) == 4
    info = json.loads((grown / INFO_FILE).read_text())
    assert "--add-llm-layers 2" in info["command"] and info["init"]["folder"] == str(start)
    again = tmp_path / "again"  # a third stage keeps the whole chain: again ← grown ← start
    assert (
        _quick_pretrain(
            again,
            synth_root,
            "--family",
            "qwen2_5_vl",
            "--init",
            str(grown),
            "--desc-steps",
            "0",
            "--change-steps",
            "1",
            "--eval-scenes",
            "1",
        )
        == 0
    )
    chain = json.loads((again / INFO_FILE).read_text())["init"]
    assert chain["folder"] == str(grown) and chain["init"]["folder"] == str(start) and chain["init"]["init"] is None


def test_noisy_entities_imitate_a_retriever():
    """Changed pairs get the changed object (or, at the ``wrong`` share, another object of the scene);
    distractor pairs get none (or, at the ``on_distractor`` share, one of the scene's objects)."""
    import random

    objects = [["small red metal sphere", "large gray rubber cube", "small cyan metal cylinder"]] * 2
    data = SceneTensors(
        ids=["0", "1"],
        images=torch.zeros(2, 3, 3, 4, 4, dtype=torch.uint8),
        descriptions=[],
        captions=[],
        no_change=[],
        subjects=["large gray rubber cube", "small red metal sphere"],
        objects=objects,
    )
    rows, semantic = [0, 1, 0, 1] * 50, [True, True, False, False] * 50
    clean = noisy_entities(data, rows, semantic, random.Random(0), EntityNoise(wrong=0.0, on_distractor=0.0))
    assert clean[:4] == [["large gray rubber cube"], ["small red metal sphere"], [], []]
    noisy = noisy_entities(data, rows, semantic, random.Random(0), EntityNoise(wrong=1.0, on_distractor=1.0))
    for row, changed, entity in zip(rows, semantic, noisy):
        assert len(entity) == 1 and entity[0] in objects[row]
        if changed:
            assert entity[0] != data.subjects[row]
    half = noisy_entities(data, rows, semantic, random.Random(0), EntityNoise(wrong=0.5, on_distractor=0.5))
    wrong = sum(e != [data.subjects[r]] for r, c, e in zip(rows, semantic, half) if c)
    given = sum(bool(e) for c, e in zip(semantic, half) if not c)
    assert 30 <= wrong <= 70 and 30 <= given <= 70  # 100 draws each at p = 0.5


def test_cli_with_entity_prompts_scores_both_prompts(synth_root, tmp_path):
    out = tmp_path / "tiny_epc"
    code = _quick_pretrain(
        out, synth_root, "--desc-steps", "0", "--change-steps", "2", "--entity-share", "1", "--eval-scenes", "2"
    )
    assert code == 0
    info = json.loads((out / INFO_FILE).read_text())
    point = info["curve"][-1]
    assert point["stage"] == "change" and "--entity-share 1" in info["command"]
    assert point["with_entities"]["per_type"]["none"]["pairs"] == info["eval_scenes"] >= 1  # every distractor pair
    assert info["final_eval_with_entities"]["type_accuracy"] is not None


def test_type_weights_draw_the_changed_pairs_of_a_type_more_often(tmp_path, capsys):
    """--type-weights move=4: of four scenes (one a move), the changed pairs are a move 4/7 of the time instead of
    1/4; distractor pairs and the unweighted draw stay as they were."""
    import random

    kinds = ["color", "move", "add", "drop"]
    data = SceneTensors(
        ids=["0", "1", "2", "3"],
        images=torch.zeros(4, 3, 3, 4, 4, dtype=torch.uint8),
        descriptions=[],
        captions=[["c"]] * 4,
        no_change=[["n"]] * 4,
        subjects=[],
        objects=[],
        change_types=kinds,
    )
    assert change_type_weights(data, {}) is None
    cumulative = change_type_weights(data, {"move": 4.0})
    assert cumulative == [1.0, 5.0, 6.0, 7.0]
    norm = lambda images: images.float()  # noqa: E731
    changed, distractor = [], []
    for seed in range(50):
        batch = sample_change_batch(data, 40, random.Random(seed), norm, cumulative)
        changed += [kinds[r] for r, s in zip(batch.rows, batch.semantic) if s]
        distractor += [kinds[r] for r, s in zip(batch.rows, batch.semantic) if not s]
    assert abs(changed.count("move") / len(changed) - 4 / 7) < 0.04  # ~1,000 draws: sd 0.016
    assert abs(distractor.count("move") / len(distractor) - 1 / 4) < 0.04
    plain, reference = sample_change_batch(data, 40, random.Random(3), norm), random.Random(3)
    assert plain.rows == [reference.randrange(4) for _ in range(40)]  # the unweighted draw is unchanged
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "x"), "--scenes", "2", "--type-weights", "moved=2", "--quiet"])
    assert (
        exit_info.value.code == 2
        and "type-weights: moved=2.0; give positive weights of color" in capsys.readouterr().err
    )


def test_cli_refuses_shares_outside_0_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "x"), "--scenes", "2", "--entity-share", "1.5", "--quiet"])
    assert exit_info.value.code == 2 and "--entity-share must be a share in [0, 1]" in capsys.readouterr().err
    with pytest.raises(ValueError, match="on_distractor"):
        EntityNoise(on_distractor=-0.1)


def test_cli_reports_missing_data(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "x"), "--data", str(tmp_path / "absent"), "--quiet"]) == 2
    assert "scenes.json" in capsys.readouterr().err


def test_canonical_description_orders_by_colour_then_shape():
    from davir.pretrain_tiny import canonical_description

    left_to_right = "small cyan rubber sphere , large gray rubber cube , small gray metal cube , tiny_unused"
    with pytest.raises(ValueError):  # a phrase that is not four attribute words is refused
        canonical_description(left_to_right)
    assert canonical_description("small cyan rubber sphere , large gray rubber cube , small gray metal cube") == (
        "small gray metal cube , large gray rubber cube , small cyan rubber sphere"
    )


def test_demo_config_fine_tunes_the_shipped_checkpoint():
    """configs/demo.yaml names the shipped tiny checkpoint; it loads as an InstructBLIP folder in LoRA mode,
    its tokenizer knows every word the generator and the entity prompt can produce, and it records the
    command that made it. Its pretraining data must not be the demo's (seed 0) scenes."""
    from pathlib import Path

    from davir.config import load_config
    from davir.runs.config import TrainConfig

    repo = Path(__file__).resolve().parents[1]
    config = load_config(TrainConfig, repo / "configs" / "demo.yaml", [])
    folder = repo / config.model.pretrained
    info = json.loads((folder / INFO_FILE).read_text())
    assert info["command"].startswith("python -m davir.pretrain_tiny") and "seed" in info
    assert info["data_seed"] != 0, "the tiny checkpoint must be pretrained on other scenes than the demo's"
    model = build_davir_model(config.model)
    assert model.config.train_mode == "lora"
    tokens = model.tokenizer(" ".join(vocabulary_texts()), add_special_tokens=False)["input_ids"]
    assert model.tokenizer.unk_token_id not in tokens
    trainable, total = model.trainable_parameter_summary()["all"]
    assert 0 < trainable < 0.2 * total  # adapters + projection + query tokens, not the whole model


def test_out_is_never_the_init_folder_nor_a_folder_of_someone_else(tmp_path, capsys):
    """--out equal to --init (or holding it as last/) saved over the weights the run trains from, and --out a
    folder of other files (a real model's, the current folder) had its config.json and model.safetensors replaced;
    --out a file ran the whole first stage before a FileExistsError traceback. All are refused before any data is
    read (exit 2, one line); a folder this command wrote is written again, as the docs' --out assets/… does."""
    mine = tmp_path / "my model é"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}\n')
    earlier = tmp_path / "earlier"
    (earlier / LAST_FOLDER).mkdir(parents=True)
    (earlier / INFO_FILE).write_text(json.dumps({"describe_prompt": "Describe the image."}))
    (tmp_path / "a_file").write_text("mine\n")
    data = ["--data", str(tmp_path / "no data here"), "--quiet"]
    for argv, message in [
        (
            ["--out", str(earlier), "--init", str(earlier)],
            f"--out {earlier} is the --init folder {earlier} (or holds it as last/), whose weights the run would "
            "replace while it trains from them; give another --out",
        ),
        (
            ["--out", str(earlier), "--init", str(earlier / LAST_FOLDER)],
            f"--out {earlier} is the --init folder {earlier / LAST_FOLDER} (or holds it as last/)",
        ),
        (
            ["--out", str(mine)],
            f"--out {mine} holds files that python -m davir.pretrain_tiny did not write (no {INFO_FILE} of its "
            "own), which the checkpoint would replace; give a new or empty folder",
        ),
        (
            ["--out", str(tmp_path / "a_file")],
            f"--out {tmp_path / 'a_file'} cannot be used: {tmp_path / 'a_file'} is a file, not a folder",
        ),
    ]:
        assert main([*argv, *data]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1
    assert (mine / "config.json").read_text() == '{"mine": true}\n'
    # a folder this command wrote is taken (the data, absent here, is what stops it)
    assert main(["--out", str(earlier), *data]) == 2
    assert "scenes.json" in capsys.readouterr().err


def test_a_save_stopped_midway_leaves_the_earlier_checkpoint_whole(tmp_path, monkeypatch):
    """Each better score saves over OUT: model.safetensors was written in place, so Ctrl-C (or a kill) during a
    save left the best checkpoint half old, half new. The folder is written beside OUT and moved in at the end."""
    out = tmp_path / "tiny"
    model = build_tiny_model(image_size=32, patch_size=8, seed=1)
    save_checkpoint(model, out, {"describe_prompt": "x", "best": {"step": 1}})
    saved = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # as Ctrl-C arriving while the processor is written, after the weights

    monkeypatch.setattr(model.processor, "save_pretrained", stopped)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, out, {"describe_prompt": "x", "best": {"step": 2}})
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == saved
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny"]  # no temporary folder left
    monkeypatch.undo()
    save_checkpoint(model, out, {"describe_prompt": "x", "best": {"step": 2}})
    assert json.loads((out / INFO_FILE).read_text())["best"] == {"step": 2}
    assert (out / "model.safetensors").read_bytes() != saved["model.safetensors"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--desc-steps", "-1"], "--desc-steps must be 0 or more, got -1"),  # the stage was skipped, exit 0
        (["--desc-steps", "0", "--change-steps", "0"], "--desc-steps and --change-steps are both 0: nothing to train"),
        (["--eval-every", "-1"], "--eval-every must be 1 or more, got -1"),  # scored every step, exit 0
        (["--eval-every", "0"], "--eval-every must be 1 or more, got 0"),  # ZeroDivisionError
        (["--batch-size", "0"], "--batch-size must be 1 or more, got 0"),  # IndexError
        (["--threads", "0"], "--threads must be 1 or more, got 0"),  # RuntimeError
        (["--image-size", "0"], "--image-size must be 1 or more, got 0"),  # ValueError in PIL
        (["--patch-size", "0"], "--patch-size must be 1 or more, got 0"),  # ConfigError traceback
        (["--query-tokens", "-1"], "--query-tokens must be 0 or more, got -1"),  # RuntimeError
        (["--eval-scenes", "0"], "--eval-scenes must be 1 or more, got 0"),  # "no scenes in split 'test'"
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),  # AdamW's ValueError
        (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),  # trained on NaN weights, exit 0
        (["--data-seed", "-1"], "--data-seed must be 0 or more, got -1"),  # numpy's traceback after the check
    ],
)
def test_counts_and_the_rate_out_of_range_are_usage_errors(tmp_path, capsys, flags, message):
    """Each was a traceback or a silently other run before any check; now argparse's usage error (exit 2) naming
    the flag, before any data is read or generated."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "x"), "--data", str(tmp_path / "absent"), "--quiet", *flags])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


def test_an_init_folder_it_did_not_write_or_of_another_size_is_one_line(synth_root, tmp_path, capsys):
    """--init a model folder without this command's pretrain_info.json loaded the model, then stopped with "annotation
    file is missing: …/pretrain_info.json"; --init the shipped 64-px checkpoint with --image-size 32 stopped with a
    ValueError traceback. Now the first is refused before any data is read, the second names --init, both exit 2."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "assets" / "tiny_instructblip"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    assert main(["--out", str(tmp_path / "o"), "--init", str(bare), "--data", str(tmp_path / "absent"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"error: --init {bare} is not a folder python -m davir.pretrain_tiny wrote (no {INFO_FILE} of its own); give "
        "one it wrote (OUT or OUT/last), or leave --init out to start from random weights\n"
    )
    assert _quick_pretrain(tmp_path / "o", synth_root, "--init", str(shipped), "--desc-steps", "1") == 2
    err = capsys.readouterr().err  # after transformers' progress bar
    assert "Traceback" not in err and err.endswith(
        f"error: --init {shipped}: image_size=32 but the pretrained model at {shipped} was built for 64; give its "
        "--image-size and --patch-size\n"
    )


def test_every_option_says_what_it_takes():
    from davir.cli.pretrain_tiny import build_parser

    assert [action.dest for action in build_parser()._actions if not action.help] == []
