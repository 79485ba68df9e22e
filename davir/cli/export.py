"""`davir-export` / `python -m davir.export`: a run's model as one self-contained folder to hand to someone.

    davir-export --checkpoint runs/demo --out exports/demo             # LoRA adapter (+ --base-model to caption)
    davir-export --checkpoint runs/demo --out exports/demo-merged --merge   # full weights: vLLM/SGLang serve it

The folder holds the model (PEFT adapter_model.safetensors + adapter_config.json naming the base model, or the
merged weights of the model's family), davir's config (family, FAC/EPC, decoding, preprocessing profile), the
processor/tokenizer files, the change-mask and entity settings for new pairs (with the fitted retriever and
gate), the run's evaluations and a model card README.md. `caption.py --checkpoint DIR` and
`ChangeCaptioner.from_pretrained(DIR)` take it from anywhere (an adapter with --base-model / base_model=).
Publishing: `huggingface_hub.upload_folder(repo_id=..., folder_path=DIR)` (docs/sharing.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.errors import DataError, describe_os_error
from davir.runtime.signals import START_AGAIN, stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="davir-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="run folder (best/, else last/) or saved model: DAVIR or a lightweight method's",
    )
    parser.add_argument("--out", required=True, type=Path, help="the folder to write (must not exist or be empty)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="write the LoRA merged into the full weights of the model's family (no base needed)",
    )
    parser.add_argument(
        "--base-model-name",
        help="how the folder names its base model, e.g. Salesforce/instructblip-vicuna-7b "
        "(default: the base folder's name)",
    )
    parser.add_argument("--license", default="other", help="the model card's licence field (default: other)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--device", default="cpu", help="where --merge loads the model (default: cpu)")
    moved = parser.add_argument_group("what the run recorded, when it moved (default: the run's own paths)")
    moved.add_argument(
        "--base-model",
        "--pretrained",
        dest="base_model",
        type=Path,
        help="the base model folder (the model's `pretrained`)",
    )
    moved.add_argument("--masks-from", type=Path, help="the run's mask cache (data.masks)")
    moved.add_argument("--entities-from", type=Path, help="the run's entity cache (data.entities)")
    return parser


@stop_on_signals(rerun=START_AGAIN)  # the partial folder goes with the stop: the rerun starts afresh
def main(argv: list[str] | None = None) -> int:
    from davir.export.exporter import ExportOptions, export_run, summary

    args = build_parser().parse_args(argv)
    options = ExportOptions(
        merge=args.merge,
        base_model=args.base_model,
        base_model_name=args.base_model_name,
        masks_from=args.masks_from,
        entities_from=args.entities_from,
        license=args.license,
        overwrite=args.overwrite,
        device=args.device,
    )
    try:
        out = export_run(args.checkpoint, args.out, options)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    print(summary(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
