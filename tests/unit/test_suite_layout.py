"""The test suite's own layout: test folders have no ``__init__.py``, so pytest imports every test module by
its basename and two files of one name in two folders break collection for the whole run ("import file
mismatch"; seen when unit tests were renamed to tests/unit/test_<module>.py beside the end-to-end
tests/local/test_metrics.py, now test_metrics_textfile.py)."""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_and_kit_has_a_basename_of_its_own():
    names = collections.Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py"
                                and "__pycache__" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
