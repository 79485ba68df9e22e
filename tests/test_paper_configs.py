"""The papers' configs run the papers' versions (issue 35): every departure from a printed value is named.

The switches and their printed values are listed once, in davir.models.lightweight.paper_values. A paper config
(configs/<method>_<benchmark>.yaml, configs/davir_*.yaml) may depart from one only on a line of its own that sets
the key and carries the switch's tag (`# [D]` ours, `# [C]` the released code's) with its reason; the demo and
folder configs obey the same rule. The library defaults are the printed values, so a config that names nothing
runs the paper's version.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from davir.config import load_config
from davir.models.lightweight import LightweightConfig
from davir.models.lightweight.paper_values import SWITCHES, Departure, departures
from davir.models.losses import FacConfig
from davir.preprocessing.profiles import entity_profile
from davir.runs.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
LIGHTWEIGHT = ("subtraction", "scorer", "dirl", "rdd", "cheer")
BENCHMARKS = ("clevr_change", "clevr_dc", "spot_the_diff", "ier", "levir_cc")
# davir_folder.yaml is DAVIR with the paper's App. B settings on the user's pairs: held to the paper's rule too.
PAPER_CONFIGS = sorted(
    [CONFIGS / f"{m}_{b}.yaml" for m in LIGHTWEIGHT for b in BENCHMARKS if (CONFIGS / f"{m}_{b}.yaml").is_file()]
    + list(CONFIGS.glob("davir_*.yaml"))
)
OTHER_CONFIGS = sorted(set(CONFIGS.glob("*.yaml")) - set(PAPER_CONFIGS))
KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_]\w*):(?P<rest>.*)$")


def named_lines(text: str) -> dict[str, str]:
    """{dotted path: inline comment} of every key set on a line of its own (block YAML; flow mappings name none)."""
    found, stack = {}, []
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([key for _, key in stack] + [match["key"]])
        value, _, comment = match["rest"].partition("#")
        if value.strip():
            found[path] = comment
        else:
            stack.append((indent, match["key"]))
    return found


def unnamed(config: TrainConfig, text: str) -> list[Departure]:
    """The departures of `config` that `text` does not set on a line of their own with the switch's tag."""
    lines = named_lines(text)
    return [d for d in departures(config) if d.tag not in lines.get(d.path, "")]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_a_paper_config_names_every_departure_from_the_printed_values(path):
    config = load_config(TrainConfig, path)
    assert unnamed(config, path.read_text()) == []


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_a_paper_config_runs_the_printed_version_of_each_issue_35_switch(path):
    """The switches the issue found inherited silently: each at the paper's value, or named (none is, today)."""
    config = load_config(TrainConfig, path)
    named = named_lines(path.read_text())
    expected = {
        "davir": {"model.fac.attn_norm": "softmax", "model.fac.mask_source": "after_only"},
        "dirl": {"lightweight.dirl_pairs": "all"},
        "rdd": {
            "lightweight.rdd_gde_residual": "none",
            "lightweight.acr_mask_duplicates": False,
            "lightweight.rdd_fusion": "concat",
        },
        "cheer": {
            "lightweight.gate_loss_on": "logits",
            "lightweight.enhance_temperature": None,
            "lightweight.decoder_gate_sigmoid": False,
            "lightweight.cheer_fusion_relu": False,
            "data.preprocessing_profile": "paper",
        },
    }.get(config.method, {})
    if config.method != "davir":
        expected["lightweight.frontend_init"] = "paper"
    for key, value in expected.items():
        switch = next(s for s in SWITCHES if s.path == key and config.method in s.methods)
        assert switch.value(config) == value or key in named, (path.name, key)


@pytest.mark.parametrize("path", OTHER_CONFIGS, ids=lambda p: p.stem)
def test_a_demo_or_folder_config_names_every_departure_too(path):
    """The [D]s the demo and folder configs run are opt-in and visible: each on its own line, tagged, with a reason."""
    config = load_config(TrainConfig, path)
    assert unnamed(config, path.read_text()) == []
    reasons = {d.path: named_lines(path.read_text())[d.path].replace(d.tag, "").strip() for d in departures(config)}
    assert all(len(reason) > 15 for reason in reasons.values()), reasons  # the tag and its reason, not a bare tag


def test_the_check_catches_a_planted_departure():
    path = CONFIGS / "scorer_clevr_change.yaml"
    text = path.read_text()
    config = load_config(TrainConfig, path)
    assert departures(config) and unnamed(config, text) == []  # the StepLR schedule is a named [D]
    planted = text.replace("  heads: 8  # [P]\n", "  heads: 8  # [P]\n  frontend_init: scaled\n")
    assert planted != text
    found = unnamed(load_config(TrainConfig, path, ["lightweight.frontend_init=scaled"]), planted)
    assert [(d.path, d.value, d.printed) for d in found] == [("lightweight.frontend_init", "scaled", "paper")]
    tagged = planted.replace("frontend_init: scaled\n", "frontend_init: scaled  # [D] planted, with a reason\n")
    assert unnamed(load_config(TrainConfig, path, ["lightweight.frontend_init=scaled"]), tagged) == []
    wrong_tag = planted.replace("frontend_init: scaled\n", "frontend_init: scaled  # [C] not the released code's\n")
    assert len(unnamed(load_config(TrainConfig, path, ["lightweight.frontend_init=scaled"]), wrong_tag)) == 1
    # A value inherited from anywhere but the file (here: a library default that moved off the paper's) is caught.
    inherited = dataclasses.replace(config, lightweight=dataclasses.replace(config.lightweight, dropout=0.0))
    assert [d.path for d in unnamed(inherited, text)] == ["lightweight.dropout"]
    # FAC in a flow mapping is not a line of its own: a departure there is caught as well.
    davir = CONFIGS / "davir_clevr_change.yaml"
    flow = davir.read_text().replace("attn_norm: softmax", "attn_norm: sum  # [D] hidden in a flow mapping")
    found = unnamed(load_config(TrainConfig, davir, ["model.fac.attn_norm=sum"]), flow)
    assert [d.path for d in found] == ["model.fac.attn_norm"]


@pytest.mark.parametrize("method", LIGHTWEIGHT + ("davir",))
def test_the_library_defaults_are_the_printed_values(method):
    """A config that names nothing runs the paper's version: every model switch defaults to the printed value
    (the trainer's defaults are DAVIR's; the lightweight paper configs set theirs)."""
    config = load_config(TrainConfig, None, [f"method={method}"])
    assert [d for d in departures(config) if d.path.startswith(("lightweight.", "model."))] == []
    assert (FacConfig().attn_norm, FacConfig().mask_source) == ("softmax", "after_only")


def test_every_switch_reads_a_real_setting_and_is_in_the_departures_table():
    table = (REPO / "docs" / "paper_departures.md").read_text()
    for switch in SWITCHES:
        for method in switch.methods:
            config = load_config(TrainConfig, None, [f"method={method}"])
            switch.value(config)  # an AttributeError names a switch that no longer exists
        assert re.search(rf"`([\w.]+\.)?{switch.path.rsplit('.', 1)[-1]}`", table), switch.path
    assert {s.otherwise for s in SWITCHES} == {"[D]", "[C]"}
    assert LightweightConfig(method="dirl").dirl_correlation == "cosine"  # Eq. 3 as printed; [C] zscore is opt-in


def test_cheer_paper_configs_rank_entities_by_eq1_with_clip():
    for path in sorted(CONFIGS.glob("cheer_*.yaml")):
        if path.stem.split("_", 1)[1] not in BENCHMARKS:
            continue
        text = path.read_text()
        assert load_config(TrainConfig, path).data.preprocessing_profile == "paper"
        for flag in (
            "--profile paper",
            "--image-level",
            "--top-k 3",
            "--retriever clip",
            "--image-score bef_minus_aft",
        ):
            assert flag in text, (path.name, flag)
    # the profile a cache of that command records, and of the toolkit's ranking
    assert entity_profile({"retrieval": "image", "retriever": "clip", "image_score": "bef_minus_aft"}) == "paper"
    assert entity_profile({"retrieval": "image", "retriever": "fitted", "image_score": "abs"}) == "custom"
    assert entity_profile({"retrieval": "image", "retriever": "clip", "image_score": "abs"}) == "custom"


def test_preprocess_paper_profile_fills_eq1_for_image_level_entities():
    from davir.jobs.entities import apply_profile, build_parser

    base = ["--format", "clevr_change", "--root", "R", "--split", "train", "--out", "O", "--image-level"]
    args = build_parser().parse_args([*base, "--profile", "paper"])
    assert apply_profile(args) == {} and (args.retriever, args.image_score) == ("clip", "bef_minus_aft")
    args = build_parser().parse_args(base)  # the toolkit's: the fitted retriever by |S_bef − S_aft| [D]
    assert apply_profile(args) == {} and (args.retriever, args.image_score) == ("fitted", "abs")
    args = build_parser().parse_args([*base, "--profile", "paper", "--image-score", "abs"])
    assert apply_profile(args) == {"image_score": ("bef_minus_aft", "abs")}  # recorded as a deviation


def test_each_value_a_config_copies_from_a_methods_paper_row_equals_the_row():
    """The paper configs write out the rows each method registers (PAPER_ROWS in its module, read by paper_settings):
    a line tagged `paper_settings('m', 'd')` holds that row's value, so a row and its copy cannot drift apart."""
    import yaml

    from davir.models.lightweight.config import paper_settings

    tagged = re.compile(r"^\s*(\w+):\s*(\S+)\s*#.*paper_settings\('(\w+)', '(\w+)'\)")
    checked = 0
    for path in sorted(CONFIGS.glob("*.yaml")):
        for line in path.read_text().splitlines():
            match = tagged.match(line)
            if match:
                key, value, method, dataset = match.groups()
                model, trainer = paper_settings(method, dataset)
                assert yaml.safe_load(value) == {**model, **trainer}[key], (path.name, line)
                checked += 1
    assert checked >= 50
