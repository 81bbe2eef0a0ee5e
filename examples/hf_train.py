#!/usr/bin/env python3
"""A Hugging Face ``Trainer`` script under orch: the lines marked ``# orch`` are all it takes.

    orch submit --name hf1 -- .venv/bin/python examples/hf_train.py --max-steps 120
    python examples/hf_train.py --run-dir /tmp/hf1          # without orch

A GPT-2 built from a tiny config (1 layer, 32 wide, no download) trained as a character-level language
model with dropout, AdamW and a linear schedule, logging to TensorBoard (and W&B with ``--wandb``).
``--step-log`` appends each completed optimizer step (the tests count repeats; under torchrun, with the
rank); ``--sleep-per-step`` stands in for a slower model; ``--save-steps`` adds periodic checkpoints;
``--eval-every`` evaluates on the training text (``--eval-log``/``--sleep-per-eval-batch``: one line, a delay
per evaluation batch).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from orchestrator.integrations import hf as orch  # orch

TEXT = (b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 16)
VOCAB, CONTEXT = 64, 16


class CharDataset(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.data = torch.tensor(list(TEXT)) % VOCAB

    def __len__(self) -> int:
        return len(self.data) - CONTEXT

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self.data[i:i + CONTEXT]
        return {"input_ids": chunk, "labels": chunk}


class StepLog(TrainerCallback):
    """Test instrumentation: one line per completed optimizer step (and evaluation batch); optional delays."""

    def __init__(self, path: str | None, sleep_s: float, eval_path: str | None = None,
                 eval_sleep_s: float = 0.0) -> None:
        self.path, self.sleep_s, self.eval_path, self.eval_sleep_s = path, sleep_s, eval_path, eval_sleep_s

    @staticmethod
    def _line(step: int) -> str:
        rank = f" {os.environ['RANK']}" if "RANK" in os.environ else ""  # under torchrun
        return f"{os.environ.get('ORCH_ATTEMPT', '1')} {step}{rank}\n"

    def on_step_end(self, args, state, control, **kwargs):  # HF's signature
        time.sleep(self.sleep_s)
        if self.path:
            with open(self.path, "a") as f:
                f.write(self._line(state.global_step))

    def on_prediction_step(self, args, state, control, **kwargs):  # HF's signature
        time.sleep(self.eval_sleep_s)
        if self.eval_path:
            with open(self.eval_path, "a") as f:
                f.write(self._line(state.global_step))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=120)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--save-steps", type=int, default=0, help="periodic checkpoints (0: only on a signal)")
    ap.add_argument("--run-dir", default=None, help="without orch (orch sets ORCH_RUN_DIR)")
    ap.add_argument("--step-log", default=None)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    ap.add_argument("--eval-log", default=None, help="one line per evaluation batch")
    ap.add_argument("--sleep-per-eval-batch", type=float, default=0.0)
    ap.add_argument("--export", action="store_true", help="write result/export.txt after training")
    ap.add_argument("--fail-after-train", action="store_true", help="raise after training (a failed export): a crash")
    ap.add_argument("--jit-checkpoint", action="store_true",
                    help="HF's enable_jit_checkpoint (its own SIGTERM handler; orch's takes over and records the stop)")
    ap.add_argument("--wandb", action="store_true", help="also report to W&B (WANDB_MODE=offline stays local)")
    ap.add_argument("--mlflow", action="store_true", help="also report to MLflow (set MLFLOW_TRACKING_URI)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=CONTEXT))
    args = TrainingArguments(
        output_dir="hf-output", max_steps=a.max_steps, per_device_train_batch_size=a.batch_size,
        learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=10, logging_steps=1,
        save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
        eval_strategy="steps" if a.eval_every else "no", eval_steps=a.eval_every or None,
        per_device_eval_batch_size=a.batch_size,
        report_to=["tensorboard"] + (["wandb"] if a.wandb else []) + (["mlflow"] if a.mlflow else []), seed=0,
        use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, enable_jit_checkpoint=a.jit_checkpoint)
    log = StepLog(a.step_log, a.sleep_per_step, a.eval_log, a.sleep_per_eval_batch)
    trainer = Trainer(model=model, args=args, train_dataset=CharDataset(),
                      eval_dataset=CharDataset() if a.eval_every else None,
                      callbacks=[log, orch.OrchCallback(run_dir=a.run_dir)])  # orch
    trainer.train(resume_from_checkpoint=orch.resume_path(a.run_dir))  # orch
    after_training(a, os.path.join(a.run_dir or ".", "result"))


def after_training(a: argparse.Namespace, result_dir: str) -> None:
    """What a script does once training ended: an export into result/ (listed in done.json), or a failure."""
    if a.fail_after_train:
        raise RuntimeError("export failed after training (--fail-after-train)")
    if a.export:
        os.makedirs(result_dir, exist_ok=True)
        with open(os.path.join(result_dir, "export.txt"), "w") as f:
            f.write("exported after training\n")


if __name__ == "__main__":
    main()
