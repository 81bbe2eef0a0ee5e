"""OrchCallback(every_n_steps="auto"): Lightning saves at Daly's interval for the cost it measures and the MTBF
orch hands it; every rank decides together (save_checkpoint is collective). Driven in-process, no orch."""

from __future__ import annotations

import time

import lightning.pytorch as L
import pytest
import torch
from autospy import assert_saves_one_interval_apart, spy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from orchestrator import protocol
from orchestrator.integrations import lightning as orch
from orchestrator.kit.interval import daly_interval


class Slow(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(0.02)
        return self.lin(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_auto_saves_at_the_interval_and_reports_what_it_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_MTBF_S", "2")
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "0.05")
    data = DataLoader(TensorDataset(torch.randn(240, 4)), batch_size=4)
    cb = orch.OrchCallback(every_n_steps="auto", keep_last_k=100, run_dir=tmp_path)
    events = spy(cb.auto_save)
    trainer = L.Trainer(max_steps=60, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", callbacks=[cb])
    trainer.fit(Slow(), data)
    beats = [b for b in protocol.read_progress_history(tmp_path, 1) if "save_cost_s" in b]
    assert beats and all(b["mtbf_s"] == 2 for b in beats)
    last = beats[-1]
    assert last["save_interval_s"] == pytest.approx(max(0.25, daly_interval(last["save_cost_s"], 2)), rel=1e-6)
    saved = [s for s, _ in protocol.verified_checkpoints(tmp_path)]
    assert min(saved) == 1  # the first save measures the cost
    assert len(saved) == len([e for e in events if e[0] == "saved"])
    assert_saves_one_interval_apart(events, 60)
