"""HF OrchCallback at a stop: the save is not kept waiting behind an evaluation (issue 19)."""

from __future__ import annotations

from transformers import TrainerControl, TrainerState, TrainingArguments

from orchestrator.integrations import hf as orch


def test_a_stop_at_a_step_cancels_the_evaluation_hf_would_run_before_the_save(tmp_path):
    cb = orch.OrchCallback(run_dir=tmp_path)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    state, control = TrainerState(), TrainerControl()
    state.global_step = 7
    control.should_evaluate = True  # eval_strategy="steps" scheduled one at this step
    cb.flag.set("SIGTERM")
    got = cb.on_step_end(args, state, control)
    assert (got.should_save, got.should_training_stop, got.should_evaluate) == (True, True, False)
