"""The tiny pretrained backbone (issue 16): cell labels, the pretraining command, loading through
`preprocess features --weights`, the shipped asset, and the random-init ResNet-101 without zeroed branches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from davir.data.synthetic import SynthConfig, generate_dataset
from davir.models.resnet_layout import backbone_from_state_dict, random_backbone, resnet_layout
from davir.pretrain_backbone.train import ATTRIBUTES, CellClassifier, cell_labels, main
from preprocess.features import build_backbone

ASSET = Path(__file__).resolve().parents[1] / "assets" / "tiny_resnet"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cell_labels_by_hand():
    # 140×140 image → 10-pixel cells; a far box over cells (1..3, 1..3) and a near one over (2..4, 2..4)
    far = {"box": [10, 10, 40, 40], "depth_order": 1, "color": "red", "shape": "cube", "material": "metal",
           "size": "large"}
    near = {"box": [20, 20, 50, 50], "depth_order": 0, "color": "blue", "shape": "sphere", "material": "rubber",
            "size": "small"}
    labels = cell_labels([near, far], 140, 140)
    color = labels[list(ATTRIBUTES).index("color")]
    red, blue = 1 + ATTRIBUTES["color"].index("red"), 1 + ATTRIBUTES["color"].index("blue")
    assert color[1, 1] == red and color[1, 3] == red and color[3, 1] == red  # only the far box
    assert color[2, 2] == blue and color[3, 3] == blue and color[4, 4] == blue  # the near box wins
    assert color[0, 0] == 0 and color[5, 5] == 0 and (color > 0).sum() == 9 + 9 - 4 + 0  # 3×3 + 3×3 − overlap 2×2
    shape = labels[list(ATTRIBUTES).index("shape")]
    assert shape[1, 1] == 1 + ATTRIBUTES["shape"].index("cube") and shape[4, 4] == 1 + ATTRIBUTES["shape"].index("sphere")


def test_pretrain_command_writes_weights_that_preprocess_features_loads(tmp_path):
    data = tmp_path / "set"
    generate_dataset(data, SynthConfig(scenes=6, seed=5, width=128, height=96), workers=1)
    out = tmp_path / "bb"
    assert main(["--data", str(data), "--out", str(out), "--max-steps", "2", "--minutes", "5", "--batch-size", "2",
                 "--eval-every", "1", "--eval-scenes", "1"]) == 0
    info = json.loads((out / "pretrain_info.json").read_text())
    assert [point["step"] for point in info["curve"]] == [0, 1, 2]
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


def test_shipped_backbone_loads_and_is_small():
    path = ASSET / "backbone.pth"
    assert path.stat().st_size < 20 * 2 ** 20
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
