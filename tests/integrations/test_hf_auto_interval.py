"""hf.OrchCallback(save_every="auto"): HF saves at Daly's interval for the cost the callback measures (HF's own
write and orch's commit) and the MTBF orch hands it, even with save_strategy="no". In-process, no orch."""

from __future__ import annotations

import time

import torch
from autospy import assert_auto_saves, spy
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from orchestrator.integrations import hf


class _Slow(TrainerCallback):
    def on_step_end(self, *a, **k) -> None:  # HF's hook signature
        time.sleep(0.02)


def test_hf_auto_saves_at_the_interval_and_reports_what_it_was_given(tmp_path, monkeypatch):
    for k in [k for k in __import__("os").environ if k.startswith("ORCH_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("ORCH_MTBF_S", "2")
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "0.05")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    data = [{"input_ids": torch.arange(8) % 32, "labels": torch.arange(8) % 32}] * 240
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8))
    args = TrainingArguments(output_dir="out", max_steps=60, per_device_train_batch_size=4, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True)
    cb = hf.OrchCallback(run_dir=tmp_path, keep_last_k=100, save_every="auto")
    events = spy(cb.auto_save)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[_Slow(), cb]).train()
    assert_auto_saves(tmp_path, events, 60, mtbf_s=2)
