"""Pending approvals survive a streams worker restart and a rebalance to a second worker:
decisions still join, expiries still fire, nothing is duplicated."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from ratifier.processes import wait_for_log
from ratifier.topics import delete_topics
from schemas.names import Topic
from tests.e2e.approvals_kit import (
    call_history,
    committed,
    decide,
    propose,
    terminal_outcomes,
    token,
)
from tests.e2e.conftest import Pipeline, SigningKeys, start_pipeline
from tests.services import read_to_end, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture
def own_pipeline(signing_keys: SigningKeys) -> Iterator[Pipeline]:
    # Long enough for a restart and a rebalance under a loaded CI machine.
    pipeline = start_pipeline(signing_keys, "durability", approval_ttl=60)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        run(delete_topics(pipeline.settings))


def test_restart_and_rebalance_keep_pending_approvals(own_pipeline: Pipeline) -> None:
    pipeline = own_pipeline
    began = time.time()
    first, second, third = propose(pipeline, n=3)
    ids = {r["call_id"] for r in (first, second, third)}

    pipeline.stop_worker("streams")  # pending approvals live only in the join's table now
    pipeline.start("streams", "streams-restarted", RATIFIER_STREAMS__HTTP_PORT="0")
    boss = token(pipeline.settings, "boss")
    decide(pipeline, first, boss)
    found = terminal_outcomes(pipeline, {first["call_id"]}, timeout=90)[first["call_id"]]
    assert found[0]["status"] == "succeeded", call_history(pipeline, first["call_id"], since=began)

    pipeline.start("streams", "streams-second", RATIFIER_STREAMS__HTTP_PORT="0")  # rebalance
    decide(pipeline, second, boss)
    found = terminal_outcomes(pipeline, {second["call_id"]}, timeout=90)[second["call_id"]]
    assert found[0]["status"] == "succeeded", call_history(pipeline, second["call_id"], since=began)

    # Nobody decides the third: its expiry still fires, on whichever worker owns it now.
    outcomes = terminal_outcomes(
        pipeline, ids, timeout=pipeline.settings.approvals.ttl_seconds + 60
    )
    assert {
        c: [(o["status"], (o["error"] or {}).get("code")) for o in found]
        for c, found in outcomes.items()
    } == {
        first["call_id"]: [("succeeded", None)],
        second["call_id"]: [("succeeded", None)],
        third["call_id"]: [("expired", "approval_expired")],
    }
    commands = committed(pipeline, ids)
    assert [len(commands[c]) for c in (first["call_id"], second["call_id"], third["call_id"])] == [
        1,
        1,
        0,
    ]
    requests = Counter(
        json.loads(r.value)["call_id"]
        for r in run(read_to_end(pipeline.settings, [Topic.APPROVALS_REQUESTED]))
    )
    assert {c: requests[c] for c in ids} == dict.fromkeys(ids, 1)
    assert pipeline.alive()


def test_decisions_published_while_the_join_restarts_are_all_handled(
    own_pipeline: Pipeline,
) -> None:
    """The reproduction of the lost decision (docs/reliability.md): decisions published from
    the moment a new join process starts, through its group join and its first partitions,
    to when it is ready, are each handled once."""
    pipeline = own_pipeline
    began = time.time()
    requests = propose(pipeline, n=12)
    ids = {r["call_id"] for r in requests}
    pipeline.stop_worker("streams")
    boss = token(pipeline.settings, "boss")
    worker = pipeline.start("streams", "streams-restarted", RATIFIER_STREAMS__HTTP_PORT="0")
    # Four before the new join has its partitions, four once it owns them, four once it is
    # ready.
    for n, request in enumerate(requests):
        if n == 4:
            assert wait_for_log(worker, "approval-join owns", timeout=60), worker.log_tail()
        if n == 8:
            assert wait_for_log(worker, "approval-join ready", timeout=60), worker.log_tail()
        decide(pipeline, request, boss)
    outcomes = terminal_outcomes(pipeline, ids, timeout=90)
    unfinished = [
        c for c, found in outcomes.items() if [o["status"] for o in found] != ["succeeded"]
    ]
    assert not unfinished, "\n".join(call_history(pipeline, c, since=began) for c in unfinished)
    assert pipeline.alive()
