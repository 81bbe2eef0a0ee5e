"""Lightning OrchCallback claims that need a signal at a chosen batch: driven in-process (no orch)."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from orchestrator import protocol
from orchestrator.integrations import lightning as orch


class Tiny(L.LightningModule):
    def __init__(self, signal_at_batch: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.signal_at_batch = signal_at_batch
        self.batches = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.batches += 1
        if self.batches == self.signal_at_batch:
            os.kill(os.getpid(), signal.SIGUSR2)  # the time-limit warning, mid gradient accumulation
        return self.lin(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(run_dir, signal_at_batch: int | None = None) -> int:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(max_steps=8, accumulate_grad_batches=2, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, accelerator="cpu",
                        callbacks=[orch.OrchCallback(run_dir=run_dir)])
    try:
        trainer.fit(Tiny(signal_at_batch), data, ckpt_path=orch.resume_path(run_dir))
    except SystemExit as e:
        return e.code
    return 0


def test_sigusr2_mid_accumulation_checkpoints_at_the_next_optimizer_step_and_exits_143(tmp_path):
    # Batch 5 is the first half of optimizer step 3: the accumulated gradient is in no checkpoint, so
    # the callback waits for the step to complete and saves step 3 (not "step 2 and a half").
    assert _fit(tmp_path, signal_at_batch=5) == protocol.EXIT_PREEMPTED
    report = protocol.read_failure(tmp_path, 1)
    assert (report["class"], report["step"]) == ("preempted", 3) and "SIGUSR2" in report["detail"], report
    assert [s for s, _ in protocol.verified_checkpoints(tmp_path)] == [3]
    assert not (tmp_path / "done.json").exists()
    assert _fit(tmp_path) == 0 and protocol.verify_done_marker(tmp_path).verified
    meta = protocol.read_json_bounded(tmp_path / "result" / "metrics.json")
    assert meta["global_step"] == 8


def test_without_orch_and_without_run_dir_the_callback_says_what_is_missing(monkeypatch):
    monkeypatch.delenv(protocol.ENV_RUN_DIR, raising=False)
    with pytest.raises(ValueError, match="no run dir: run under orch"):
        orch.resume_path()


class SignalDuringSanityCheck(Tiny):
    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        if self.trainer.sanity_checking and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_before_training_starts_exits_143_not_lightnings_0(tmp_path):
    # Until on_train_start Lightning's own SIGTERM handler runs too: it raises SIGTERMException, a
    # SystemExit with code 0 (measured). The callback turns it into a preemption.
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(max_steps=8, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=2,
                        callbacks=[orch.OrchCallback(run_dir=tmp_path)])
    with pytest.raises(SystemExit) as e:
        trainer.fit(SignalDuringSanityCheck(), data, data)
    assert e.value.code == protocol.EXIT_PREEMPTED
    report = protocol.read_failure(tmp_path, 1)
    assert (report["class"], report["step"], report["checkpoint"]) == ("preempted", 0, None), report
    assert not (tmp_path / "done.json").exists()


class WithValidation(Tiny):
    """Signals itself in validation batch ``signal_at_val`` of the first validation."""

    def __init__(self, signal_at_val: int | None = None) -> None:
        super().__init__()
        self.signal_at_val = signal_at_val
        self.val_batches = 0

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.val_batches += 1
        if self.val_batches == self.signal_at_val:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.lin(batch[0]).pow(2).mean()


def test_sigterm_during_validation_stops_at_the_next_validation_batch_with_the_steps_checkpoint(tmp_path):
    """A flag checked at training-step boundaries only waited for the whole validation (and one more
    step) before saving: a SIGTERM during eval must be honoured at the next validation batch."""
    def fit(module: WithValidation) -> int:
        torch.manual_seed(0)
        data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
        trainer = L.Trainer(max_steps=8, val_check_interval=4, limit_val_batches=12, logger=False,
                            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                            num_sanity_val_steps=0, accelerator="cpu", callbacks=[orch.OrchCallback(run_dir=tmp_path)])
        try:
            trainer.fit(module, data, data, ckpt_path=orch.resume_path(tmp_path))
        except SystemExit as e:
            return e.code
        return 0

    module = WithValidation(signal_at_val=3)
    assert fit(module) == protocol.EXIT_PREEMPTED
    assert module.val_batches == 3, "validation went on after the stop was agreed"
    report = protocol.read_failure(tmp_path, 1)
    assert (report["class"], report["step"]) == ("preempted", 4), report  # the step validation followed
    assert [s for s, _ in protocol.verified_checkpoints(tmp_path)] == [4]
    assert fit(WithValidation()) == 0 and protocol.verify_done_marker(tmp_path).verified
    assert protocol.read_json_bounded(tmp_path / "result" / "metrics.json")["global_step"] == 8
