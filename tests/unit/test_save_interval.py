"""``--save-interval auto``: Daly's interval from the measured save cost and the MTBF orch hands the job."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.kit.interval import PRIOR_MTBF_S, AutoSaveInterval, daly_interval, mtbf_from_env


def test_daly_matches_the_papers_example_and_its_limits():
    assert daly_interval(300, 24 * 3600) / 60 == pytest.approx(117, abs=1)  # M = 24 h, δ = 5 min -> ~117 min
    assert daly_interval(10, 1e6) == pytest.approx(math.sqrt(2 * 10 * 1e6) - 10, rel=1e-3)  # Young's, small δ
    assert daly_interval(500, 200) == 200  # δ >= 2M: save every M
    with pytest.raises(ValueError):
        daly_interval(1, 0)


def test_the_first_save_measures_the_cost_and_the_interval_follows_a_slower_save():
    now = [0.0]
    auto = AutoSaveInterval(mtbf_s=3600, clock=lambda: now[0])
    assert auto.due()  # δ unknown: save at the first step boundary
    auto.record_save(1.0)
    first = auto.interval_s
    assert first == pytest.approx(daly_interval(1.0, 3600))
    now[0] += first - 0.01
    assert not auto.due()
    now[0] += 0.02
    assert auto.due()
    for _ in range(20):  # saves become 4x slower and stay so: the interval moves to daly(4, M), ~2x
        auto.record_save(4.0)
    assert auto.interval_s == pytest.approx(daly_interval(4.0, 3600), rel=1e-4)
    assert 1.8 < auto.interval_s / first < 2.1


def test_orch_hands_over_the_mtbf_and_a_bad_or_missing_value_means_the_prior():
    assert mtbf_from_env({"ORCH_MTBF_S": "7200", "ORCH_MTBF_SOURCE": "history"}) == (7200.0, "history")
    for bad in ("", "x", "nan", "inf", "-5", "0"):
        m, src = mtbf_from_env({"ORCH_MTBF_S": bad})
        assert m == PRIOR_MTBF_S and "prior" in src


def test_with_injected_unwarned_failures_the_work_lost_per_failure_is_about_half_the_interval():
    """A simulated run (virtual time): 5 s steps, saves costing δ = 5 s, failures at exponential times with
    mean M = 2 h. Daly's τ here is ~265 s; what each failure loses (compute since the last save ended) averages
    ~τ/2 (a little less: a failure is more likely early than late in a long interval... by memorylessness it
    is uniform enough at τ << M)."""
    rng = random.Random(1)
    m, delta = 7200.0, 5.0
    t = [0.0]
    auto = AutoSaveInterval(mtbf_s=m, clock=lambda: t[0])
    lost, next_fail = [], rng.expovariate(1 / m)
    while len(lost) < 200:
        if auto.due():
            t[0] += delta
            auto.record_save(delta)
        t[0] += 5.0
        if t[0] >= next_fail:
            lost.append(t[0] - auto._last_end)  # compute since the last save: redone after the restart
            auto._last_end = t[0]  # the restart resumes from that save (restore time not modelled)
            next_fail = t[0] + rng.expovariate(1 / m)
    tau = daly_interval(delta, m)
    assert sum(lost) / len(lost) == pytest.approx(tau / 2, rel=0.15)


def test_a_resumed_attempt_starts_from_the_cost_its_predecessor_measured(tmp_path):
    """A restart must not pay an extra save at its first step to measure δ again (with a 5-minute save, one
    per failure): the previous attempt's heartbeat says what δ was; only a first attempt measures it first."""
    from orchestrator import protocol

    now = [100.0]
    first = AutoSaveInterval.for_run(tmp_path, 1, mtbf_s=3600, clock=lambda: now[0])
    assert first.cost_s is None and first.due()
    protocol.write_progress(tmp_path, 1, step=7, save_cost_s=4.0, mtbf_s=3600)
    protocol.write_progress(tmp_path, 2, step=7)  # attempt 2 died in its restore: no cost of its own
    third = AutoSaveInterval.for_run(tmp_path, 3, mtbf_s=3600, clock=lambda: now[0])
    assert third.cost_s == 4.0 and not third.due()  # the checkpoint it resumed from is the newest save
    now[0] += daly_interval(4.0, 3600)
    assert third.due()


def test_orchs_mtbf_estimate_starts_at_the_prior_and_follows_the_failures():
    from orchestrator.decide.mtbf import estimate_mtbf

    assert estimate_mtbf(0, 0) == PRIOR_MTBF_S  # no history: the prior
    assert estimate_mtbf(10 * 24 * 3600, 0) > PRIOR_MTBF_S  # a clean history: longer
    assert estimate_mtbf(3600, 4) < PRIOR_MTBF_S / 10  # 4 failures in an hour: down from 24 h to 1.6 h
    assert estimate_mtbf(10 * 3600, 40) == pytest.approx(900, rel=0.65)  # 10 h at 4/h: 24 min for 15
    assert estimate_mtbf(100 * 3600, 400) == pytest.approx(900, rel=0.1)  # many failures: about H / n (953 s)
