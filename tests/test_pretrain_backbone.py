"""The tiny pretrained backbone (issue 16): cell labels, the pretraining command, loading through
`preprocess features --weights`, the shipped asset, and the random-init ResNet-101 without zeroed branches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from davir.cli.pretrain_backbone import main
from davir.config import ConfigError
from davir.data.synthetic import SynthConfig, generate_dataset
from davir.jobs.features import build_backbone
from davir.models.resnet_layout import backbone_from_state_dict, random_backbone, resnet_layout
from davir.pretrain_backbone.train import (
    ATTRIBUTES,
    CellClassifier,
    PretrainSettings,
    ProbeSettings,
    cell_labels,
    probe_backbone,
)

ASSET = Path(__file__).resolve().parents[1] / "davir" / "assets" / "tiny_resnet"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cell_labels_by_hand():
    # 140×140 image → 10-pixel cells; a far box over cells (1..3, 1..3) and a near one over (2..4, 2..4)
    far = {
        "box": [10, 10, 40, 40],
        "depth_order": 1,
        "color": "red",
        "shape": "cube",
        "material": "metal",
        "size": "large",
    }
    near = {
        "box": [20, 20, 50, 50],
        "depth_order": 0,
        "color": "blue",
        "shape": "sphere",
        "material": "rubber",
        "size": "small",
    }
    labels = cell_labels([near, far], 140, 140)
    color = labels[list(ATTRIBUTES).index("color")]
    red, blue = 1 + ATTRIBUTES["color"].index("red"), 1 + ATTRIBUTES["color"].index("blue")
    assert color[1, 1] == red and color[1, 3] == red and color[3, 1] == red  # only the far box
    assert color[2, 2] == blue and color[3, 3] == blue and color[4, 4] == blue  # the near box wins
    assert color[0, 0] == 0 and color[5, 5] == 0 and (color > 0).sum() == 9 + 9 - 4 + 0  # 3×3 + 3×3 − overlap 2×2
    shape = labels[list(ATTRIBUTES).index("shape")]
    assert shape[1, 1] == 1 + ATTRIBUTES["shape"].index("cube") and shape[4, 4] == 1 + ATTRIBUTES["shape"].index(
        "sphere"
    )


def test_pretrain_command_writes_weights_that_preprocess_features_loads(tmp_path):
    data = tmp_path / "set"
    generate_dataset(data, SynthConfig(scenes=6, seed=5, width=128, height=96), workers=1)
    out = tmp_path / "bb"
    assert (
        main(
            [
                "--data",
                str(data),
                "--out",
                str(out),
                "--max-steps",
                "2",
                "--minutes",
                "5",
                "--batch-size",
                "2",
                "--eval-every",
                "1",
                "--eval-scenes",
                "1",
            ]
        )
        == 0
    )
    info = json.loads((out / "pretrain_info.json").read_text())
    assert [point["step"] for point in info["curve"]] == [0, 1, 2]
    assert info["command"] == (
        f"python -m davir.pretrain_backbone --data {data} --out {out} --max-steps 2 --minutes 5 "
        "--batch-size 2 --eval-every 1 --eval-scenes 1"
    )
    assert info["settings"] == {
        "data": str(data),
        "out": str(out),
        "minutes": 5.0,
        "max_steps": 2,
        "batch_size": 2,
        "crop_cells": 7,
        "lr": 2e-3,
        "seed": 0,
        "threads": 1,
        "eval_every": 1,
        "eval_scenes": 1,
        "train_limit": None,
    }
    assert info["layout"]["blocks"] == [1, 1, 1]
    state = torch.load(out / "backbone.pth", weights_only=True)
    assert not any(k.startswith(("fc.", "layer4.")) for k in state)
    backbone = build_backbone(out / "backbone.pth")
    image = torch.randn(1, 3, 224, 224)
    assert backbone(image).shape == (1, 1024, 14, 14)
    model = CellClassifier()
    model.net.load_state_dict(state, strict=False)
    model.eval()
    assert torch.allclose(model.backbone(image), backbone(image))


def test_cli_reports_a_missing_set(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"), "--max-steps", "1"]) == 2
    assert "nothing" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("eval_every", 0, "eval_every: must be ≥ 1, got 0"),
        ("crop_cells", 15, r"crop_cells: must be in \[1, 14\], got 15"),
        ("minutes", 0, "minutes: must be > 0, got 0"),  # no step trained, the random weights saved, exit 0
        ("lr", -1.0, "lr: must be > 0, got -1"),  # AdamW's ValueError traceback
        ("lr", float("nan"), "lr: must be > 0, got nan"),
        ("lr", float("inf"), "lr: must be a finite number, got inf"),  # NaN weights, exit 0
    ],
)
def test_settings_out_of_range_name_the_field(tmp_path, capsys, field, value, message):
    with pytest.raises(ConfigError, match=message):
        PretrainSettings(data=tmp_path, out=tmp_path / "o", **{field: value})
    assert (
        main(["--data", str(tmp_path), "--out", str(tmp_path / "o"), f"--{field.replace('_', '-')}", str(value)]) == 2
    )
    assert capsys.readouterr().err.startswith(f"error: {field}: must be")


def test_probe_from_python_fits_every_attribute_on_the_shipped_backbone(tmp_path):
    data = tmp_path / "set"
    generate_dataset(data, SynthConfig(scenes=6, seed=5, width=128, height=96), workers=1)
    result = probe_backbone(ProbeSettings(data=data, weights=ASSET / "backbone.pth", scenes=3))
    assert result["weights"] == str(ASSET / "backbone.pth") and result["data"] == str(data)
    assert result["train_cells"] > 0 and result["test_cells"] > 0
    assert result["object_vs_floor"] > 0.9  # the shipped backbone tells objects from floor
    assert all(0.0 <= result[name] <= 1.0 and 0.0 < result[f"{name}_majority"] <= 1.0 for name in ATTRIBUTES)


def test_shipped_backbone_loads_and_is_small():
    path = ASSET / "backbone.pth"
    assert path.stat().st_size < 20 * 2**20
    state = torch.load(path, weights_only=True)
    assert resnet_layout(state) == ([1, 1, 1], 32)
    info = json.loads((ASSET / "pretrain_info.json").read_text())
    assert info["data"]["config"]["seed"] != 0  # not the demo's set
    assert info["curve"][-1]["color"] > 0.9 and info["curve"][-1]["object_vs_floor"] > 0.95
    features = backbone_from_state_dict(state).eval()(torch.randn(1, 3, 224, 224))
    assert features.shape == (1, 1024, 14, 14) and bool(torch.isfinite(features).all())


def test_random_resnet101_branches_contribute_and_stay_in_fp16_range():
    torch.manual_seed(0)
    backbone = random_backbone(0).eval()
    blocks = [m for m in backbone.modules() if m.__class__.__name__ == "Bottleneck"]
    assert len(blocks) == 3 + 4 + 23 and all(float(b.bn3.weight.detach().abs().min()) > 0 for b in blocks)
    image = torch.zeros(1, 3, 224, 224)
    with torch.no_grad():
        base = backbone(image)
        image[0, :, 100:104, 100:104] = 2.0  # a 4-pixel patch reaches cells well beyond an 11-pixel field
        changed = backbone(image)
    moved = (changed - base).abs().sum(1)[0] > 1e-4
    assert int(moved.sum()) >= 9
    assert float(changed.abs().max()) < 6e4
    rows, cols = np.nonzero(moved.numpy())
    assert rows.max() - rows.min() >= 2 and cols.max() - cols.min() >= 2


def test_flags_before_the_train_command_are_kept(tmp_path, capsys):
    """`--data D --out O train` (the flags, then the command its help lists) stopped with "--data and --out are
    required": the train subcommand's defaults set both back to None. Flags on either side are kept now."""
    from davir.cli.pretrain_backbone import build_parser

    args = build_parser().parse_args(["--data", "D", "--out", "O", "--max-steps", "3", "train", "--lr", "0.1"])
    assert (args.data, args.out, args.max_steps, args.lr, args.minutes) == ("D", "O", 3, 0.1, 15.0)
    args = build_parser().parse_args(["train", "--data", "D", "--out", "O"])
    assert (args.data, args.out, args.max_steps, args.batch_size) == ("D", "O", 0, 24)
    assert main(["--data", str(tmp_path / "absent"), "--out", str(tmp_path / "o"), "train"]) == 2
    err = capsys.readouterr().err
    assert "required" not in err and str(tmp_path / "absent") in err


def test_flags_before_the_probe_command_are_kept_or_refused(tmp_path, capsys):
    """`--data D probe` stopped with "the following arguments are required: --data", and `--seed 3 --threads 2 probe
    --data D` probed with seed 0 on 1 thread: probe's defaults set the flags given before it back (as train's did).
    Its --data, --seed and --threads are kept on either side now; a training flag before probe (`--out O probe`,
    which it dropped without a word) is a usage error naming it."""
    from davir.cli.pretrain_backbone import build_parser

    args = build_parser().parse_args(["--data", "D", "--seed", "3", "--threads", "2", "probe", "--scenes", "4"])
    assert (args.command, args.data, args.seed, args.threads, args.scenes, args.weights) == (
        "probe",
        "D",
        3,
        2,
        4,
        None,
    )
    args = build_parser().parse_args(["--seed", "3", "probe", "--data", "D", "--seed", "5"])
    assert (args.data, args.seed, args.threads, args.scenes) == ("D", 5, 1, 150)
    args = build_parser().parse_args(["probe", "--data", "D"])
    assert (args.data, args.seed, args.threads) == ("D", 0, 1)
    assert main(["--data", str(tmp_path / "absent"), "probe", "--scenes", "2"]) == 2
    err = capsys.readouterr().err
    assert "required" not in err and str(tmp_path / "absent") in err

    for argv, message in [
        (
            ["--out", "O", "probe", "--data", "D"],
            "--out (given before probe) is a flag of training, which probe does not take; "
            "probe takes --data, --weights, --seed, --scenes, --threads",
        ),
        (["--min", "3", "--data", "D", "probe"], "--minutes (given before probe) is a flag of training"),
        (["--seed", "3", "probe"], "the following arguments are required: --data"),
    ]:
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.splitlines()[-1].startswith(f"python -m davir.pretrain_backbone probe: error: {message}"), err


def test_out_is_never_a_folder_of_other_files(tmp_path, capsys):
    """--out a folder this command did not write (a pretrain_tiny model, whose pretrain_info.json it replaced with
    its own; the synthetic set itself; a user's backbone.pth) was written into at the first evaluation, and --out a
    file stopped there with a FileExistsError traceback. Both are refused before the data is read (exit 2)."""
    tiny = tmp_path / "tiny model"
    tiny.mkdir()
    (tiny / "pretrain_info.json").write_text('{"describe_prompt": "Describe the image."}\n')
    (tiny / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "a_file").write_text("mine\n")
    for out, message in [
        (
            tiny,
            f"--out {tiny} holds files that python -m davir.pretrain_backbone did not write (no pretrain_info.json "
            "of its own), where its backbone.pth, head.pth, pretrain_info.json would go; give a new or empty folder",
        ),
        (tmp_path / "a_file", f"--out {tmp_path / 'a_file'} cannot be used: {tmp_path / 'a_file'} is a file"),
    ]:
        assert main(["--data", str(tmp_path / "absent"), "--out", str(out), "--max-steps", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1
    assert (tiny / "pretrain_info.json").read_text() == '{"describe_prompt": "Describe the image."}\n'
    ours = tmp_path / "ours"  # a folder it wrote is written again (the data, absent here, stops it)
    ours.mkdir()
    (ours / "pretrain_info.json").write_text('{"layout": {}}\n')
    assert main(["--data", str(tmp_path / "absent"), "--out", str(ours), "--max-steps", "1"]) == 2
    assert "absent" in capsys.readouterr().err


def test_every_option_says_what_it_takes():
    from davir.cli.pretrain_backbone import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    parsers = (parser, commands["train"], commands["probe"])
    assert [action.dest for p in parsers for action in p._actions if not action.help] == []
