"""orchestrator.ops.attemptpoll (the part of a pass that polls attempts; ending.finish ends them): the scheduler is
asked once per backend for every polled attempt; an answer it could not give changes nothing; a job's own
surprise is that job's error, never the pass's; an exit ends the attempt with its class and the policy's plan.
In-process on a real DB, the shared fake at the scheduler boundary."""

from __future__ import annotations

import json
import os
import re
import time

from orchestrator import protocol
from orchestrator.backends.base import Outcome, Phase
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.passchanges import PassReport
from orchestrator.ops.attemptpoll import observe, polled_rows
from orchestrator.ops.submit import SubmitRequest, submit


def _state(db, name: str):
    with db.read() as s:
        j = get_job(s, name)
        a = j.attempts[-1]
        return j.state, a.state, a.failure_class and a.failure_class.value, a.counted


def _pass(db, cfg, backend) -> PassReport:
    rep = PassReport()
    observe(db, cfg, lambda _n: backend, polled_rows(db), rep)
    return rep


def test_one_poll_per_backend_for_every_attempt_and_exits_end_attempts_with_their_class(db, cfg, sched):
    for n in ("runs", "crashes", "finishes"):
        submit(db, cfg, SubmitRequest(name=n, command=["true"], outputs=["o.txt"] if n == "finishes" else []))
    fin = cfg.runs_root / "finishes"
    (fin / "o.txt").write_text("x\n")
    protocol.write_done_marker(fin, "finishes", 1, ["o.txt"])
    sched.ended.update(crashes=1, finishes=0)
    calls: list[int] = []
    real_poll = sched.poll
    sched.poll = lambda refs: calls.append(len(refs)) or real_poll(refs)
    rep = _pass(db, cfg, sched)
    assert calls == [3] and (rep.polled, rep.backend_calls, rep.errors) == (3, 1, [])
    assert _state(db, "runs")[:3] == (JobState.RUNNING, AttemptState.RUNNING, None)
    assert _state(db, "crashes")[:3] == (JobState.RETRYABLE_FAILED, AttemptState.FAILED, "crash")
    assert _state(db, "crashes")[3] is True  # the job's own failure counts against --max-attempts
    assert _state(db, "finishes")[:2] == (JobState.DONE, AttemptState.SUCCEEDED)
    assert {c.name for c in rep.changed} == {"runs", "crashes", "finishes"}
    assert _pass(db, cfg, sched).changed == []  # nothing new: nothing written


def test_a_scheduler_that_cannot_answer_changes_nothing(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="j", command=["true"]))
    before = _state(db, "j")
    sched.poll = lambda refs: (_ for _ in ()).throw(RuntimeError("sacct: connection refused"))
    rep = _pass(db, cfg, sched)
    assert rep.errors == ["local poll failed: sacct: connection refused"] and rep.query_failures == 1
    assert _state(db, "j") == before
    sched.poll = lambda refs: {r.token: Outcome(Phase.UNKNOWN, reason="no sacct record") for r in refs}
    rep = _pass(db, cfg, sched)
    assert (rep.unknown, rep.undecided) == (1, ["j: no sacct record"]) and _state(db, "j") == before


def test_one_jobs_surprise_is_its_own_error_and_the_other_jobs_are_still_observed(db, cfg, sched, monkeypatch):
    for n in ("bad", "good"):
        submit(db, cfg, SubmitRequest(name=n, command=["true"]))
    sched.ended.update(bad=1, good=1)
    import orchestrator.ops.attemptpoll as obs

    real = obs.evidence_of_end

    def boom(r, out):
        if str(r.run_dir).endswith("/bad"):
            raise KeyError("a job-written value orch did not expect")
        return real(r, out)

    monkeypatch.setattr(obs, "evidence_of_end", boom)
    rep = _pass(db, cfg, sched)
    assert len(rep.errors) == 1 and rep.errors[0].startswith("bad: KeyError"), rep.errors
    assert _state(db, "good")[0] is JobState.RETRYABLE_FAILED and _state(db, "bad")[1] is AttemptState.SUBMITTED


def _beats(cfg, name: str, ages: dict[int, tuple[float, int]]) -> None:
    """Write each rank's heartbeat file as the kit does (rank 0 progress.json, the others progress.rank-<r>.json),
    dated ``age`` seconds ago, at ``step``."""
    run_dir, now = cfg.runs_root / name, time.time()
    for rank, (age, step) in ages.items():
        if rank == 0:  # rank 0's heartbeat names the world size of a multi-rank job (the kit's Heartbeat does)
            protocol.write_progress(run_dir, 1, step=step, **({"world_size": len(ages)} if len(ages) > 1 else {}))
            path = protocol.attempt_dir(run_dir, 1) / protocol.PROGRESS_FILE
        else:
            protocol.write_rank_progress(run_dir, 1, rank, step)
            path = protocol.attempt_dir(run_dir, 1) / protocol.RANK_PROGRESS.format(rank)
        os.utime(path, (now - age, now - age))


def _stopped(db, name: str) -> tuple[AttemptState, int | None, int | None, float | None]:
    """The attempt's state and the typed record of a hang stop: (state, stale_rank, stale_step, stale_age_s)."""
    with db.read() as s:
        a = get_job(s, name).attempts[-1]
        return a.state, a.stale_rank, a.stale_step, a.stale_age_s


def test_a_hung_rank_is_judged_by_its_own_heartbeat_while_rank_0_still_beats(db, cfg, sched):
    """The attempt is judged by its OLDEST rank's progress. Rank 1 hung (its file 700 s old) while rank 0
    still beat (busy in eval, or a thread of its own): with only progress.json read, nothing was ever stopped."""
    submit(db, cfg, SubmitRequest(name="mr", command=["true"]))
    _beats(cfg, "mr", {0: (1.0, 41), 1: (cfg.hang_timeout_s + 100, 40)})
    rep = _pass(db, cfg, sched)
    state, rank, step, age = _stopped(db, "mr")
    assert state is AttemptState.STOPPING and sched.cancelled == [["mr"]], (state, rank, rep.errors)
    # typed, not a sentence: the rank, its step and its beat's age are columns of the attempt (migration 0010)
    assert (rank, step) == (1, 40) and cfg.hang_timeout_s + 99 < (age or 0) < cfg.hang_timeout_s + 120, age


def test_the_final_record_of_a_hang_stop_is_built_from_the_typed_fields_not_the_detail_text(db, cfg, sched):
    """The stale rank travelled as text: observe wrote "rank 1: ...; stopping it" into the free-text detail and
    classify cut the suffix off. Whatever the detail says meanwhile, the ended attempt's record and its class come
    from stale_rank/stale_step/stale_age_s."""
    submit(db, cfg, SubmitRequest(name="mr", command=["true"]))
    _beats(cfg, "mr", {0: (1.0, 41), 1: (cfg.hang_timeout_s + 100, 40)})
    _pass(db, cfg, sched)
    with db.write() as s:
        get_job(s, "mr").attempts[-1].detail = "operator note; stopping it"
    sched.ended["mr"] = 143
    _pass(db, cfg, sched)
    with db.read() as s:
        a = get_job(s, "mr").attempts[-1]
        assert (a.state, a.failure_class and a.failure_class.value) == (AttemptState.FAILED, "hang"), a.detail
        assert (a.stale_rank, a.stale_step) == (1, 40)
        assert re.fullmatch(r"stopped by the reconciler: rank 1: no progress for 7\d\d s at step 40", a.detail or ""), \
            a.detail


def test_of_several_stale_ranks_the_one_furthest_behind_is_named(db, cfg, sched):
    """Rank 1 stopped at step 40; rank 0, blocked in the next collective with it, beat once more at step 41 and
    stopped too. Whichever file is older by a few ms, the record names the rank that is behind."""
    submit(db, cfg, SubmitRequest(name="mr", command=["true"]))
    _beats(cfg, "mr", {0: (cfg.hang_timeout_s + 10, 41), 1: (cfg.hang_timeout_s + 5, 40),
                       2: (cfg.hang_timeout_s + 10, 41)})
    _pass(db, cfg, sched)
    assert _stopped(db, "mr")[:3] == (AttemptState.STOPPING, 1, 40)


def test_a_one_process_job_is_judged_and_recorded_as_before(db, cfg, sched):
    """No per-rank file: progress.json alone decides; the record names no rank (a one-process job has none)."""
    submit(db, cfg, SubmitRequest(name="one", command=["true"]))
    _beats(cfg, "one", {0: (cfg.hang_timeout_s - 30, 7)})
    # a stale file of a rank's name in a one-process job's dir (its progress.json names no world size): not read
    stray = protocol.attempt_dir(cfg.runs_root / "one", 1) / protocol.RANK_PROGRESS.format(1)
    stray.write_text('{"rank": 1, "step": 1}')
    os.utime(stray, (1.0, 1.0))
    _pass(db, cfg, sched)
    assert _stopped(db, "one")[0] is AttemptState.RUNNING and sched.cancelled == []
    _beats(cfg, "one", {0: (cfg.hang_timeout_s + 30, 7)})
    _pass(db, cfg, sched)
    state, rank, step, age = _stopped(db, "one")
    assert (state, rank, step) == (AttemptState.STOPPING, None, 7) and cfg.hang_timeout_s + 29 < (age or 0), age
    with db.read() as s:
        assert get_job(s, "one").attempts[-1].detail == f"no heartbeat for {age:.0f} s at step 7"
    assert list(protocol.progress_files(cfg.runs_root / "one", 1, 1)) == [0]


def _started(cfg, name: str, age: float, rank0_first_beat_age: float) -> None:
    """The attempt's wrapper started ``age`` s ago, and rank 0 of 2 wrote its first heartbeat (the history's
    first line) ``rank0_first_beat_age`` s ago and its latest one now; rank 1 wrote none."""
    run_dir, now = cfg.runs_root / name, time.time()
    protocol.write_progress(run_dir, 1, step=0, world_size=2, time=now - rank0_first_beat_age)
    protocol.write_progress(run_dir, 1, step=3, world_size=2)
    wrapper = protocol.attempt_dir(run_dir, 1) / protocol.WRAPPER_FILE
    wrapper.write_text("{}")
    os.utime(wrapper, (now - age, now - age))


def test_a_rank_that_never_wrote_its_heartbeat_is_stale_from_the_attempts_start(db, cfg, sched):
    """Rank 1 hung before its first beat while rank 0 (world_size 2) kept beating: only the files that existed
    were judged, so rank 0 alone was, and the hang was never seen. A rank whose file is missing counts from the
    attempt's start (the later of wrapper.json and rank 0's first heartbeat) and is the one furthest behind."""
    submit(db, cfg, SubmitRequest(name="mr", command=["true"]))
    _started(cfg, "mr", cfg.hang_timeout_s + 100, cfg.hang_timeout_s + 90)
    _pass(db, cfg, sched)
    state, rank, step, age = _stopped(db, "mr")
    assert (state, rank, step) == (AttemptState.STOPPING, 1, None) and sched.cancelled == [["mr"]], (state, rank)
    assert cfg.hang_timeout_s + 89 < (age or 0) < cfg.hang_timeout_s + 110, age  # from rank 0's first beat
    with db.read() as s:
        assert get_job(s, "mr").attempts[-1].detail == f"rank 1: no progress for {age:.0f} s, before any step heartbeat"


def test_a_rank_not_yet_beating_just_after_rank_0s_first_beat_is_not_stale_after_a_long_start(db, cfg, sched):
    """Every rank starts its heartbeat after the restore: a restore longer than hang_timeout_s must not make the
    pass that lands between rank 0's first beat and rank 1's stop a healthy attempt (counted from wrapper.json
    alone, rank 1 was 'stale' the moment rank 0 beat)."""
    submit(db, cfg, SubmitRequest(name="mr", command=["true"]))
    _started(cfg, "mr", cfg.hang_timeout_s + 100, 1.0)
    _pass(db, cfg, sched)
    assert _stopped(db, "mr")[0] is AttemptState.RUNNING and sched.cancelled == []


def test_a_fifo_or_symlink_as_the_heartbeat_history_blocks_no_pass_and_the_start_decides(db, cfg, sched, tmp_path):
    """The missing rank's clock reads the first line of rank 0's progress.jsonl, a file the job writes: a FIFO
    there must not block every reconcile pass (an open() without O_NONBLOCK waits for a writer for ever), and a
    symlink is not followed; the attempt's start then decides alone."""
    import threading

    for name, kind in (("fifo", "fifo"), ("link", "link")):
        submit(db, cfg, SubmitRequest(name=name, command=["true"]))
        _started(cfg, name, cfg.hang_timeout_s + 100, 1.0)
        history = protocol.attempt_dir(cfg.runs_root / name, 1) / protocol.PROGRESS_HISTORY
        history.unlink()
        if kind == "fifo":
            os.mkfifo(history)
        else:
            target = tmp_path / "elsewhere.jsonl"  # a first beat 1 s ago there: followed, it would say "not yet"
            target.write_text(json.dumps({"time": time.time() - 1.0, "step": 0}) + "\n")
            history.symlink_to(target)
    done = threading.Event()
    t = threading.Thread(target=lambda: (_pass(db, cfg, sched), done.set()), daemon=True)
    t.start()
    assert done.wait(30), "a reconcile pass blocked on a FIFO named progress.jsonl"
    for name in ("fifo", "link"):
        assert _stopped(db, name)[:3] == (AttemptState.STOPPING, 1, None), name


def test_the_schedulers_runs_are_kept_as_they_grow_and_never_shrink_and_a_steady_pass_writes_nothing(db, cfg, sched):
    """observe keeps each run's Start and End as the scheduler accounted them (goodput's held time, issue 45): a run
    that began or ended is written, an answer that knows fewer runs (accounting lagging) keeps what was learnt,
    and an unchanged answer opens no write transaction."""
    submit(db, cfg, SubmitRequest(name="j", command=["true"]))
    answers = [Outcome(Phase.RUNNING, runs=((1000.0, None),)),
               Outcome(Phase.PENDING, restart_count=1, runs=((1000.0, 1013.0),)),
               Outcome(Phase.RUNNING, restart_count=1, runs=((1000.0, 1013.0), (1028.0, None))),
               Outcome(Phase.RUNNING, restart_count=1, runs=((1000.0, 1013.0),)),  # lagging: kept as it was
               Outcome(Phase.RUNNING, restart_count=1, runs=())]  # a backend with no account: kept
    stored = []
    for out in answers:
        sched.poll = lambda refs, out=out: {r.token: out for r in refs}
        _pass(db, cfg, sched)
        with db.read() as s:
            stored.append(get_job(s, "j").attempts[-1].runs)
    assert stored == [[[1000.0, None]], [[1000.0, 1013.0]], [[1000.0, 1013.0], [1028.0, None]],
                      [[1000.0, 1013.0], [1028.0, None]], [[1000.0, 1013.0], [1028.0, None]]]
    writes = []
    real_write = db.write
    db.write = lambda *a, **k: writes.append(1) or real_write(*a, **k)
    _pass(db, cfg, sched)
    assert writes == []


def test_rank_restarts_the_wrapper_recorded_are_counted_as_they_grow_never_taken_back_and_read_by_the_metrics(
        db, cfg, sched):
    """observe stores how many rank restarts the attempt's record holds (migration 0012), so ``orch metrics`` opens
    the records of the attempts that restarted only; a steady pass writes nothing, and a record garbled later does
    not take a counted restart back."""
    from orchestrator.views.metrics import collect, render

    submit(db, cfg, SubmitRequest(name="j", command=["true"], resources={"nproc_per_node": 2, "rank_restarts": 2}))
    submit(db, cfg, SubmitRequest(name="other", command=["true"]))
    with db.read() as s:
        a = get_job(s, "j").attempts[-1]
        adir, token = protocol.attempt_dir(cfg.runs_root / "j", a.n), a.token
        o = get_job(s, "other").attempts[-1]
    # A job that never named --rank-restarts: its record is not read (the wrapper writes none for it; reading
    # every polled attempt's was an ENOENT each, 100 ms of a 10,000-job pass).
    protocol.append_rank_restart(protocol.attempt_dir(cfg.runs_root / "other", o.n), o.token, {
        "at": 1.0, "failed_rank": 1, "rank_returncode": -9, "class": "killed", "failed_step": 5, "resume_step": 0})

    def stored() -> int:
        _pass(db, cfg, sched)
        with db.read() as s:
            return get_job(s, "j").attempts[-1].rank_restarts

    assert stored() == 0
    protocol.append_rank_restart(adir, token, {"at": 1.0, "failed_rank": 1, "rank_returncode": -9, "class": "killed",
                                               "failed_step": 45, "resume_step": 40})
    assert stored() == 1
    protocol.append_rank_restart(adir, token, {"at": 2.0, "failed_rank": 0, "rank_returncode": -7,
                                               "class": "node_fail", "failed_step": 90, "resume_step": 80})
    assert stored() == 2
    writes = []
    real_write = db.write
    db.write = lambda *a, **k: writes.append(1) or real_write(*a, **k)
    _pass(db, cfg, sched)
    assert writes == []
    db.write = real_write
    text = render(collect(db))
    assert 'orch_rank_restarts{class="killed"} 1\n' in text and 'orch_rank_restarts{class="node_fail"} 1\n' in text
    assert 'orch_rank_restarts{class="oom"} 0\n' in text  # every class listed, 0 included
    assert "orch_rank_restart_steps_redone_sum 15\n" in text and "orch_rank_restart_steps_redone_count 2\n" in text
    (adir / protocol.RANK_RESTARTS_FILE).write_text("{garbage")
    assert stored() == 2
    assert 'orch_rank_restarts{class="killed"} 0\n' in render(collect(db))  # the metrics say what the records hold
    with db.read() as s:
        assert get_job(s, "other").attempts[-1].rank_restarts == 0
