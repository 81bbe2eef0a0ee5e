"""HF OrchCallback at a stop: the save is not kept waiting behind an evaluation."""

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


def _training(tmp_path, **kwargs) -> tuple[orch.OrchCallback, TrainingArguments, TrainerState]:
    """A callback inside ``train()`` (on_train_begin ran, no orch: ``run_dir``), a signal received."""
    cb = orch.OrchCallback(run_dir=tmp_path)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], **kwargs)
    state = TrainerState()
    state.global_step = 10
    cb.on_train_begin(args, state, TrainerControl())
    cb.flag.set("SIGTERM")
    return cb, args, state


def test_a_signal_during_an_evaluation_in_training_saves_the_evaluated_step_and_stops(tmp_path):
    cb, args, state = _training(tmp_path)
    try:
        got = cb.on_evaluate(args, state, TrainerControl(), metrics={})
        assert (got.should_save, got.should_training_stop) == (True, True)
    finally:
        cb._close()


def test_an_evaluation_outside_training_or_with_save_strategy_best_is_no_stop_point(tmp_path):
    """Outside ``train()`` (maybe on one rank only) no agreement; with ``save_strategy="best"`` HF overrides
    ``should_save`` after the evaluation: the stop waits for the next step, where the save is sure."""
    cb = orch.OrchCallback(run_dir=tmp_path)
    cb.flag.set("SIGTERM")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    got = cb.on_evaluate(args, TrainerState(), TrainerControl(), metrics={})
    assert (got.should_save, got.should_training_stop) == (False, False)
    cb, args, state = _training(tmp_path, save_strategy="best", eval_strategy="steps", metric_for_best_model="loss")
    try:
        got = cb.on_evaluate(args, state, TrainerControl(), metrics={})
        assert (got.should_save, got.should_training_stop) == (False, False)
    finally:
        cb._close()
