"""``orch_run(save_every="auto")``: the plain-loop integration saves at Daly's interval for the cost it measures
and the MTBF orch hands it (in this process, a real model and real checkpoints; no orch around it)."""

from __future__ import annotations

import time

import pytest
import torch
from autospy import assert_saves_one_interval_apart, spy

from orchestrator import protocol
from orchestrator.integrations.loop import orch_run
from orchestrator.kit.interval import daly_interval


def test_orch_run_auto_saves_at_the_interval_and_reports_what_it_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_MTBF_S", "2")
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "0.05")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with orch_run(model, opt, save_every="auto", keep_last_k=100, run_dir=tmp_path) as run:
        events = spy(run.auto_save)
        for _step in run.steps(60):
            time.sleep(0.02)  # 1.2 s of training: several intervals of ~0.25-0.3 s
    beats = protocol.read_progress_history(tmp_path, 1)
    # the first beat is the loop's start at its resume step: goodput's startup ends there, not extrapolated
    assert (beats[0]["step"], beats[0]["resumed_from"]) == (0, 0)
    beats = [b for b in beats if "save_cost_s" in b]
    assert all(b["mtbf_s"] == 2 for b in beats)
    last = beats[-1]
    assert last["save_interval_s"] == pytest.approx(max(0.25, daly_interval(last["save_cost_s"], 2)), rel=1e-6)
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir())
    assert saved[0] == 1  # the first save measures the cost
    assert len(saved) == len([e for e in events if e[0] == "saved"])
    assert_saves_one_interval_apart(events, 60)
