from __future__ import annotations

import pytest

from commands.catalog import Catalog
from commands.validate import Limits
from schemas.envelopes import Outcome, SourcePosition, ValidatedCall
from streams.validator import on_proposed
from tests.matrix import MATRIX, Case, envelope
from tests.unit.conftest import NOW


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_matrix_on_the_pure_validator(case: Case, catalog: Catalog, limits: Limits) -> None:
    raw = envelope(case, call_id="m-1", context="tok", proposed_at=NOW.isoformat())
    emits = on_proposed(
        raw,
        source=SourcePosition(topic="t", partition=0, offset=1),
        catalog=catalog,
        limits=limits,
        now=NOW,
        trace_id=None,
    )
    outcomes = [e.value for e in emits if isinstance(e.value, Outcome)]
    if case.code is None:
        assert [type(e.value) for e in emits] == [ValidatedCall]
        return
    (outcome,) = outcomes
    assert outcome.error is not None
    assert outcome.error.code.value == case.code
    if case.path is not None:
        assert [f.path for f in outcome.error.fields] == [case.path]
