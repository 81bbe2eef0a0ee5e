"""The bundled trainer's multi-rank refusals: what it cannot run as several ranks is refused from the
arguments and torchrun's environment alone, before any process group exists (every rank refuses alike)."""

from __future__ import annotations

import pytest

from orch_trainer.config import parse_args
from orch_trainer.ranks import SINGLE, Ranks, refusal

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def args(*extra: str):
    return parse_args(["--run-dir", "/nonexistent/run", "--batch-size", "8", "--micro-batch-size", "2", *extra])


def test_one_process_is_never_refused_and_is_the_single_path():
    assert refusal(args("--inject-fault", "sigterm@step=3"), {}) is None
    assert refusal(args(), {"WORLD_SIZE": "1"}) is None
    assert Ranks.from_env({}) is SINGLE and Ranks.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is SINGLE


def test_two_ranks_of_a_supported_run_are_accepted():
    assert refusal(args(), TORCHRUN) is None
    r = Ranks.from_env(TORCHRUN)
    assert (r.rank, r.world, r.local_rank, r.multi, r.is_writer) == (1, 2, 1, True, False)


@pytest.mark.parametrize(("extra", "env", "why"), [
    (("--inject-fault", "sigterm@step=3"), {}, "--inject-fault is not supported with WORLD_SIZE=2"),
    # 8 samples cannot be split into micro-batches of 8 over 2 ranks: the effective batch would change
    (("--micro-batch-size", "8"), {}, "--batch-size is the global batch: global batch 8 is not a multiple of "
                                      "micro batch 8 x 2 rank(s)"),
    ((), {"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a positive integer"),
    ((), {"MASTER_PORT": ""}, "WORLD_SIZE=2 without MASTER_PORT: start the ranks with torchrun"),
    ((), {"RANK": "2"}, "RANK='2' is not a rank of WORLD_SIZE=2"),
])
def test_unsupported_combinations_are_refused_in_one_line(extra, env, why):
    got = refusal(args(*extra), {**TORCHRUN, **env})
    assert got is not None and got.startswith(why) and "\n" not in got, got


@pytest.mark.parametrize(("world", "micro"), [("1", 8), ("2", 4), ("4", 2), ("8", 1), ("two", 8)])
def test_the_default_micro_batch_is_the_global_batch_over_the_ranks(monkeypatch, world, micro):
    # The README's `orch submit --nproc-per-node 2 -- python -m orch_trainer --preset tiny` was invalid at
    # once: the default micro-batch was the whole global batch (8) on each of the 2 ranks.
    monkeypatch.setenv("WORLD_SIZE", world)
    a = parse_args(["--run-dir", "/nonexistent/run", "--batch-size", "8"])
    assert a.micro_batch_size == micro
    if world.isdigit():
        assert refusal(a, {**TORCHRUN, "WORLD_SIZE": world, "RANK": "0"}) is None


def test_a_world_that_does_not_divide_the_global_batch_is_refused_saying_what_to_set(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    a = parse_args(["--run-dir", "/nonexistent/run", "--batch-size", "8"])
    got = refusal(a, {**TORCHRUN, "WORLD_SIZE": "3", "RANK": "0"})
    assert got == ("--batch-size is the global batch: global batch 8 is not a multiple of micro batch 8 x 3 rank(s); "
                   "give a --batch-size that 3 ranks divide, or a --micro-batch-size M with M x 3 dividing it"), got


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_ranks_cut_each_step_into_the_same_micro_batches_on_any_world_size(world):
    """Every micro-batch of the global batch is taken by exactly one rank, and one rank alone takes them in order:
    a resume on another world size trains on the same samples (the data is a pure function of the step)."""
    from orch_trainer.loop import micro_index

    per_step = 12  # micro-batches in the global batch
    taken = [micro_index(j, world, r) for r in range(world) for j in range(per_step // world)]
    assert sorted(taken) == list(range(per_step))
    if world == 1:
        assert taken == list(range(per_step))


def test_fsdp_is_refused_on_one_process_and_with_what_its_shards_cannot_hold(capsys):
    assert refusal(args("--fsdp"), {}) == \
        "--fsdp shards over several ranks: start it with orch submit --nproc-per-node K"
    assert refusal(args("--fsdp"), TORCHRUN) is None
    for extra in (("--lora-rank", "4"), ("--save-fork-checkpoint",)):
        with pytest.raises(SystemExit) as e:
            args("--fsdp", *extra)
        assert e.value.code == 2
        assert "--fsdp cannot be used with --lora-rank or --save-fork-checkpoint" in capsys.readouterr().err
