"""The training loop: one explicit Accelerate loop for every method, as in HF's run_*_no_trainer.py examples.

    run_dir = train(load_config(TrainConfig, "configs/demo.yaml", ["optim.max_steps=50"]))

The loop is written out in full on purpose: read it, change it. What differs between methods (model,
batch fields, loss, generation, saving) lives in a task (davir.training.tasks); the run folder's
checkpoints, logs and selection of `best/` in davir.training.run and davir.training.validation.
`train.py` / `davir-train` parse the command line and call `train`.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from tqdm.auto import tqdm

from davir.config import ConfigError, save_config
from davir.data.dataset import collate_examples
from davir.errors import DataError, check_output_dir
from davir.io import append_jsonl, iter_jsonl, write_text_atomic
from davir.runs.config import TrainConfig
from davir.runs.files import not_run_entries
from davir.runtime.cost import CostMeter
from davir.runtime.locks import output_lock
from davir.runtime.orphans import DieWithParent
from davir.training import trackers
from davir.training.checkpoints import (
    install_trainable_state_hooks,
    load_checkpoint,
    save_checkpoint,
    usable_checkpoint,
)
from davir.training.resume import apply_to_optimizer, describe_changes, plan_resume
from davir.training.run import latest_checkpoint, mark_run_finished, prune_checkpoints, write_run_info
from davir.training.tasks import build_task
from davir.training.validation import Validator


class NonFiniteLoss(RuntimeError):
    pass


# On a GPU the main process only launches kernels; reading and resizing images there left the 7B InstructBLIP loop
# at 0.77x the step bench, 4 workers 0.95x (H200, bench/README.md). On a CPU the workers would compete with the step.
GPU_DATA_WORKERS = 4


def data_workers(setting: int | str, device: torch.device) -> int:
    """``data.num_workers`` as a count: ``auto`` is GPU_DATA_WORKERS on a GPU (at most the cores but one), 0 else."""
    if setting != "auto":
        return int(setting)
    if device.type != "cuda":
        return 0
    return max(0, min(GPU_DATA_WORKERS, (os.cpu_count() or 1) - 1))


def drop_log_rows_after(log: Path, step: int) -> None:
    """Keep the rows of `log` up to `step`, the step a resume starts from: a killed run logged the steps after its
    last checkpoint, which the resume trains and logs again (the log then reads as the uninterrupted run's)."""
    if not log.is_file():
        return
    later = {
        n
        for n, row in iter_jsonl(log)
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] > step
    }
    if later:
        with open(log, encoding="utf-8") as handle:  # the lines as iter_jsonl numbers them
            lines = list(handle)
        write_text_atomic(log, "".join(line for n, line in enumerate(lines, start=1) if n not in later))


def train(config: TrainConfig, *, resume: bool = False) -> Path:
    run_dir = Path(config.run.output_dir)
    trackers.check_installed(config.run.trackers)  # a missing package: an error naming its pip install, before any work
    accelerator = Accelerator(
        mixed_precision=config.run.mixed_precision,
        gradient_accumulation_steps=config.optim.gradient_accumulation_steps,
        log_with=config.run.trackers or None,  # run.trackers; where each writes: davir/training/trackers.py
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        # the data order is a function of (seed, epoch) only, so a resumed run sees the same batches
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    set_seed(config.run.seed)
    checkpoint = (
        usable_checkpoint(run_dir, process_index=accelerator.process_index, warn=accelerator.print) if resume else None
    )
    if resume and checkpoint is None:
        accelerator.print(f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}; starting from scratch")
    if (run_dir / "config.yaml").exists() and not resume:
        if not config.run.overwrite:
            raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or run.overwrite=true")
        others = not_run_entries(run_dir)  # the old run is removed whole below: only when it is all there is
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise ConfigError(
                f"run.overwrite: {run_dir} holds {shown}, which no run wrote; nothing was deleted: move them out "
                "of the run folder, or give another run.output_dir"
            )
    # --resume with other settings than the run's: refused where unsound, else applied and recorded (resume.py)
    plan = plan_resume(run_dir, checkpoint, config)

    task = build_task(config, accelerator)
    train_loader = torch.utils.data.DataLoader(
        task.train_dataset,
        batch_size=config.optim.batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=collate_examples,
        num_workers=(workers := data_workers(config.data.num_workers, accelerator.device)),
        worker_init_fn=DieWithParent() if workers else None,  # a SIGKILLed run leaves no worker behind
        generator=torch.Generator().manual_seed(config.run.seed),
    )
    if len(train_loader) == 0:
        raise DataError(
            f"the training split has {len(task.train_dataset)} examples, fewer than one batch "
            f"of {config.optim.batch_size}"
        )
    # The step count comes from the loader as each process sees it (sharded by prepare), not the whole split.
    train_loader = accelerator.prepare(train_loader)
    steps_per_epoch = math.ceil(len(train_loader) / config.optim.gradient_accumulation_steps)
    if steps_per_epoch == 0:
        raise DataError(
            f"the training split has {len(task.train_dataset)} examples, fewer than one batch "
            f"of {config.optim.batch_size} on each of {accelerator.num_processes} processes"
        )
    max_steps = config.optim.max_steps or config.optim.epochs * steps_per_epoch
    plan.check_length(max_steps)
    # The run folder is claimed only once start-up succeeded: a run that fails before (missing cache, bad
    # data) leaves nothing behind, so the corrected rerun is not refused as "already holds a run".
    if accelerator.is_main_process:
        if (run_dir / "config.yaml").exists() and not resume:
            shutil.rmtree(run_dir)  # run.overwrite: no stale checkpoints, logs or best/ from the old run
        run_dir.mkdir(parents=True, exist_ok=True)
        # run_info.json first: a kill between the two leaves a recorded change that the next resume finds again
        write_run_info(
            run_dir,
            seed=config.run.seed,
            extra={
                "resumed_from": str(checkpoint) if checkpoint else None,
                "resume_changes": plan.history,
                "max_steps": max_steps,
                "finished": False,
            },
        )  # `finished` is set once last/ is saved
        save_config(config, run_dir / "config.yaml")
    accelerator.wait_for_everyone()
    epochs = math.ceil(max_steps / steps_per_epoch)
    describe = getattr(task.train_dataset, "describe", None)
    accelerator.print(
        f"training: {len(task.train_dataset)} examples per epoch"
        + (f" ({describe()})" if describe else "")
        + f"; batch {config.optim.batch_size} x {accelerator.num_processes} process(es) x "
        f"{config.optim.gradient_accumulation_steps} accumulation -> {steps_per_epoch} steps per epoch; "
        + (
            f"max_steps {max_steps} (= {max_steps / steps_per_epoch:.2f} epochs)"
            if config.optim.max_steps
            else f"{config.optim.epochs} epochs"
        )
        + f" = {max_steps} optimizer steps in total"
    )

    optimizer = torch.optim.AdamW(
        task.trainable_parameters(),
        lr=config.optim.lr,
        weight_decay=config.optim.weight_decay,
        betas=tuple(config.optim.betas),
    )
    # accelerate steps a prepared scheduler once per process at every optimizer step (split_batches=False),
    # as HF's no_trainer examples count it: the schedule spans max_steps x num_processes scheduler steps.
    from transformers import get_scheduler  # here: it imports transformers' trainer and peft (~4 s)

    scheduler = get_scheduler(
        config.optim.schedule,
        optimizer,
        num_warmup_steps=round(config.optim.warmup_ratio * max_steps) * accelerator.num_processes,
        num_training_steps=max_steps * accelerator.num_processes,
    )
    model, optimizer, scheduler = accelerator.prepare(task.model, optimizer, scheduler)
    task.model = model
    install_trainable_state_hooks(accelerator)

    step, start_epoch, skip_batches = 0, 0, 0
    if checkpoint is not None:
        state = load_checkpoint(accelerator, checkpoint)
        step = state["step"]
        start_epoch, skip_batches = divmod(step * config.optim.gradient_accumulation_steps, len(train_loader))
        accelerator.print(f"resumed from {checkpoint} at step {step}")
        if plan.changes:
            rates = apply_to_optimizer(plan.changes, config, optimizer, scheduler)
            accelerator.print(f"note: {describe_changes(plan.changes, rates)}")

    if resume and accelerator.is_main_process:
        drop_log_rows_after(run_dir / "train_log.jsonl", step)
    trackers.start(
        accelerator, config.run.trackers, run_dir, config=task.tracker_config(), resume=checkpoint is not None
    )
    validator = Validator(config, task, accelerator, run_dir)
    validator.restore(checkpoint)
    progress = tqdm(total=max_steps, initial=step, disable=not accelerator.is_local_main_process, desc="train")
    window_start, window_pairs = time.perf_counter(), 0
    meter, pairs_seen, first_step = CostMeter(accelerator.device), 0, step  # this session's cost (run_info.json)

    for epoch in range(start_epoch, epochs):
        if step >= max_steps:  # resumed from the last step's checkpoint (killed before `last`): nothing left to train
            break
        model.train()
        task.train_dataset.set_epoch(epoch)  # which reference caption each pair gets this epoch
        train_loader.set_epoch(epoch)
        loader = (
            accelerator.skip_first_batches(train_loader, skip_batches)
            if epoch == start_epoch and skip_batches
            else train_loader
        )
        for batch in loader:
            with accelerator.accumulate(model):
                losses = task.training_losses(batch)
                loss = losses["loss"]
                if not torch.isfinite(loss.detach()).item():
                    last = latest_checkpoint(run_dir)
                    raise NonFiniteLoss(
                        f"loss became {loss.item()} at step {step + 1} (terms: "
                        f"{ {k: float(v.detach()) for k, v in losses.items()} }); the last good checkpoint "
                        f"is {last or 'none (no checkpoint saved yet)'}. Lower optim.lr or check the inputs."
                    )
                accelerator.backward(loss)
                if accelerator.sync_gradients and config.optim.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(task.trainable_parameters(), config.optim.max_grad_norm)
                optimizer.step()
                task.after_optimizer_step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            window_pairs += len(batch["pair_id"]) * accelerator.num_processes
            pairs_seen += len(batch["pair_id"]) * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            step += 1
            progress.update(1)
            if step % config.run.log_every == 0 or step == max_steps:
                elapsed = time.perf_counter() - window_start
                logs = {f"train/{k}": float(accelerator.reduce(v.detach(), "mean")) for k, v in losses.items()}
                logs.update(
                    {
                        "train/lr": scheduler.get_last_lr()[0],
                        "train/pairs_per_s": window_pairs / max(elapsed, 1e-9),
                        "train/epoch": epoch,
                    }
                )
                accelerator.log(logs, step=step)
                if accelerator.is_main_process:
                    append_jsonl(run_dir / "train_log.jsonl", {"step": step, **logs})
                progress.set_postfix(loss=f"{logs['train/loss']:.4f}", lr=f"{logs['train/lr']:.2e}")
                window_start, window_pairs = time.perf_counter(), 0
            if config.run.eval_every and (step % config.run.eval_every == 0 or step == max_steps):
                validator.run(step)
                model.train()
            if config.run.save_every and (step % config.run.save_every == 0 or step == max_steps):
                save_checkpoint(accelerator, run_dir, step, validator.state())
                prune_checkpoints(run_dir, config.run.keep_checkpoints)
            if step >= max_steps:
                break
        if step >= max_steps:
            break

    progress.close()
    validator.save_last(step)
    if accelerator.is_main_process:
        # wall time includes validation and checkpoint saving: what the run took, not the bare step rate
        cost = meter.record(
            pairs=pairs_seen,
            model=accelerator.unwrap_model(model),
            optimizer_steps=step - first_step,
            processes=accelerator.num_processes,
            resumed_at_step=first_step or None,
        )
        mark_run_finished(run_dir, step, compute=cost)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return run_dir


def train_in_folder(config: TrainConfig, *, resume: bool = False, wait_lock: bool = False) -> Path:
    """`train` as train.py runs it: the run folder checked first (a file in the way, no permission: an error now,
    not after the work) and held by its lock while training (docs/errors.md, "Locks"); under `accelerate launch`
    the main process (RANK 0) holds it for them all. `wait_lock`: wait for another writer instead of stopping."""
    run_folder = check_output_dir(config.run.output_dir, what="run folder (run.output_dir)")
    with output_lock(
        run_folder, what=f"run folder {run_folder}", wait=wait_lock, enabled=int(os.environ.get("RANK", "0")) == 0
    ):
        return train(config, resume=resume)
