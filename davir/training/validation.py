"""Periodic validation: val loss, greedy captions of the val pairs, caption metrics, best/last checkpoints;
the metrics and a table of `run.val_show` sample captions with their images go to the trackers (trackers.py).

Model selection as the papers do it: score the val split with the standard metrics every N steps and
keep the best model by one metric (CIDEr by default) in RUN/best beside RUN/last.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator

from davir.data.dataset import collate_examples
from davir.io import write_json_atomic
from davir.training import trackers
from davir.training.run import read_checkpoint_state, replace_dir_atomic


class Validator:
    def __init__(self, config, task, accelerator: Accelerator, run_dir: Path):
        self.config = config
        self.task = task
        self.accelerator = accelerator
        self.run_dir = Path(run_dir)
        self.best_score = -math.inf
        self.best_step: int | None = None

    def state(self) -> dict:
        return {"best_score": None if self.best_score == -math.inf else self.best_score, "best_step": self.best_step}

    def restore(self, checkpoint: Path | None) -> None:
        if checkpoint is None:
            return
        state = read_checkpoint_state(checkpoint)
        if state.get("best_score") is not None:
            self.best_score, self.best_step = state["best_score"], state.get("best_step")

    def _batches(self, indices):
        dataset = self.task.val_dataset
        size = self.config.optim.batch_size
        for start in range(0, len(indices), size):
            yield collate_examples([dataset[i] for i in indices[start : start + size]])

    def generate_kwargs(self) -> dict:
        """FSDP shards the weights: every rank must take part in every forward, so generation keeps all
        ranks stepping until the longest caption of any rank ends (HF's synced_gpus)."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.FSDP and self.accelerator.num_processes > 1:
            return {"synced_gpus": True}
        return {}

    @torch.no_grad()
    def run(self, step: int) -> dict | None:
        """Caption the val split on every process (a shard each), score it on the main process; returns the
        metrics there (None elsewhere). Under FSDP the shards are padded to equal length, as every rank must
        run the same forwards (the padded repeats of the last pair are dropped before scoring)."""
        from accelerate.utils import DistributedType, gather_object

        from davir.metrics import score_captions

        self.accelerator.wait_for_everyone()
        count = len(self.task.val_dataset)
        if not count:
            return None
        model = self.task.model
        model.eval()
        padded = self.accelerator.distributed_type == DistributedType.FSDP
        local_losses, local_rows = [], []
        with self.accelerator.split_between_processes(list(range(count)), apply_padding=padded) as shard:
            for batch in self._batches(list(shard)):
                batch = self.task.to_device(batch, self.accelerator.device)
                with self.accelerator.autocast():
                    local_losses.append((float(self.task.training_losses(batch)["loss"]), len(batch["pair_id"])))
                    captions = self.task.generate(
                        batch,
                        max_new_tokens=self.config.run.max_new_tokens,
                        num_beams=self.config.run.num_beams,
                        **self.generate_kwargs(),
                    )
                local_rows += list(zip(batch["pair_id"], captions, batch["captions"]))
        all_losses, all_rows = gather_object(local_losses), gather_object(local_rows)
        result = None
        if self.accelerator.is_main_process:
            predictions, references = {}, {}
            for pair_id, caption, refs in all_rows:
                predictions.setdefault(pair_id, caption)
                references.setdefault(pair_id, refs)
            losses = [loss for loss, _ in all_losses]
            weights = [n for _, n in all_losses]
            # METEOR's Java start-up (~10 s) and SPICE would dominate frequent validations; the final evaluate.py has them.
            scores = score_captions(predictions, references, metrics=("BLEU", "ROUGE_L", "CIDEr"), spice=False).metrics
            val_loss = sum(loss * n for loss, n in zip(losses, weights)) / sum(weights)
            logs = {"val/loss": val_loss, **{f"val/{k}": v for k, v in scores.items() if v is not None}}
            self.accelerator.log(logs, step=step)
            shown = list(predictions.items())[: self.config.run.val_show]
            self.accelerator.print(
                f"[step {step}] val loss {val_loss:.4f} "
                + " ".join(f"{k} {v:.3f}" for k, v in scores.items() if v is not None)
            )
            for pair_id, caption in shown:
                self.accelerator.print(f"    {pair_id}: {caption!r}  (ref: {references[pair_id][0]!r})")
            self._log_samples(shown, references, step)
            write_json_atomic(
                self.run_dir / "val" / f"step_{step}.json",
                {"step": step, "loss": val_loss, "metrics": scores, "predictions": predictions},
            )
            score = scores.get(self.config.run.best_metric)
            if score is not None and score > self.best_score:
                self.best_score, self.best_step = score, step
                self._save_model(
                    self.run_dir / "best",
                    {"step": step, "metric": self.config.run.best_metric, "score": score, "val_loss": val_loss},
                )
            result = logs
        self.accelerator.wait_for_everyone()
        return result

    def _log_samples(self, shown: list[tuple[str, str]], references: dict[str, list[str]], step: int) -> None:
        """The shown captions, with their references and images, as a table in every tracker (run.trackers)."""
        if shown and trackers.wants_samples(self.accelerator):
            rows = trackers.sample_rows(
                self.task.val_dataset, shown, references, size_policy=self.config.data.size_policy
            )
            trackers.log_samples(self.accelerator, rows, step=step)

    def save_last(self, step: int) -> None:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self._save_model(self.run_dir / "last", {"step": step, **self.state()})
        self.accelerator.wait_for_everyone()

    def _save_model(self, target: Path, info: dict) -> None:
        staging = target.with_name(f".{target.name}.staging")
        if staging.exists():
            shutil.rmtree(staging)
        self.task.save_pretrained(staging)
        write_json_atomic(staging / "selection.json", info)
        replace_dir_atomic(staging, target)
