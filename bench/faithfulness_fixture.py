"""Collect the scored runs on the built-in set into the fixture of tests/test_faithfulness.py.

    python bench/faithfulness_fixture.py runs/ [more folders…] --out tests/fixtures/faithfulness_runs.json.gz

Every RUN/eval/clevr_change_test/ and RUN/eval/clevr_change_val/ under the folders that holds predictions.json
and a metrics.json with the built-in set's accuracy is taken: its captions and its exact object accuracy (metrics.json
``synthetic.overall.object_accuracy``, davir.metrics.synthetic). The references and change types of each
data root and split the runs used (config.yaml ``data.root``, relative to run_info.json's ``cwd``) are stored once.
The test checks that the stated-difference object F1 ranks the runs as the object accuracy does
(Spearman ≥ 0.8), so it runs on a clean clone without runs/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import yaml

from davir.data.formats import read_dataset
from davir.io import read_json
from davir.metrics.io import load_predictions
from davir.metrics.protocols import references_for_evaluation

SPLITS = ("test", "val")


def data_root(run: Path) -> Path:
    """The run's data.root, resolved against the folder it was trained in."""
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    root = Path(config["data"]["root"])
    if not root.is_absolute():
        root = Path(read_json(run / "run_info.json").get("cwd", ".")) / root
    return root.resolve()


def collect(folders: list[Path]) -> dict:
    datasets: dict[str, dict] = {}
    runs = []
    found = sorted(
        path
        for folder in folders
        for split in SPLITS
        for path in folder.glob(f"**/eval/clevr_change_{split}/metrics.json")
    )
    for metrics_path in found:
        folder = next(f for f in folders if f in metrics_path.parents)
        split = metrics_path.parent.name.rsplit("_", 1)[1]
        metrics = read_json(metrics_path)
        accuracy = (metrics.get("synthetic") or {}).get("overall", {}).get("object_accuracy")
        predictions_path = metrics_path.parent / "predictions.json"
        if accuracy is None or not predictions_path.is_file():
            continue
        run = metrics_path.parents[2]
        root = data_root(run)
        # "demo_test", "demo_data1_val", …
        key = f"{root.parent.name if root.name == 'data' else root.name}_{split}"
        if key not in datasets:
            chosen = references_for_evaluation(read_dataset("clevr_change", root, split))
            datasets[key] = {"root": str(root), "references": chosen.references, "groups": chosen.groups}
        runs.append(
            {
                "run": str(run.relative_to(folder.parent)),
                "dataset": key,
                "object_accuracy": accuracy,
                "captions": load_predictions(predictions_path),
            }
        )
        print(f"{run}: object accuracy {accuracy:.3f} ({key})", file=sys.stderr)
    return {"datasets": datasets, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding run folders (searched recursively)")
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/faithfulness_runs.json.gz"))
    args = parser.parse_args(argv)
    fixture = collect(args.folders)
    if not fixture["runs"]:
        print(f"error: no scored built-in-set runs under {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as handle:
        json.dump(fixture, handle, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {args.out}: {len(fixture['runs'])} runs on {len(fixture['datasets'])} data sets", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
