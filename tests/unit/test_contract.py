from __future__ import annotations

import json
from pathlib import Path

from schemas.envelopes import CONTRACT_RECORDS, ErrorInfo
from schemas.errors import SAFE_MESSAGES, ErrorCode, RatifierError
from schemas.export import DEFAULT_DIR, render
from schemas.fingerprint import canonical_json, fingerprint
from schemas.names import Topic


def test_json_schema_files_are_fresh() -> None:
    rendered = render()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in Path(DEFAULT_DIR).glob("*.json")}
    assert on_disk == rendered, "schemas/json is stale: run `make schemas`"


def test_every_record_topic_is_a_topic() -> None:
    assert set(CONTRACT_RECORDS) <= {t.value for t in Topic}
    # approvals.decided is v2 (a signed statement; v1 carried a bearer token), the rest v1.
    for name, text in render().items():
        expected = 2 if name == "approvals.decided.json" else 1
        assert json.loads(text)["properties"]["v"]["const"] == expected


def test_fingerprint_is_canonical() -> None:
    a = fingerprint(tenant="t", tool="x", arguments={"b": 1, "a": "é"}, policy_version="p")
    b = fingerprint(tenant="t", tool="x", arguments={"a": "é", "b": 1}, policy_version="p")
    assert a == b
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert a != fingerprint(tenant="t", tool="x", arguments={"a": "é", "b": 2}, policy_version="p")


def test_every_code_has_a_safe_message_and_one_exception() -> None:
    assert set(SAFE_MESSAGES) == set(ErrorCode)
    for code in ErrorCode:
        info = ErrorInfo.of(code)
        assert info.retryable == (code in {ErrorCode.TIMEOUT, ErrorCode.RETRYABLE_ERROR})
    codes = {cls.code for cls in _subclasses(RatifierError)}
    assert codes >= set(ErrorCode) - {ErrorCode.APPROVAL_REQUIRED}


def _subclasses(cls: type[RatifierError]) -> list[type[RatifierError]]:
    found: list[type[RatifierError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found
