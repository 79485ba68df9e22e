"""The model card (`README.md`) of an exported folder, written from the run: base model, data, training
settings, the evaluation tables of the run's metrics.json files, the command that reproduced it, the licence,
how to caption with it and how to publish it (`huggingface_hub.upload_folder`, which is not reachable here).

The card's YAML header is the Hugging Face Hub's model-card metadata (license, base_model, library_name,
pipeline_tag, tags)."""

from __future__ import annotations

import shlex

import yaml

METRIC_COLUMNS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


def _score(value) -> str:
    return "n/a" if value is None else f"{100 * float(value):.1f}"


def metrics_table(metrics: dict) -> str:
    """A markdown table of one metrics.json's rows (scores ×100, as papers print them; CIDEr is CIDEr-D)."""
    rows = metrics.get("rows") or {}
    lines = ["| rows | " + " | ".join(METRIC_COLUMNS) + " | pairs |", "|---|" + "---:|" * (len(METRIC_COLUMNS) + 1)]
    for name, row in rows.items():
        scores = row.get("metrics") or {}
        lines.append(
            f"| {name} | "
            + " | ".join(_score(scores.get(c)) for c in METRIC_COLUMNS)
            + f" | {row.get('num_pairs', '')} |"
        )
    return "\n".join(lines)


def _yaml_header(fields: dict) -> str:
    """The Hub's metadata block, written by a YAML dumper: a licence with a newline or a base named `tiny: v1`
    stays one quoted value."""
    kept = {key: value for key, value in fields.items() if value is not None}
    return "---\n" + yaml.safe_dump(kept, sort_keys=False, allow_unicode=True, default_flow_style=False) + "---\n"


def _settings_lines(settings: dict) -> list[str]:
    return [f"- {key}: `{value}`" for key, value in settings.items() if value not in (None, {}, [])]


def plain_transformers_snippet(model: dict, decoding: dict) -> list[str]:
    """Lines of the card: caption one pair with plain transformers as davir does (tests/test_export_faults.py
    runs them for every chat family): S×S pictures, davir's prompt in one user turn, davir's decoding."""
    config = model.get("config") or {}
    epc = config.get("epc") or {}
    prompt = str(epc.get("prompt", "")).strip()
    cls = model["model_class"]
    return [
        "With plain transformers (no davir), a pair is captioned as davir captions it by these lines:",
        "",
        "```python",
        "from PIL import Image",
        f"from transformers import AutoProcessor, {cls}",
        "",
        f'model = {cls}.from_pretrained("THIS_FOLDER").eval()',
        'processor = AutoProcessor.from_pretrained("THIS_FOLDER")',
        f"S = {model['image_size']}  # davir resizes every picture to S×S (bicubic) before the processor",
        'pictures = [Image.open(p).convert("RGB").resize((S, S), Image.Resampling.BICUBIC)',
        '            for p in ("before.png", "after.png")]',
        f"prompt = {prompt!r}"
        + (
            f"  # EPC: + ' {epc.get('entity_prefix')} <entity>.' (preprocessing/entities)"
            if epc.get("use_entities")
            else ""
        ),
        'turn = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, '
        '{"type": "text", "text": prompt}]}]',
        "text = processor.apply_chat_template(turn, add_generation_prompt=True)",
        "bos = processor.tokenizer.bos_token  # a template that writes the BOS (Gemma 3's) gets no second one",
        'inputs = processor(text=[text], images=[pictures], return_tensors="pt",  # one turn, two pictures',
        "                   add_special_tokens=not (bos and text.startswith(bos)))",
        f"ids = model.generate(**inputs, do_sample=False, num_beams={decoding.get('num_beams', 1)}, "
        f"max_new_tokens={decoding.get('max_new_tokens', 30)},",
        f"                     eos_token_id=processor.tokenizer.convert_tokens_to_ids({model['end_of_turn']!r}))",
        'caption = processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)[0].strip()',
        "```",
        "",
    ]


def model_card(
    *, name: str, info: dict, run_config: dict, run_info: dict, evaluations: dict[str, dict], files: list[str]
) -> str:
    """The README.md text. `info`: davir_export.json; `evaluations`: {eval folder name: metrics.json}."""
    weights, base = info["weights"], info.get("base_model")
    model = info.get("model") or {}
    data, optim, run = run_config.get("data") or {}, run_config.get("optim") or {}, run_config.get("run") or {}
    library = {"adapter": "peft", "merged": "transformers", "lightweight": "davir"}[weights]
    header = _yaml_header(
        {
            "license": info.get("license") or "other",
            "base_model": base["name"] if base else None,
            "library_name": library,
            "pipeline_tag": "image-text-to-text",
            "tags": ["davir", "image-change-captioning", "change-captioning"]
            + (["lora"] if weights == "adapter" else []),
        }
    )
    out = [header, f"# {name}", ""]
    if weights == "lightweight":
        out.append(
            f"A {model.get('method')} change captioner (davir's lightweight methods) on ResNet-101 layer3 "
            "features, exported by `davir-export` from a davir run."
        )
    else:
        kind = (
            "a LoRA adapter (PEFT) over the base model, plus the parts trained in full"
            if weights == "adapter"
            else f"the LoRA merged into the full weights of the model (a plain `{model.get('model_class')}` folder)"
        )
        out.append(
            f"DAVIR (FAC + EPC) on `{model.get('family')}`: {kind}. Exported by `davir-export` from a davir run."
        )
    source = info.get("source") or {}
    out += [
        "",
        f"- source: the run `{source.get('run_name')}`, its `{source.get('model_folder')}/` "
        f"(step {source.get('step')}); exported {info.get('created')} with davir {info.get('davir_version')}",
    ]
    if base:
        out.append(
            f"- base model: `{base['name']}` (model type `{base.get('model_type')}`; sha256 of its weight "
            "files in `davir_export.json`)"
        )
    decoding = info.get("decoding") or {}
    out.append(
        f"- decoding: num_beams={decoding.get('num_beams')}, max_new_tokens={decoding.get('max_new_tokens')} "
        "(what the run selected its model with)"
    )
    prep = info.get("preprocessing") or {}
    out.append(
        f"- preprocessing profile: `{prep.get('profile')}`; change masks: `{prep.get('masks')}`; "
        f"entities: `{prep.get('entities')}`"
    )
    if model.get("backbone"):
        out.append(
            f"- feature backbone: `{model['backbone']}` (ResNet-101 weights checked by this hash; the demo's "
            "tiny backbone ships with davir, others are given with `--backbone-weights`)"
        )

    out += ["", "## Use", "", "```bash", "pip install -e .   # in a clone of the davir repository"]
    flag = " --base-model BASE_FOLDER" if weights == "adapter" else ""
    out += [
        f"davir-caption --checkpoint THIS_FOLDER{flag} --pairs my_pairs/ --out captions.jsonl",
        "```",
        "",
        "```python",
        "from davir import ChangeCaptioner",
        'captioner = ChangeCaptioner.from_pretrained("THIS_FOLDER"'
        + (', base_model="BASE_FOLDER")' if weights == "adapter" else ")"),
        'captioner.caption("before.png", "after.png").caption',
        "```",
        "",
    ]
    if weights == "adapter":
        out.append(
            f"`BASE_FOLDER` is a local folder of `{base['name']}`; without it the command stops and names the "
            "flag. Plain PEFT loads the LoRA part with `PeftModel.from_pretrained(base, THIS_FOLDER)`, but the "
            "parts trained in full are in `trainable_extra.safetensors` and the two-image prompt is davir's: "
            "caption with davir, or export with `--merge` for other servers."
        )
    elif weights == "merged":
        out.append(
            f"The folder is also a plain `{model.get('model_class')}` + processor folder "
            "(`from_pretrained(THIS_FOLDER)`), the form vLLM and SGLang serve; davir's two-image prompt "
            "(Eq. 10) and decoding are in `davir_config.json` and `config.yaml` (davir's docs/sharing.md)."
        )
    if weights == "merged" and model.get("end_of_turn") and model.get("image_size"):
        out += [""] + plain_transformers_snippet(model, info.get("decoding") or {})
    out.append(
        "Change masks and entities of new pairs are computed with the settings in `preprocessing/` "
        "(the caches the model was trained on, without their entries)."
    )

    out += ["", "## Training", ""]
    out += _settings_lines(
        {
            "method": run_config.get("method"),
            "data format": data.get("format"),
            "data": data.get("root"),
            "preprocessing profile": data.get("preprocessing_profile"),
        }
    )
    if weights != "lightweight":
        config = model.get("config") or {}
        out += _settings_lines(
            {
                "train_mode": config.get("train_mode"),
                "lora": config.get("lora"),
                "extra_trainable": config.get("extra_trainable"),
                "fac": config.get("fac"),
                "epc": config.get("epc"),
                "dtype": config.get("dtype"),
                "seed": config.get("seed"),
            }
        )
    out += _settings_lines(
        {
            "optim": {
                k: optim.get(k)
                for k in ("lr", "weight_decay", "batch_size", "max_steps", "schedule", "warmup_ratio")
                if k in optim
            },
            "run": {k: run.get(k) for k in ("eval_every", "num_beams", "max_new_tokens", "seed") if k in run},
        }
    )

    out += ["", "## Evaluation", ""]
    if not evaluations:
        out.append("The run holds no evaluation (`evaluate.py --checkpoint RUN --split test` writes one).")
    for folder, metrics in evaluations.items():
        out += [
            f"`{folder}` (`evaluate.py --checkpoint`, model `{metrics.get('checkpoint')}`, decoding "
            f"{ {k: v for k, v in (metrics.get('decoding') or {}).items() if k != 'source'} }; "
            f"metrics.json in `eval/{folder}/`):",
            "",
            metrics_table(metrics),
            "",
        ]
    if evaluations:
        out.append("Scores ×100 as papers print them; CIDEr is pycocoevalcap's CIDEr-D.")

    out += ["", "## Reproduce", ""]
    command = run_info.get("command")
    if command:
        out += [
            "The run was trained with (in its training folder):",
            "",
            "```bash",
            " ".join(shlex.quote(str(part)) for part in command),
            "```",
            "",
            "`training_config.yaml` is the whole configuration it trained with (paths relative to its "
            "training folder); `training_run_info.json` has the seed and the versions of the packages.",
        ]
    else:
        out.append("`training_config.yaml` is the configuration the run trained with.")

    out += (
        ["", "## Files", ""]
        + [f"- `{name}`" for name in files]
        + [
            "",
            "## Publish",
            "",
            "The folder is laid out for the Hugging Face Hub as it is (this card, `config.json`/`adapter_config.json`, "
            "safetensors weights, processor files). Pushing is not reachable from the machine that exported it; where "
            "it is:",
            "",
            "```python",
            "from huggingface_hub import upload_folder",
            'upload_folder(repo_id="you/this-model", folder_path="THIS_FOLDER")',
            "```",
            "",
            "## Licence",
            "",
            f"`{info.get('license') or 'other'}`"
            + (
                f"; the base model `{base['name']}` keeps its own licence, which "
                "also binds weights derived from it (merged ones)."
                if base
                else "."
            ),
            "",
        ]
    )
    return "\n".join(out)
