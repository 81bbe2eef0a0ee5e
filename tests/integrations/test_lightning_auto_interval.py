"""OrchCallback(every_n_steps="auto"): Lightning saves at Daly's interval for the cost it measures and the MTBF
orch hands it; every rank decides together (save_checkpoint is collective). Driven in-process, no orch."""

from __future__ import annotations

import time

import lightning.pytorch as L
import torch
from autospy import assert_auto_saves, spy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from orchestrator.integrations import lightning as orch


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
    assert_auto_saves(tmp_path, events, 60, mtbf_s=2)
