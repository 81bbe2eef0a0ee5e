"""Bring your own trainer: orch's guarantees for plain PyTorch loops, Lightning and Hugging Face ``Trainer``.

Each module imports its framework lazily and only when a training script imports it; the CLI never
imports anything from here (``orch status`` must stay free of torch). What every integration gives:

* resume from the newest *verified* checkpoint (``checkpoints/step-<8 digits>/`` with a manifest),
  never from a half-written one;
* SIGTERM / SIGUSR2 -> a checkpoint of the last completed optimizer step at the next step boundary,
  ``attempts/<n>/failure.json`` with class ``preempted``, exit 143 (0 steps redone on resume);
* ``attempts/<n>/progress.json`` (step, loss) for ``orch status`` and hang detection;
* ``result/`` and ``done.json`` when training ends normally, never after a signal;
* a stable tracker id / TensorBoard dir, so one curve spans every attempt.

Modules: :mod:`.loop` (plain loops), :mod:`.lightning`, :mod:`.hf`, :mod:`.submitit` (its job side in
:mod:`.submitit_runner`); the in-job kit (``orchestrator.kit``) is what they share.
"""

from orchestrator.kit.heartbeat import arm_from_env

# As a training script imports an integration, before it starts its process group: the hang detector then judges
# this rank's start (a rank stopped before init_process_group hung the job unseen).
arm_from_env()
