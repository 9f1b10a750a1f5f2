"""Shared checks of the diagnosis round tests (tests/test_diagnosis_round*.py)."""

from __future__ import annotations

from tasks.diagnosis.diagnose import Diagnosis, diagnose


def assert_diagnosed(text: str, type_: str, category: str, root: str | None = None) -> Diagnosis:
    """Diagnose a synthetic log (rules only, no learned fallback) and check its type, category and, when `root` is
    given, that the root-cause line holds it. Returns the diagnosis for further checks."""
    d = diagnose(text.encode(), use_fallback=False)
    assert (d.type, d.category) == (type_, category), d.root_cause_line
    if root is not None:
        assert d.root_cause_line is not None and root in d.root_cause_line, d.root_cause_line
    return d


def assert_case(head: str, case: tuple[str, str, str, str, str, bool]) -> None:
    """One row of a round's case table: (what it shows, the log after `head`, type, category, a piece of the root
    line, restartable)."""
    what, log, type_, category, root, restartable = case
    d = assert_diagnosed(head + log, type_, category, root)
    assert d.restartable is restartable, what
