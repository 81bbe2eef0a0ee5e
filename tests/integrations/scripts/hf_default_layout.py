"""A plain HF Trainer script without orch code, in HF's default layout: checkpoints inside output_dir
(``out/checkpoint-N``), resumed by HF's own ``get_last_checkpoint``. Attempt 1 crashes at --crash-at.

    hf_default_layout.py STEP_LOG MAX_STEPS CRASH_AT
"""

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

STEP_LOG, MAX_STEPS, CRASH_AT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ATTEMPT = os.environ.get("ORCH_ATTEMPT", "1")


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict:
        x = torch.arange(i, i + 8) % 32
        return {"input_ids": x, "labels": x}


class StepLog(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # HF's signature
        with open(STEP_LOG, "a") as f:
            f.write(f"{ATTEMPT} {state.global_step}\n")
        if ATTEMPT == "1" and state.global_step == CRASH_AT:
            raise RuntimeError(f"crash at step {CRASH_AT}")


torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8))
args = TrainingArguments(output_dir="out", max_steps=MAX_STEPS, per_device_train_batch_size=4, save_strategy="steps",
                         save_steps=10, report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=10, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[StepLog()])
last = get_last_checkpoint("out") if os.path.isdir("out") else None
trainer.train(resume_from_checkpoint=last)
trainer.save_model("out")
