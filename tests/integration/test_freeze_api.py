"""The dashboard's kill-switch API on real Kafka: who may freeze (a verified token, operator
rights by Cedar policy), the `controls` record it publishes (who and why, no token), and the
frozen scopes it lists; unfreezing lifts them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from config.settings import Settings
from schemas.names import Topic
from tests.services import bearer, read_until

pytestmark = pytest.mark.integration


async def test_operators_freeze_list_and_unfreeze_their_tenants_scopes(
    dashboard: Any, own_settings: Settings
) -> None:
    operator = bearer(own_settings, "tenant-a", ("operator",))
    freeze = {"scope": "writes:tenant-a", "frozen": True, "reason": "incident 9"}
    assert (await dashboard.post("/api/freezes", json=freeze)).status == 401
    approver = bearer(own_settings, "tenant-a", ("approver",))
    assert (await dashboard.post("/api/freezes", json=freeze, headers=approver)).status == 403
    other = {**freeze, "scope": "writes:tenant-b"}
    assert (await dashboard.post("/api/freezes", json=other, headers=operator)).status == 403
    fleet = {**freeze, "scope": "writes:*"}
    assert (await dashboard.post("/api/freezes", json=fleet, headers=operator)).status == 403
    bad = {**freeze, "scope": "everything"}
    assert (await dashboard.post("/api/freezes", json=bad, headers=operator)).status == 400
    assert (
        await dashboard.post("/api/freezes", json={"scope": "x"}, headers=operator)
    ).status == 400

    response = await dashboard.post("/api/freezes", json=freeze, headers=operator)
    assert response.status == 202
    assert (await response.json())["freeze"]["by"] == "ops-1"
    listed = await (await dashboard.get("/api/freezes", headers=approver)).json()
    assert [(f["scope"], f["by"], f["reason"]) for f in listed["freezes"]] == [
        ("writes:tenant-a", "ops-1", "incident 9")
    ]
    elsewhere = bearer(own_settings, "tenant-b", ("operator",))
    assert (await (await dashboard.get("/api/freezes", headers=elsewhere)).json())["freezes"] == []

    records = await read_until(own_settings, [Topic.CONTROLS], lambda recs: len(recs) >= 1)
    (record,) = records
    assert record.key == b"writes:tenant-a"
    body = json.loads(record.value)
    assert (body["frozen"], body["by"], body["by_tenant"]) == (True, "ops-1", "tenant-a")
    token = operator["Authorization"].removeprefix("Bearer ")
    assert token not in record.value.decode()

    lift = {**freeze, "frozen": False, "reason": "resolved"}
    assert (await dashboard.post("/api/freezes", json=lift, headers=operator)).status == 202
    assert (await (await dashboard.get("/api/freezes", headers=operator)).json())["freezes"] == []
