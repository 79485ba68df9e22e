"""Issue 30: `accelerate launch -m preprocess …` over several processes, and docs/cluster.md's recipe.

One test runs the recipe's script (2 gloo CPU processes, tiny sizes) after SIGKILLing one process of a masks
launch: the rerun completes the cache, and the masks, entity table and features equal one process's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(sys.executable).parent / "accelerate"


@pytest.fixture(scope="module")
def data(synthetic_set):
    return synthetic_set(40, 7, width=64, height=48, val_fraction=0.1, test_fraction=0.3)  # read only


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_env(port: int) -> dict:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MASTER_PORT": str(port),
    }


def recipe_script() -> str:
    """The SLURM script of docs/cluster.md: its ```bash block that starts with a shebang."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "docs" / "cluster.md").read_text(), flags=re.S)
    scripts = [block for block in blocks if block.startswith("#!/bin/bash")]
    assert len(scripts) == 1, "docs/cluster.md should hold one #!/bin/bash script"
    return scripts[0]


def mask_files(cache: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((cache / "masks").iterdir())}


def kill_one_process_of_a_masks_launch(data: Path, out: Path, env: dict) -> None:
    """Start 2 processes on the test split's masks; SIGKILL the second once it works; the launch fails."""
    command = [
        str(LAUNCHER),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        env["MASTER_PORT"],
        "-m",
        "preprocess",
        "masks",
        "--format",
        "clevr_change",
        "--root",
        str(data),
        "--split",
        "test",
        "--out",
        str(out),
        "--no-progress",
    ]
    launch = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lock = out.with_name(f"{out.name}.masks.shard-1-of-2.lock")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launch.poll() is None:
            if lock.is_file() and any((out / "masks").glob("*.json")):
                try:
                    pid = json.loads(lock.read_text())["pid"]
                except (ValueError, KeyError):
                    continue  # being written
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        else:
            pytest.fail(f"the launch ended before a process could be killed: {launch.communicate()[1][-2000:]}")
        _, stderr = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
    assert launch.returncode != 0, stderr[-2000:]
    assert not (out / "manifest.json").exists()  # the whole cache's manifest waits for every share


@pytest.mark.slow  # the docs' recipe: seven launches of two processes each, ~2 min of CPU
@pytest.mark.faults  # a SIGKILL and resume: `make test-all` runs it, `-m "not faults"` skips it
@pytest.mark.usefixtures("one_torch_thread")  # the reference features: one thread, as in the launched processes
def test_cluster_recipe_on_two_processes_resumes_a_kill_and_matches_one_process(data, tmp_path):
    from davir.data.caches import EntityCache
    from davir.data.feature_cache import FeatureCache
    from davir.jobs import entities, features, masks

    # one process, the reference
    one = tmp_path / "one"
    common = ["--format", "clevr_change", "--root", str(data), "--split", "test", "--no-progress"]
    assert masks.main([*common, "--out", str(one / "masks")]) == 0
    assert (
        entities.main([*common, "--masks", str(one / "masks"), "--out", str(one / "entities"), "--fit-split", "test"])
        == 0
    )
    weights = str(REPO / "davir" / "assets" / "tiny_resnet" / "backbone.pth")
    assert features.main([*common, "--out", str(one / "features"), "--weights", weights, "--workers", "0"]) == 0

    env = cpu_env(free_port())
    work = tmp_path / "work"
    kill_one_process_of_a_masks_launch(data, work / "masks", env)

    script = tmp_path / "cluster.sh"
    script.write_text(recipe_script())
    env.update(
        {
            "DAVIR_DIR": str(REPO),
            "FORMAT": "clevr_change",
            "DATA": str(data),
            "WORK": str(work),
            "SPLITS": "test",
            "GPUS_PER_NODE": "2",
            "MASK_ARGS": "",
            "ENTITY_ARGS": "--fit-split test",
            "FEATURE_ARGS": f"--weights {weights} --workers 0",
            "CONFIG": "configs/demo.yaml",
            "TRAIN_ARGS": "data.train_split=test data.val_split=test data.max_train_pairs=8 optim.batch_size=2 "
            "optim.max_steps=2 run.eval_every=0 run.save_every=2 run.val_max_pairs=2 "
            "run.tensorboard=false run.log_every=1",
            "EVAL_ARGS": "--no-spice --metrics BLEU,CIDEr --limit 4 --batch-size 2",
            "CAPTION_PAIRS": "3",
            "CAPTION_ARGS": "--batch-size 2 --workers 0",
        }
    )
    for variable in ("SLURM_JOB_ID", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODEID"):
        env.pop(variable, None)
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "process 1/2: 12 of 24 pairs" in result.stderr and "process 2/2: 12 of 24 pairs" in result.stderr
    assert "process 2/2: 18 of 36 images" in result.stderr

    # masks: the same files byte for byte, the same pair list; the killed share was resumed, not redone
    assert mask_files(work / "masks") == mask_files(one / "masks")
    merged, single = (json.loads((cache / "manifest.json").read_text()) for cache in (work / "masks", one / "masks"))
    assert merged["pair_list"] == single["pair_list"] and merged["status"] == "complete"
    assert merged["counts"]["pairs"] == single["counts"]["pairs"] == 24 and merged["counts"]["reused"] > 0
    assert merged["counts"]["in_cache"] == 24 and [p["pairs"] for p in merged["processes"]] == [12, 12]
    assert not list((work / "masks").glob("manifest-process-*"))
    # entities: the same table; features: the same keys and values
    assert EntityCache(work / "entities").table() == EntityCache(one / "entities").table()
    assert (
        json.loads((work / "entities" / "entities" / "manifest.json").read_text())["splits"]["test"]["status"]
        == "complete"
    )
    import torch

    two_features, one_features = (FeatureCache(c / "features", dtype=torch.float16) for c in (work, one))
    assert sorted(two_features.entries) == sorted(one_features.entries) and len(one_features.entries) == 36
    assert all(torch.equal(two_features.get(key), one_features.get(key)) for key in one_features.entries)
    # train → evaluate → caption ran on the caches
    assert (work / "run" / "checkpoints" / "step_2" / "COMPLETE").is_file()
    assert list((work / "run" / "eval").glob("*/metrics.json"))
    rows = [json.loads(line) for line in (work / "captions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["caption"] and row["error"] is None for row in rows)


def test_merged_manifest_counts_each_pair_once_and_lists_failures_in_reader_order():
    from davir.data.records import ChangePair
    from davir.jobs.mask_manifest import merge_process_manifests, pair_list
    from davir.jobs.processes import ProcessLayout

    pairs = [ChangePair(f"p{i}", Path("b.png"), Path("a.png")) for i in range(5)]
    shares = [ProcessLayout(2, index).share(pairs) for index in range(2)]
    assert [[p.pair_id for p in share] for share in shares] == [["p0", "p2", "p4"], ["p1", "p3"]]

    def part(share, failed):
        return {
            "settings": {},
            "status": "incomplete" if failed else "complete",
            "seconds": 1.0,
            "counts": {
                "pairs": len(share),
                "computed": len(share) - len(failed),
                "failed": len(failed),
                "reader_skipped": 3,
            },
            "failures": [{"record": pair_id, "reason": "corrupt"} for pair_id in failed],
        }

    merged = merge_process_manifests([part(shares[0], ["p4", "p0"]), part(shares[1], ["p1"])], pairs, 2.0)
    assert merged["counts"] == {"pairs": 5, "computed": 2, "failed": 3, "reader_skipped": 3}
    assert [f["record"] for f in merged["failures"]] == ["p0", "p1", "p4"] and merged["status"] == "incomplete"
    assert merged["pair_list"] == pair_list(pairs) and merged["shard"] == {"count": 1, "index": 0}
