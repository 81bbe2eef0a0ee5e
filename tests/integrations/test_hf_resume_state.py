"""Resume state is never trashed: HF's default layout (checkpoints inside output_dir) under
``--outputs 'out/*'``; a torn checkpoint is set aside and the framework's own resume takes the next one;
``orch show`` says what each launch moved and why. Local backend, real CLI, real transformers."""

from __future__ import annotations

import sys

from intkit import DONE, ROOT, step_log

SCRIPTS = ROOT / "tests" / "integrations" / "scripts"


def test_hf_default_layout_under_outputs_keeps_checkpoints_and_sets_a_torn_one_aside(orch, tmp_path):
    log = tmp_path / "steps.log"
    orch("submit", "--name", "hfdef", "--outputs", "out/*", "--", sys.executable,
         str(SCRIPTS / "hf_default_layout.py"), str(log), "40", "25", check=True)
    assert orch.wait("hfdef", {"retryable_failed", DONE, "failed"}, timeout=180) == "retryable_failed"
    run_dir = orch.runs / "hfdef"
    assert (run_dir / "out" / "checkpoint-10" / "trainer_state.json").is_file()
    # A kill mid-save as it happens: checkpoint-20's optimizer.pt cut in half (a torch zip without its
    # central directory). HF's get_last_checkpoint would pick it and crash on it at every attempt.
    opt = run_dir / "out" / "checkpoint-20" / "optimizer.pt"
    data = opt.read_bytes()
    opt.write_bytes(data[: len(data) // 2])
    (run_dir / "out" / "stale.txt").write_text("an unverified output of attempt 1")

    p = orch("requeue", "hfdef")
    assert p.returncode == 0, p.stdout + p.stderr
    assert orch.wait("hfdef", {DONE, "retryable_failed", "failed"}, timeout=180) == DONE, orch.show("hfdef")
    steps = step_log(log)
    assert min(s for a, s in steps if a == 2) == 11, steps  # resumed from checkpoint-10, the last good one
    trashed = [str(x.relative_to(orch.home / "trash")) for x in (orch.home / "trash").rglob("checkpoint-*")]
    assert not trashed, f"requeue moved HF's checkpoints to the trash: {trashed}"
    torn = list((run_dir / "out").glob("checkpoint-20.torn-*"))
    assert len(torn) == 1 and (torn[0] / "trainer_state.json").is_file(), list((run_dir / "out").iterdir())

    second = orch.show("hfdef")["attempts"][1]
    assert [t["path"] for t in second["trashed"]] == ["out/stale.txt"], second
    assert "--outputs out/*" in second["trashed"][0]["why"]
    assert second["set_aside"][0]["path"] == "out/checkpoint-20", second
    assert "optimizer.pt" in second["set_aside"][0]["why"]
    text = orch("show", "hfdef").stdout
    assert "moved to trash at launch: out/stale.txt" in text and "set aside at launch: out/checkpoint-20" in text
    assert orch("verify", "hfdef").returncode == 0


def test_hf_callback_keeps_save_total_limit_checkpoints(tmp_path, monkeypatch):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from orchestrator import protocol
    from orchestrator.integrations import hf

    for k in [k for k in __import__("os").environ if k.startswith("ORCH_")]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    data = [{"input_ids": torch.arange(8) % 32, "labels": torch.arange(8) % 32}] * 64
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8))
    args = TrainingArguments(output_dir="out", max_steps=20, per_device_train_batch_size=4, save_strategy="steps",
                             save_steps=4, save_total_limit=3, report_to=[], use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[hf.OrchCallback(run_dir=tmp_path)]).train()
    assert [s for s, _ in protocol.verified_checkpoints(tmp_path)] == [20, 16, 12]  # was always 2
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # every one moved to checkpoints/
