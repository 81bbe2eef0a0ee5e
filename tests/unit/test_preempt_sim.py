"""The P7 simulation (bench/_preempt_sim.py) against what can be worked out by hand.

BENCHMARKS.md's P7 tables are only as honest as this model: the checks pin the formulas, the cost of
periodic saves without preemptions, that Daly's interval is the best one for periodic-only, and that
orch's SIGTERM checkpoint is worth nothing when the save does not fit in the grace.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _preempt_sim as S

DAY = 24 * 3600.0


def med(mode: str, rate: float, costs: S.Costs, interval: float, seeds: int = 15) -> float:
    return statistics.median(S.simulate(mode, rate, s, costs, interval) for s in range(seeds))


def test_young_and_daly_formulas() -> None:
    assert S.young(2.0, 3600.0) == pytest.approx(120.0)
    # Daly: sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C, here C/2M = 1/3600
    x = 1 / 3600
    assert S.daly(2.0, 3600.0) == pytest.approx(120.0 * (1 + math.sqrt(x) / 3 + x / 9) - 2.0)
    assert S.daly(300.0, 100.0) == 100.0  # C >= 2M: save every M


def test_without_preemptions_only_the_periodic_saves_cost() -> None:
    c = S.Costs(t_step=0.01, save_cost=5.0, term_save=1.0, restart=2.0)
    saves = DAY / 600.0 - 1  # no save at the very end
    for mode in ("orch", "periodic"):
        assert S.simulate(mode, 1e-12, 0, c, 600.0) == pytest.approx(DAY / (DAY + saves * 5.0))
        assert S.simulate(mode, 1e-12, 0, c, math.inf) == pytest.approx(1.0)


def test_daly_interval_is_periodic_onlys_best() -> None:
    c = S.Costs(t_step=0.01, save_cost=10.0, term_save=10.0, restart=5.0)
    tau = S.daly(10.0, 3600.0)
    best = med("periodic", 1.0, c, tau)
    assert best > med("periodic", 1.0, c, tau / 4) and best > med("periodic", 1.0, c, tau * 4)
    assert best > med("periodic", 1.0, c, 600.0)  # the fixed 10 min is worse than the optimum


def test_sigterm_checkpoint_helps_only_when_it_fits_in_the_grace() -> None:
    fits = S.Costs(t_step=1.0, save_cost=60.0, term_save=60.0, restart=60.0, grace=90.0)
    late = S.Costs(t_step=1.0, save_cost=60.0, term_save=60.0, restart=60.0, grace=30.0)
    tau = S.daly(60.0, 1800.0)
    periodic = med("periodic", 2.0, fits, tau)
    assert med("orch", 2.0, fits, tau) > periodic + 0.03
    assert med("orch", 2.0, late, tau) == pytest.approx(periodic, abs=0.02)


def test_goodput_stays_a_fraction_when_preemptions_hit_saves_and_restarts() -> None:
    c = S.Costs(t_step=1.0, save_cost=300.0, term_save=300.0, restart=300.0, grace=400.0)
    for mode in ("orch", "periodic"):
        for seed in range(5):
            g = S.simulate(mode, 8.0, seed, c, 300.0, work=6 * 3600.0)
            assert 0.0 < g < 0.5


@pytest.mark.parametrize("field", ["t_step", "save_cost", "term_save", "restart", "grace"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_cost_that_is_not_a_finite_number_is_refused(field, bad):
    # A trial that measured no resumed step gave a NaN restart time, and the simulation's restart loop never ended
    # (bench_preemption --quick under CI's load ran past its test's 15 min).
    costs = {"t_step": 0.1, "save_cost": 1.0, "term_save": 1.0, "restart": 5.0, "grace": 30.0}
    with pytest.raises(ValueError, match=f"Costs.{field} must be a finite number"):
        S.Costs(**{**costs, field: bad})
