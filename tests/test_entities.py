"""Entity vocabulary (davir.text.entity_vocabulary, davir.text.extractors), retrievers (Eqs. 8-9) and `preprocess entities` / `entity-eval`."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from davir.data.caches import EntityCache, MaskCache, PairMasks
from davir.data.records import DISTRACTOR, ChangePair
from davir.errors import DataError
from davir.io import read_json
from davir.jobs import entities, entity_eval
from davir.preprocessing.retrievers import (
    RETRIEVERS,
    ClipRetriever,
    EntityGate,
    FittedRetriever,
    PairRegions,
    gate_features,
    masked_region,
    pair_features,
    pair_regions,
    phrase_words,
    retrieve_top_k,
    square_pad,
    top_k,
)
from davir.text.entity_vocabulary import build_vocabulary
from davir.text.extractors import PhraseExtractor, extract_attributes, extract_phrases, get_extractor, subject_phrase
from davir.text.words import CLOSED_CLASS, GENERIC_HEADS


@pytest.fixture(scope="module")
def wordnet() -> PhraseExtractor:
    return get_extractor("wordnet")  # the lexicon shipped with davir: no OS package, no skip


def real_captions(path: Path, field: str) -> list[str]:
    return [sentence for entry in json.loads(path.read_text()) for sentence in entry[field]]


# ---------------------------------------------------------------------------------------------------
# (a) chunker and vocabulary on the real captions
# ---------------------------------------------------------------------------------------------------

SPOT_CASES = {
    "the person standing by the couple under the umbrella is no longer there": ["person", "umbrella"],
    "a blue car is pulling out of the parking lot": ["blue car", "parking lot"],
    "different cars at stop sign in each picture": ["car", "stop sign"],
    "in picture one the blue truck is turning right and in picture two its sitting at the stop sign": [
        "blue truck",
        "sitting",
        "stop sign",
    ],
}
IER_CASES = {
    "Remove the girl from the image": ["girl"],
    "Decrease the red color in the image and remove the white stains": ["red color", "white stain"],
    "remove the background add a cloud background": ["background", "cloud background"],
    "Increase the brightness of the image": ["brightness"],
    # run-on instructions: a capitalised imperative starts a new clause
    "Change the background into solid white Increase the height of the image": ["background", "height"],
}


def test_chunker_on_real_spot_the_diff_and_ier_captions(shared_datasets, wordnet):
    spot = set(real_captions(shared_datasets / "spot_the_diff" / "annotations" / "val.json", "sentences"))
    ier = set(real_captions(shared_datasets / "ier" / "valid.json", "sents"))
    for caption, expected in SPOT_CASES.items():
        assert caption in spot
        assert wordnet.phrases(caption) == expected, caption
    for caption, expected in IER_CASES.items():
        assert caption in ier
        assert wordnet.phrases(caption) == expected, caption
    # RDD noun/verb segments and CHEER's subject phrase on the same real captions
    assert wordnet.attributes("a blue car is pulling out of the parking lot") == {
        "nouns": ["blue car", "parking lot"],
        "verbs": ["is pulling"],
    }
    assert wordnet.attributes("Remove the girl from the image") == {"nouns": ["girl", "image"], "verbs": ["remove"]}
    assert wordnet.subject("the person standing by the couple under the umbrella is no longer there") == "person"
    assert wordnet.subject("different cars at stop sign in each picture") == "car"


def test_chunker_keeps_full_clevr_object_phrases(wordnet):
    assert wordnet.phrases("the small red metal sphere changed to blue") == ["small red metal sphere"]
    assert wordnet.phrases("someone added a large green rubber cube") == ["large green rubber cube"]
    assert wordnet.phrases("there is no longer a tiny cyan shiny cylinder") == ["tiny cyan shiny cylinder"]
    assert wordnet.subject("someone added a large green rubber cube") == "large green rubber cube"
    assert wordnet.attributes("the big gray metal block has been moved")["verbs"] == ["has been moved"]
    # module-level helpers use the same default extractor
    assert "umbrella" in extract_phrases("person with umbrella is gone")
    assert extract_phrases("person with umbrella is gone", backend="wordnet") == ["person", "umbrella"]
    assert extract_attributes("person with umbrella is gone", backend="wordnet")["verbs"] == ["is gone"]
    assert subject_phrase("nothing has changed", backend="wordnet") is None


def test_vocabulary_on_real_spot_the_diff_val(shared_datasets, wordnet):
    captions = real_captions(shared_datasets / "spot_the_diff" / "annotations" / "val.json", "sentences")
    assert len(captions) == 3310
    vocab2 = build_vocabulary(captions, min_count=2, extractor=wordnet)
    vocab1 = build_vocabulary(captions, min_count=1, extractor=wordnet)
    assert set(vocab2.phrases) < set(vocab1.phrases)
    assert all(vocab2.counts[p] >= 2 for p in vocab2.phrases)
    assert any(vocab1.counts[p] == 1 for p in vocab1.phrases)
    assert vocab2.phrases[:3] == ["people", "person", "car"]  # the surveillance scenes' main actors
    assert {"parking lot", "white car", "stop sign"} <= set(vocab2.phrases)
    counts = [vocab2.counts[p] for p in vocab2.phrases]
    assert counts == sorted(counts, reverse=True)
    for phrase in vocab2.phrases:
        assert phrase.split()[-1] not in GENERIC_HEADS
        assert phrase.split()[0] not in CLOSED_CLASS
        assert phrase == phrase.lower()
    # the count is the number of captions naming the phrase (a caption naming it twice counts once)
    naming_car = sum(1 for c in captions if "car" in wordnet.phrases(c))
    assert vocab2.counts["car"] == naming_car


def test_vocabulary_min_count_generic_heads_and_bare_attributes(wordnet):
    captions = [
        "the small red metal sphere changed to rubber",
        "the small red metal sphere is gone",
        "a large blue rubber cube has appeared",
        "the large blue rubber cube changed to metal",
        "the small red metal sphere moved",
        "there is a difference in the picture",
        "the picture changed",
        "a green cylinder appeared",
    ]
    vocab = build_vocabulary(captions, min_count=2, extractor=wordnet)
    # "picture"/"difference" are generic heads; "rubber"/"metal" head 1 phrase each but modify 5
    assert vocab.phrases == ["small red metal sphere", "large blue rubber cube"]
    assert vocab.counts == {"small red metal sphere": 3, "large blue rubber cube": 2}
    assert vocab.source["bare_attributes_dropped"] == []  # they also fail min_count here
    vocab1 = build_vocabulary(captions, min_count=1, extractor=wordnet)
    assert set(vocab1.phrases) == {"small red metal sphere", "large blue rubber cube", "green cylinder"}
    assert set(vocab1.source["bare_attributes_dropped"]) == {"metal", "rubber"}
    with pytest.raises(ValueError):
        build_vocabulary(captions, min_count=0, extractor=wordnet)


def test_rules_backend_and_a_wordnet_override_that_is_no_wordnet(tmp_path, monkeypatch):
    monkeypatch.setenv("DAVIR_WORDNET_DIR", str(tmp_path))  # research override: an empty folder is an error
    with pytest.raises(DataError, match="DAVIR_WORDNET_DIR=.*index.noun.*unset it"):
        get_extractor("wordnet")
    monkeypatch.delenv("DAVIR_WORDNET_DIR")
    corpus = ["the red car is parked near the tree", "a person walked past the red car", "the tree is gone"]
    rules = get_extractor("rules", corpus=corpus)
    assert rules.backend == "rules"
    assert rules.phrases("the red car is parked near the tree") == ["red car", "tree"]
    assert rules.phrases("two trees were removed") == ["tree"]
    vocab = build_vocabulary(corpus, min_count=2, extractor=rules)
    assert vocab.phrases == ["red car", "tree"] and vocab.extractor == {"backend": "rules"}


# ---------------------------------------------------------------------------------------------------
# (b) retrieval: regions (Eq. 8), fitted retriever, open_clip retriever (Eq. 9)
# ---------------------------------------------------------------------------------------------------

COLORS = {"red": (200, 30, 30), "blue": (30, 60, 210), "yellow": (230, 220, 40)}
BACKGROUND = (128, 128, 128)


def draw_shape(
    shape: str, color: str, center: tuple[int, int], size: int, hw=(48, 64)
) -> tuple[np.ndarray, np.ndarray]:
    """A flat grey image with one coloured square or circle, and the object's mask."""
    image = np.full((*hw, 3), BACKGROUND, np.uint8)
    mask = np.zeros(hw, np.uint8)
    x, y = center
    if shape == "square":
        cv2.rectangle(mask, (x - size, y - size), (x + size, y + size), 1, thickness=-1)
    else:
        cv2.circle(mask, (x, y), size, 1, thickness=-1)
    image[mask > 0] = COLORS[color]
    return image, mask.astype(bool)


def test_masked_region_is_eq8_crop_with_padding():
    image = np.arange(20 * 30 * 3, dtype=np.uint8).reshape(20, 30, 3)
    mask = np.zeros((10, 15), bool)  # half resolution: upsampled (nearest) to 20×30
    mask[2:4, 5:10] = True  # → rows 4..7, cols 10..19 in the image
    region = masked_region(image, mask, pad=0.1)
    assert region.box == (9, 3, 21, 9)  # 10 % of 10 cols = 1, 10 % of 4 rows → ceil(0.4) = 1
    assert region.crop.shape == (6, 12, 3) and not region.empty
    inside = np.zeros((20, 30), bool)
    inside[4:8, 10:20] = True
    expected = image * inside[..., None]
    np.testing.assert_array_equal(region.crop, expected[3:9, 9:21])
    empty = masked_region(image, np.zeros((20, 30), bool))
    assert empty.empty and empty.box == (0, 0, 30, 20)
    np.testing.assert_array_equal(empty.crop, image)
    soft = masked_region(image, mask, weighting="soft")
    assert soft.box == region.box and soft.crop.max() < region.crop.max()  # the blurred M^ attenuates


def test_pair_regions_per_image_falls_back_to_union():
    before, mask_before = draw_shape("square", "red", (15, 20), 6)
    after = np.full_like(before, BACKGROUND)
    masks = PairMasks(before=mask_before, after=np.zeros_like(mask_before), info={})  # a dropped object
    pair = pair_regions("p", before, after, masks, mask_source="per_image")
    assert pair.before.box == pair.after.box and not pair.after.empty  # after uses the union (the before mask)
    assert (pair.after.crop[pair.after.mask > 0] == BACKGROUND).all()
    moved = PairMasks(before=mask_before, after=draw_shape("square", "red", (45, 30), 6)[1], info={})
    per_image = pair_regions("p", before, after, moved, mask_source="per_image")
    union = pair_regions("p", before, after, moved, mask_source="union")
    assert per_image.before.box != per_image.after.box
    assert union.before.box == union.after.box


def shapes_pairs(specs):
    """'Add' pairs: before is empty floor, after has the object; masks are the object mask in both."""
    pairs = []
    for i, (shape, color, center, size) in enumerate(specs):
        after, mask = draw_shape(shape, color, center, size)
        before = np.full_like(after, BACKGROUND)
        pairs.append(pair_regions(f"p{i}", before, after, PairMasks(None, mask, {})))
    return pairs


def test_fitted_retriever_learns_coloured_shapes(tmp_path):
    vocabulary = [f"{c} {s}" for c in COLORS for s in ("square", "circle")]
    rng = np.random.default_rng(0)

    def specs(per_phrase: int):
        return [
            (shape, color, (int(rng.integers(14, 50)), int(rng.integers(14, 34))), int(rng.integers(6, 10)))
            for color in COLORS
            for shape in ("square", "circle")
            for _ in range(per_phrase)
        ]

    train, test = specs(4), specs(2)  # new positions and sizes for every test shape
    retriever = FittedRetriever()
    retriever.fit(shapes_pairs(train), [{f"{c} {s}": 1.0} for s, c, _, _ in train], vocabulary)
    retriever.prepare(vocabulary)
    scores = retriever.score(shapes_pairs(test))
    assert scores.shape == (len(test), len(vocabulary))
    np.testing.assert_allclose(scores.sum(axis=1), 1.0)
    predicted = [vocabulary[i] for i in scores.argmax(axis=1)]
    assert predicted == [f"{c} {s}" for s, c, _, _ in test]
    # every training pair is an "add": the caption describes the after image, and π learns it
    assert retriever.training["share_describing_before"] == 0.0
    features = np.concatenate([pair_features(p) for p in shapes_pairs(test)])
    assert (retriever.side_probability(features) < 0.5).all()
    # stored as JSON + npz and rebuilt without pickle
    retriever.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fitted.json", "fitted.npz"]
    loaded = FittedRetriever.load(tmp_path)
    np.testing.assert_allclose(loaded.score(shapes_pairs(test)), scores)
    with pytest.raises(DataError, match="another entity vocabulary"):
        loaded.prepare(vocabulary[::-1])


def test_phrase_scores_are_word_logit_sums():
    words, incidence = phrase_words(["red car", "car", "red truck"])
    assert words == ["car", "red", "truck"]
    np.testing.assert_array_equal(incidence, [[1, 1, 0], [1, 0, 0], [0, 1, 1]])
    retriever = FittedRetriever()
    retriever.phrases, retriever.words, retriever.incidence = ["red car", "car", "red truck"], words, incidence
    retriever.mean, retriever.scale = np.zeros(1), np.ones(1)
    retriever.coef, retriever.intercept = np.zeros((3, 1)), np.array([2.0, -1.0, -3.0])  # z_car, z_red, z_truck
    logits = np.array([2.0 - 1.0, 2.0, -1.0 - 3.0])  # B·z
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(retriever.phrase_scores(np.zeros((1, 1)))[0], expected)
    assert top_k(expected, retriever.phrases, 2) == [
        ("car", pytest.approx(expected[1])),
        ("red car", pytest.approx(expected[0])),
    ]


TINY_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A random-weight open_clip CLIP of a tiny registered config, saved as a local state dict."""
    open_clip = pytest.importorskip("open_clip")
    import torch

    folder = tmp_path_factory.mktemp("clip")
    config = folder / "davir-test-tiny-clip.json"
    config.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model("davir-test-tiny-clip")
    checkpoint = folder / "tiny.pt"
    torch.save(model.state_dict(), checkpoint)
    return "davir-test-tiny-clip", checkpoint, config


def test_clip_retriever_scores_are_max_cosine_over_both_regions(tiny_clip):
    import open_clip
    import torch
    from PIL import Image

    name, checkpoint, config = tiny_clip
    phrases = ["red square", "blue circle", "yellow square", "car"]
    retriever = ClipRetriever(name, checkpoint, config=config, device="cpu")
    retriever.prepare(phrases)
    pairs = shapes_pairs([("square", "red", (20, 20), 8), ("circle", "blue", (40, 25), 10)])
    scores = retriever.score(pairs)
    assert scores.shape == (2, 4)
    top = top_k(scores[0], phrases, 3)
    assert len(top) == 3 and [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert top[0][1] == pytest.approx(scores[0].max())

    # hand computation for pair 0 with an independently loaded copy of the checkpoint
    model, _, preprocess = open_clip.create_model_and_transforms(name)
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    tokenizer = open_clip.get_tokenizer(name)
    with torch.no_grad():
        text = model.encode_text(tokenizer([f"a photo of {p}" for p in phrases])).numpy()
        images = torch.stack(
            [preprocess(Image.fromarray(square_pad(r.crop))) for r in (pairs[0].before, pairs[0].after)]
        )
        image = model.encode_image(images).numpy()
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    np.testing.assert_allclose(scores[0], np.max(image @ text.T, axis=0), atol=1e-5)


def test_clip_retriever_refuses_missing_checkpoint(tmp_path):
    with pytest.raises(DataError, match="CLIP checkpoint file is missing"):
        ClipRetriever("ViT-L-14", tmp_path / "absent.pt", device="cpu")


# ---------------------------------------------------------------------------------------------------
# CLI: a hand-made dataset in the CLEVR-Change layout
# ---------------------------------------------------------------------------------------------------

SCENES = [  # (shape, colour, centre, size); 12 train + 4 test scenes, all "add" changes
    *[(s, c, (18 + 9 * k, 16 + 5 * k), 7 + k) for k in range(2) for c in COLORS for s in ("square", "circle")],
    ("square", "blue", (44, 30), 9),
    ("circle", "yellow", (20, 20), 7),
    ("circle", "red", (36, 28), 10),
    ("square", "yellow", (28, 24), 6),
]
TRAIN, TEST = list(range(12)), list(range(12, 16))


def write_dataset(root: Path) -> Path:
    for folder in (
        "images",
        "sc_images",
        "nsc_images",
        "gt_masks/before",
        "gt_masks/after",
        "gt_masks/before_n",
        "gt_masks/after_n",
    ):
        (root / folder).mkdir(parents=True)
    change, no_change = {}, {}
    for index, (shape, color, center, size) in enumerate(SCENES):
        after, mask = draw_shape(shape, color, center, size)
        before = np.full_like(after, BACKGROUND)
        key = f"CLEVR_default_{index:06d}.png"
        cv2.imwrite(str(root / "images" / key), before[..., ::-1])
        cv2.imwrite(str(root / "sc_images" / f"CLEVR_semantic_{index:06d}.png"), after[..., ::-1])
        cv2.imwrite(str(root / "nsc_images" / f"CLEVR_nonsemantic_{index:06d}.png"), (before * 0.9).astype(np.uint8))
        empty = np.zeros(mask.shape, np.uint8)
        for folder, m in (
            ("before", empty),
            ("after", mask.astype(np.uint8) * 255),
            ("before_n", empty),
            ("after_n", empty),
        ):
            cv2.imwrite(str(root / "gt_masks" / folder / f"{index:06d}.png"), m)
        change[key] = [f"someone added a {color} {shape}", f"a {color} {shape} has appeared"]
        no_change[key] = ["nothing has changed", "the scene remains the same"]
    (root / "change_captions.json").write_text(json.dumps(change))
    (root / "no_change_captions.json").write_text(json.dumps(no_change))
    (root / "splits.json").write_text(json.dumps({"train": TRAIN, "val": [], "test": TEST}))
    (root / "type_mapping.json").write_text(json.dumps({"add": [f"{i:06d}.png" for i in range(len(SCENES))]}))
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("shapes"))


def run_cli(module, argv: list[str], capsys) -> tuple[int, str, str]:
    code = module.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_entities_cli_resumes_and_matches_mask_cache(dataset, tmp_path, capsys, monkeypatch):
    out = tmp_path / "entities"
    base = ["--format", "clevr_change", "--root", str(dataset), "--split", "test", "--no-progress", "--out", str(out)]
    code, stdout, _ = run_cli(entities, [*base, "--masks", "gt", "--limit", "3", "--chunk-size", "2"], capsys)
    assert code == 0 and json.loads(stdout)["written"] == 3
    assert sorted(p.name for p in (out / "entities").glob("part-*.json")) == [
        "part-test-0000000.json",
        "part-test-0000002.json",
    ]
    first_part = (out / "entities" / "part-test-0000000.json").read_text()
    fitted_stamp = (out / "retriever" / "fitted.npz").stat().st_mtime_ns

    code, stdout, _ = run_cli(entities, [*base, "--masks", "gt", "--chunk-size", "2"], capsys)
    summary = json.loads(stdout)
    assert code == 0 and summary["pairs"] == 8 and summary["skipped_existing"] == 3 and summary["written"] == 5
    assert (out / "entities" / "part-test-0000000.json").read_text() == first_part
    assert (out / "retriever" / "fitted.npz").stat().st_mtime_ns == fitted_stamp  # loaded, not refitted

    table = EntityCache(out).table()
    assert len(table) == 8
    for pair_id, items in table.items():
        if pair_id.endswith("_n"):  # distractor pairs: the ground-truth masks are empty → no entity
            assert items == []
        else:
            assert len(items) == 5 and [s for _, s in items] == sorted((s for _, s in items), reverse=True)
    vocabulary = read_json(out / "vocab.json")
    assert vocabulary["phrases"] == sorted(f"{c} {s}" for c in COLORS for s in ("square", "circle"))
    assert all(count == 4 for count in vocabulary["counts"].values())  # 2 train scenes × 2 captions each
    # semantic test pairs: the added object is found
    for index in TEST:
        shape, color = SCENES[index][:2]
        assert table[f"{index:06d}.png"][0][0] == f"{color} {shape}"
    manifest = read_json(out / "entities" / "manifest.json")
    assert manifest["splits"]["test"]["status"] == "complete" and manifest["vocabulary"]["size"] == 6

    # other settings on the same cache are refused
    code, _, err = run_cli(entities, [*base, "--masks", "gt", "--top-k", "3"], capsys)
    assert code == 2 and "made with other settings (top_k: 5 -> 3)" in err

    # the same masks through a MaskCache (fitting on the ground truth) give the same entities
    mask_cache = MaskCache(tmp_path / "masks")
    from davir.data import read_dataset

    for split in ("train", "test"):
        for pair in read_dataset("clevr_change", dataset, split):
            masks = entities.GroundTruthMasks().read(pair)
            mask_cache.write(pair.pair_id, masks.before, masks.after, {})
    out2 = tmp_path / "entities_from_cache"
    base2 = [*base[:-1], str(out2)]
    code, _, _ = run_cli(entities, [*base2, "--masks", str(tmp_path / "masks"), "--fit-masks", "gt"], capsys)
    assert code == 0
    assert read_json(out2 / "entities" / "manifest.json")["settings"]["fit_masks"] == "gt"
    cached = EntityCache(out2).table()
    assert {k: [p for p, _ in v] for k, v in cached.items()} == {k: [p for p, _ in v] for k, v in table.items()}

    # The mask cache is recorded as an absolute path: the same folder given relative, from another folder or
    # through a symlink, resumes the cache; a cache of an older version recorded it as given (relative to where it
    # ran), which a rerun from there still matches; another folder is refused, naming the setting.
    assert read_json(out2 / "entities" / "manifest.json")["settings"]["masks"] == str((tmp_path / "masks").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "link").symlink_to(tmp_path)
    monkeypatch.chdir(elsewhere)
    code, stdout, err = run_cli(entities, [*base2, "--masks", "link/masks", "--fit-masks", "gt"], capsys)
    assert code == 0 and json.loads(stdout)["skipped_existing"] == 8, err
    monkeypatch.chdir(tmp_path)
    manifest = read_json(out2 / "entities" / "manifest.json")
    manifest["settings"]["masks"] = "masks"
    (out2 / "entities" / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(entities, [*base2, "--masks", "masks", "--fit-masks", "gt"], capsys)
    assert code == 0, err
    # a retriever's weights file of an older record, likewise (Component.as_recorded_today)
    clip = RETRIEVERS["clip"].as_recorded_today({"retriever": "clip", "clip_checkpoint": "w/clip.pt"})
    assert clip["clip_checkpoint"] == str((tmp_path / "w" / "clip.pt").resolve())
    (tmp_path / "other_masks").symlink_to(tmp_path / "entities")  # a folder, but not the one the cache used
    code, _, err = run_cli(entities, [*base2, "--masks", "other_masks", "--fit-masks", "gt"], capsys)
    assert code == 2 and f"made with other settings (masks: {str(tmp_path / 'masks')!r} -> " in err

    # entity-eval over the CLI: 4 semantic pairs evaluated, 4 distractors skipped
    code, stdout, _ = run_cli(
        entity_eval,
        ["--format", "clevr_change", "--root", str(dataset), "--split", "test", "--entities", str(out), "--k", "2"],
        capsys,
    )
    assert code == 0 and "top-2" in stdout
    result = read_json(out / "entity_eval_test.json")
    assert result["evaluated"] == 4 and result["skipped"] == {"distractor": 4, "no_reference_entity": 0}
    assert result["top1"] == 1.0 and result["distractors_with_entity"] == 0


def test_entities_cli_clear_errors(dataset, tmp_path, capsys):
    base = ["--format", "clevr_change", "--root", str(dataset), "--split", "test", "--no-progress"]
    code, _, err = run_cli(entities, [*base, "--masks", str(tmp_path / "nope"), "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "mask cache folder" in err
    code, _, err = run_cli(
        entities,
        [
            *base,
            "--masks",
            "gt",
            "--out",
            str(tmp_path / "b"),
            "--retriever",
            "clip",
            "--clip-checkpoint",
            str(tmp_path / "missing.pt"),
        ],
        capsys,
    )
    assert code == 2 and "CLIP checkpoint file is missing" in err
    assert not (tmp_path / "b" / "gate").exists()  # reported before the entity gate is fitted


def test_entity_eval_numbers_on_a_hand_made_case(wordnet):
    def pair(pid, captions, change_type=None):
        return ChangePair(
            pair_id=pid, before=Path("b.png"), after=Path("a.png"), captions=tuple(captions), change_type=change_type
        )

    pairs = [
        pair("1", ["the red car is gone", "a red car left"]),
        pair("2", ["a man with a bag appeared"]),
        pair("3", ["the white truck moved"]),
        pair("4", ["nothing has changed"], DISTRACTOR),
        pair("5", ["nothing has changed"]),
    ]
    table = {
        "1": [("red car", 0.9), ("car", 0.1)],
        "2": [("woman", 0.5), ("bag", 0.3)],
        "3": [("truck", 0.6), ("bus", 0.2)],
        "4": [("car", 1.0)],
        "5": [("car", 1.0)],
    }
    result = entity_eval.evaluate_entities(pairs, table, wordnet, k=2)
    assert result["evaluated"] == 3 and result["skipped"] == {"distractor": 1, "no_reference_entity": 1}
    # pair 1 exact hit; pair 2 hit only at rank 2 ("woman" is not the word "man"); pair 3 only contained
    assert result["top1"] == pytest.approx(1 / 3)
    assert result["topk"] == pytest.approx(2 / 3)
    assert result["top1_contained"] == pytest.approx(2 / 3)
    assert result["topk_contained"] == pytest.approx(1.0)
    assert result["distractors_with_entity"] == 1 and result["without_entity"] == 0
    assert "skipped: 1 distractor/no-change pairs (1 of them given an entity)" in entity_eval.format_table(result)
    gated = entity_eval.evaluate_entities(pairs, {**table, "3": [], "4": []}, wordnet, k=2)
    assert gated["distractors_with_entity"] == 0 and gated["without_entity"] == 1
    assert gated["top1_contained"] == pytest.approx(1 / 3)  # pair 3 without an entity is a miss
    with pytest.raises(DataError, match="no retrieved entities"):
        entity_eval.evaluate_entities(pairs, {"1": []}, wordnet)


def test_pairs_without_a_change_region_get_no_entity():
    """Both masks empty → no entity (the prompt then has none), instead of the whole image's best phrase."""
    from davir.preprocessing.retrievers import PairRegions, masked_region, retrieve_top_k

    class Constant:
        def score(self, pairs):
            return np.tile(np.array([0.2, 0.9, 0.5]), (len(pairs), 1))

    image = np.zeros((8, 8, 3), np.uint8)
    mask = np.zeros((8, 8), bool)
    mask[2:4, 2:4] = True
    changed = PairRegions("a", masked_region(image, None), masked_region(image, mask))
    unchanged = PairRegions("b", masked_region(image, np.zeros((8, 8), bool)), masked_region(image, None))
    result = retrieve_top_k(Constant(), [changed, unchanged], ["x", "y", "z"], 2)
    assert result == [[("y", 0.9), ("z", 0.5)], []]


# ---------------------------------------------------------------------------------------------------
# The entity gate: no entities for a change region where nothing the captions name changed
# ---------------------------------------------------------------------------------------------------


def gate_pairs(rng: np.random.Generator, count: int) -> tuple[list, list[bool]]:
    """Changed pairs (an object added, or recoloured in place) and unchanged ones (the same object shifted
    by 1-2 px, as a small camera move leaves it); the mask is the union of the object in both images."""
    pairs, names_entity = [], []
    colors = list(COLORS)
    for i in range(count):
        shape = ("square", "circle")[i % 2]
        color, other = rng.choice(colors, size=2, replace=False)
        center = (int(rng.integers(16, 48)), int(rng.integers(14, 34)))
        size = int(rng.integers(6, 10))
        after, after_mask = draw_shape(shape, color, center, size)
        kind = i % 3
        if kind == 0:  # add
            before, before_mask = np.full_like(after, BACKGROUND), np.zeros_like(after_mask)
        elif kind == 1:  # colour change
            before, before_mask = draw_shape(shape, other, center, size)
        else:  # no change: a shifted view of the same object
            shift = (int(rng.choice([-2, -1, 1, 2])), int(rng.choice([-2, -1, 1, 2])))
            before, before_mask = draw_shape(shape, color, (center[0] + shift[0], center[1] + shift[1]), size)
        union = after_mask | before_mask
        pairs.append(pair_regions(f"g{i}", before, after, PairMasks(union, union, {})))
        names_entity.append(kind != 2)
    return pairs, names_entity


def test_gate_features_are_both_descriptors_and_their_difference():
    rows = np.array([[1.0, -2.0, 0.5], [3.0, -2.5, 0.5]])
    np.testing.assert_array_equal(gate_features(rows), [1.0, -2.0, 0.5, 3.0, -2.5, 0.5, 2.0, 0.5, 0.0])


def test_entity_gate_withholds_entities_of_unchanged_regions(tmp_path):
    rng = np.random.default_rng(0)
    train, train_names = gate_pairs(rng, 60)
    test, test_names = gate_pairs(rng, 30)  # new positions, sizes and colours
    gate = EntityGate()
    gate.fit([pair_features(p) for p in train], train_names)
    assert gate.active and gate.training["pairs"] == 60
    assert gate.training["naming_an_entity"] == 40 and gate.training["naming_none"] == 20
    probability = gate.probability([pair_features(p) for p in test])
    assert (gate.keeps(test) == np.array(test_names)).all()
    assert probability[np.array(test_names)].min() > 0.5 > probability[~np.array(test_names)].max()

    class Constant:
        def score(self, pairs):
            return np.tile(np.array([0.2, 0.9, 0.5]), (len(pairs), 1))

    retrieved = retrieve_top_k(Constant(), test, ["x", "y", "z"], 1, gate=gate)
    assert retrieved == [[("y", 0.9)] if names else [] for names in test_names]
    assert all(retrieve_top_k(Constant(), test, ["x", "y", "z"], 1))  # without the gate every region gets one

    # JSON + npz, rebuilt without pickle, same probabilities
    gate.save(tmp_path / "gate")
    assert sorted(p.name for p in (tmp_path / "gate").iterdir()) == ["gate.json", "gate.npz"]
    loaded = EntityGate.load(tmp_path / "gate")
    np.testing.assert_allclose(loaded.probability([pair_features(p) for p in test]), probability)
    (tmp_path / "gate" / "gate.npz").write_bytes(b"truncated")
    with pytest.raises(DataError, match="unreadable entity gate"):
        EntityGate.load(tmp_path / "gate")


def test_entity_gate_stays_inactive_without_pairs_naming_none(tmp_path):
    """Spot-the-Diff-like fit splits: every pair with a region names an entity → the gate keeps all."""
    pairs, names = gate_pairs(np.random.default_rng(1), 30)
    changed = [p for p, n in zip(pairs, names) if n]
    empty = PairRegions(
        "e", masked_region(np.zeros((8, 8, 3), np.uint8), None), masked_region(np.zeros((8, 8, 3), np.uint8), None)
    )
    gate = EntityGate()
    gate.fit([pair_features(p) for p in [*changed, empty]], [True] * len(changed) + [False])
    assert not gate.active and "keeps every pair" in gate.training["inactive"]
    assert gate.training["without_region"] == 1 and gate.training["naming_none"] == 0  # the empty pair is left out
    assert gate.keeps(pairs).all()
    gate.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.json"]
    assert not EntityGate.load(tmp_path).active
    with pytest.raises(DataError, match="threshold"):
        EntityGate(threshold=1.5)


def test_entities_cli_gate_on_distractor_regions(dataset, tmp_path, capsys):
    """Masks that also cover part of each distractor pair: the fitted gate (default) withholds their
    entities, on the CLI and in caption.py's on-the-fly retrieval; --entity-gate none does not."""
    from davir.data import read_dataset
    from davir.data.images import load_pair
    from davir.preprocessing.online import OnlineEntities

    mask_cache = MaskCache(tmp_path / "masks")
    for split in ("train", "test"):
        for pair in read_dataset("clevr_change", dataset, split):
            masks = entities.GroundTruthMasks().read(pair)
            if pair.pair_id.endswith("_n"):  # a spurious region: the distractor only dims the image
                spurious = np.zeros((48, 64), bool)
                spurious[10:24, 20:36] = True
                masks = PairMasks(spurious, spurious, {})
            mask_cache.write(pair.pair_id, masks.before, masks.after, {})
    base = [
        "--format",
        "clevr_change",
        "--root",
        str(dataset),
        "--split",
        "test",
        "--no-progress",
        "--masks",
        str(tmp_path / "masks"),
    ]
    code, stdout, err = run_cli(entities, [*base, "--out", str(tmp_path / "gated")], capsys)
    assert code == 0, err
    assert json.loads(stdout)["withheld_by_gate"] == 4
    table = EntityCache(tmp_path / "gated").table()
    distractors = [k for k in table if k.endswith("_n")]
    assert len(distractors) == 4 and all(table[k] == [] for k in distractors)
    assert all(len(table[k]) == 5 for k in table if k not in distractors)
    manifest = read_json(tmp_path / "gated" / "entities" / "manifest.json")
    assert manifest["settings"]["entity_gate"] == "fitted" and manifest["settings"]["gate_threshold"] == 0.5
    assert manifest["splits"]["test"]["without_entity"] == 4
    assert manifest["entity_gate"]["active"] and manifest["entity_gate"]["training"]["naming_none"] == len(TRAIN)
    online = OnlineEntities(tmp_path / "gated")
    for pair in read_dataset("clevr_change", dataset, "test"):
        before, after = (np.asarray(image) for image in load_pair(pair))
        found = online(pair.pair_id, before, after, mask_cache.read(pair.pair_id), 5)
        assert [p for p, _ in found] == [p for p, _ in table[pair.pair_id]]

    code, stdout, err = run_cli(entities, [*base, "--out", str(tmp_path / "ungated"), "--entity-gate", "none"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["withheld_by_gate"] == 0
    assert all(len(items) == 5 for items in EntityCache(tmp_path / "ungated").table().values())
    assert not (tmp_path / "ungated" / "gate").exists()
    # a rerun with another threshold is refused; bad thresholds and a gate without regions are errors
    code, _, err = run_cli(entities, [*base, "--out", str(tmp_path / "gated"), "--gate-threshold", "0.7"], capsys)
    assert code == 2 and "gate_threshold" in err
    code, _, err = run_cli(entities, [*base, "--out", str(tmp_path / "x"), "--gate-threshold", "1.5"], capsys)
    assert code == 2 and "--gate-threshold must lie in [0, 1]" in err
    code, _, err = run_cli(
        entities, [*base[:-2], "--out", str(tmp_path / "y"), "--image-level", "--entity-gate", "fitted"], capsys
    )
    assert code == 2 and "--image-level has none" in err


# ---------------------------------------------------------------------------------------------------
# CHEER §4.8: image-level retrieval (whole frames, |S_bef − S_aft|, mean constraint, top-K)
# ---------------------------------------------------------------------------------------------------

# Five entities. Means: S_bef 2.35 / 5 = 0.47, S_aft 2.0 / 5 = 0.40. Entity 3 has the largest
# difference (0.45) but is below both means (0.45 < 0.47, 0.0 < 0.40), so the constraint drops it;
# entity 4 (0.3 < 0.47, 0.25 < 0.40) is ineligible too. Entity 1 is more similar to the after image.
S_BEF = np.array([0.8, 0.1, 0.7, 0.45, 0.3])
S_AFT = np.array([0.8, 0.5, 0.45, 0.0, 0.25])


def ranked(result):
    return [index for index, _ in result], [score for _, score in result]


def test_cheer_ranking_abs_and_mean_constraint():
    from davir.preprocessing.retrievers import cheer_rank_entities

    # |S_bef − S_aft| = [0, 0.4, 0.25, 0.45, 0.05]; unconstrained the order would be 3, 1, 2, 4, 0
    indices, scores = ranked(cheer_rank_entities(S_BEF, S_AFT, 3))
    assert indices == [1, 2, 0]
    assert scores == pytest.approx([0.4, 0.25, 0.0])
    # without the constraint entity 3 would win: check it is the mean test that removes it
    unconstrained = np.argsort(-np.abs(S_BEF - S_AFT), kind="stable")
    assert unconstrained[0] == 3


def test_cheer_ranking_bef_minus_aft_is_eq1_as_written():
    from davir.preprocessing.retrievers import cheer_rank_entities

    # S_bef − S_aft = [0, −0.4, 0.25, 0.45, 0.05]: the constraint again drops entity 3 (the argmax of
    # Eq. 1 without it), and the "added" entity 1 falls to last among the eligible ones
    indices, scores = ranked(cheer_rank_entities(S_BEF, S_AFT, 3, sign="bef_minus_aft"))
    assert indices == [2, 0, 1]
    assert scores == pytest.approx([0.25, 0.0, -0.4])
    with pytest.raises(ValueError, match="sign must be one of"):
        cheer_rank_entities(S_BEF, S_AFT, 3, sign="aft_minus_bef")


def test_cheer_ranking_pads_with_the_best_ineligible_entities():
    from davir.preprocessing.retrievers import cheer_rank_entities

    # 3 eligible entities, k = 4 and 5: padded with entity 3 (0.45), then 4 (0.05), after all eligible ones
    assert ranked(cheer_rank_entities(S_BEF, S_AFT, 4))[0] == [1, 2, 0, 3]
    indices, scores = ranked(cheer_rank_entities(S_BEF, S_AFT, 5))
    assert indices == [1, 2, 0, 3, 4] and scores == pytest.approx([0.4, 0.25, 0.0, 0.45, 0.05])
    # a vocabulary smaller than k: all of it
    assert ranked(cheer_rank_entities(S_BEF, S_AFT, 7))[0] == [1, 2, 0, 3, 4]
    # "exceeds its mean" is strict: equal similarities leave no entity eligible → pure padding, vocabulary order
    flat = np.array([0.3, 0.3, 0.3])
    assert cheer_rank_entities(flat, flat, 2) == [(0, 0.0), (1, 0.0)]


def image_level_argv(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--format",
        "clevr_change",
        "--root",
        str(dataset),
        "--split",
        "test",
        "--no-progress",
        "--out",
        str(out),
        "--image-level",
        "--retriever",
        "fitted",
        "--top-k",
        "3",
        *extra,
    ]


def test_entities_cli_image_level_fitted(dataset, tmp_path, capsys):
    from davir.data import read_dataset
    from davir.data.images import load_pair
    from davir.preprocessing.online import OnlineEntities
    from davir.preprocessing.retrievers import cheer_rank_entities

    out = tmp_path / "cheer"
    code, stdout, err = run_cli(entities, image_level_argv(dataset, out), capsys)
    assert code == 0, err
    assert json.loads(stdout)["written"] == 8
    table = EntityCache(out).table()
    vocabulary = read_json(out / "vocab.json")["phrases"]
    assert len(vocabulary) == 6 and len(table) == 8
    # every pair, distractors included, gets exactly K = 3 distinct vocabulary entities (no masks → no "no entity")
    for _pair_id, items in table.items():
        assert len(items) == 3 and len({p for p, _ in items}) == 3 and {p for p, _ in items} <= set(vocabulary)

    manifest = read_json(out / "entities" / "manifest.json")
    settings = manifest["settings"]
    assert settings["retrieval"] == "image" and settings["image_score"] == "abs" and settings["top_k"] == 3
    assert "masks" not in settings and "fit_masks" not in settings
    assert manifest["retriever"]["training"]["input"] == "whole_frame"
    assert manifest["retriever"]["training"]["pairs"] == len(TRAIN)

    # the stored entities are cheer_rank_entities of the stored retriever's whole-frame scores
    retriever = FittedRetriever.load(out / "retriever")
    test_pairs = read_dataset("clevr_change", dataset, "test")
    for pair in test_pairs:
        before, after = (np.asarray(image) for image in load_pair(pair))
        s_bef, s_aft = retriever.frame_scores([before, after])
        expected = [(vocabulary[i], s) for i, s in cheer_rank_entities(s_bef, s_aft, 3)]
        assert [p for p, _ in table[pair.pair_id]] == [p for p, _ in expected]
        assert [s for _, s in table[pair.pair_id]] == pytest.approx([s for _, s in expected])
        # caption.py's on-the-fly retrieval from the same cache gives the same entities, without masks
        online = OnlineEntities(out)
        assert not online.needs_masks
        assert [p for p, _ in online(pair.pair_id, before, after, None, 3)] == [p for p, _ in expected]
    # the only difference between the frames of a semantic test pair is the added object: its colour
    # word is in the best entity (the whole-frame descriptors carry colour, not the object's shape)
    for index in TEST:
        color = SCENES[index][1]
        assert table[f"{index:06d}.png"][0][0].split()[0] == color

    # a region-level run into the same cache is refused, naming the mode
    code, _, err = run_cli(
        entities,
        [
            "--format",
            "clevr_change",
            "--root",
            str(dataset),
            "--split",
            "test",
            "--no-progress",
            "--out",
            str(out),
            "--masks",
            "gt",
            "--top-k",
            "3",
        ],
        capsys,
    )
    assert code == 2 and "retrieval" in err


def test_entities_cli_masks_required_only_at_region_level(dataset, tmp_path, capsys):
    base = [
        "--format",
        "clevr_change",
        "--root",
        str(dataset),
        "--split",
        "test",
        "--no-progress",
        "--out",
        str(tmp_path / "x"),
    ]
    code, _, err = run_cli(entities, base, capsys)
    assert code == 2 and "--masks is required" in err and "--image-level" in err
    code, _, err = run_cli(entities, [*base, "--image-level", "--masks", "gt"], capsys)
    assert code == 2 and "uses no masks" in err
    code, _, err = run_cli(entities, [*base, "--masks", "gt", "--image-score", "abs"], capsys)
    assert code == 2 and "--image-score applies only with --image-level" in err
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_clip_frame_scores_are_cosines_of_whole_frames(tiny_clip):
    import open_clip
    import torch
    from PIL import Image

    name, checkpoint, config = tiny_clip
    phrases = ["red square", "blue circle", "car"]
    retriever = ClipRetriever(name, checkpoint, config=config, device="cpu")
    retriever.prepare(phrases)
    before = np.full((48, 64, 3), BACKGROUND, np.uint8)
    after = draw_shape("circle", "blue", (40, 25), 10)[0]
    scores = retriever.frame_scores([before, after])

    model, _, preprocess = open_clip.create_model_and_transforms(name)
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    with torch.no_grad():
        text = model.encode_text(open_clip.get_tokenizer(name)([f"a photo of {p}" for p in phrases])).numpy()
        image = model.encode_image(
            torch.stack([preprocess(Image.fromarray(square_pad(f))) for f in (before, after)])
        ).numpy()
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    np.testing.assert_allclose(scores, image @ text.T, atol=1e-5)


def test_image_level_vocabulary_holds_the_captions_subjects():
    """CHEER §4.8 (issue 16): `--image-level` builds the entity vocabulary from each caption's subject phrase."""
    from davir.jobs.entities import SubjectExtractor
    from davir.text.entity_vocabulary import build_vocabulary
    from davir.text.extractors import get_extractor

    captions = [
        "the man is standing next to the car",
        "the man has moved near the car",
        "a woman with an umbrella has appeared",
        "the woman with the umbrella is gone",
    ]
    base = get_extractor("auto", corpus=captions)
    every = build_vocabulary(captions, min_count=2, extractor=base)
    subjects = build_vocabulary(captions, min_count=2, extractor=SubjectExtractor(base))
    assert "car" in every.phrases and "umbrella" in every.phrases
    assert "car" not in subjects.phrases and "umbrella" not in subjects.phrases
    assert "man" in subjects.phrases and subjects.extractor["entities"] == "subjects"
