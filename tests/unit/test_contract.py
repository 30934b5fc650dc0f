from __future__ import annotations

import json
import re
from pathlib import Path

from ratifier.asyncapi import TOPIC_KEYS
from ratifier.contract_export import ASYNCAPI_FILE, DEFAULT_DIR, render
from schemas.envelopes import CONTRACT_RECORDS, ErrorInfo
from schemas.errors import SAFE_MESSAGES, ErrorCode, RatifierError
from schemas.fingerprint import canonical_json, fingerprint
from schemas.names import REPLY_NAMESPACE, Topic


def test_json_schema_files_are_fresh() -> None:
    rendered = render()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in Path(DEFAULT_DIR).glob("*.json")}
    assert on_disk == rendered, "schemas/json is stale: run `make schemas`"


def test_every_record_topic_is_a_topic() -> None:
    assert set(CONTRACT_RECORDS) <= {t.value for t in Topic}
    # approvals.decided is v2 (a signed statement; v1 carried a bearer token), the rest v1.
    for name, text in render().items():
        if name.removesuffix(".json") in CONTRACT_RECORDS:
            expected = 2 if name == "approvals.decided.json" else 1
            assert json.loads(text)["properties"]["v"]["const"] == expected


def test_the_asyncapi_document_names_every_topic_with_its_key() -> None:
    document = json.loads(render()[ASYNCAPI_FILE])
    addresses = {c["address"] for c in document["channels"].values()}
    # Every topic, and (v1.3) the agents' reply topics under the reply namespace.
    assert addresses == {"{prefix}" + topic for topic in CONTRACT_RECORDS} | {
        "{prefix}" + REPLY_NAMESPACE + "{replyName}"
    }
    replies = document["channels"]["replies"]["messages"]
    assert {m["$ref"].rsplit("/", 1)[1] for m in replies.values()} == {
        "replyOutcome",
        "replyApprovalRequest",
    }
    for topic, model in CONTRACT_RECORDS.items():
        assert TOPIC_KEYS[topic] in model.model_fields, (topic, TOPIC_KEYS[topic])
    schemas = document["components"]["schemas"]
    for message in document["components"]["messages"].values():
        name = message["payload"]["$ref"].rsplit("/", 1)[1]
        assert schemas[name]["properties"]["v"]["const"] in (1, 2)
    # Every reference resolves inside the document.
    text = json.dumps(document)
    for ref in re.findall(r'"\$ref": "#/([^"]+)"', text):
        node: object = document
        for part in ref.split("/"):
            assert isinstance(node, dict)
            assert part in node, ref
            node = node[part]


def test_fingerprint_is_canonical() -> None:
    a = fingerprint(tenant="t", tool="x", arguments={"b": 1, "a": "é"}, policy_version="p")
    b = fingerprint(tenant="t", tool="x", arguments={"a": "é", "b": 1}, policy_version="p")
    assert a == b
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert a != fingerprint(tenant="t", tool="x", arguments={"a": "é", "b": 2}, policy_version="p")


def test_every_code_has_a_safe_message_and_every_exception_one_code() -> None:
    assert set(SAFE_MESSAGES) == set(ErrorCode)
    for code in ErrorCode:
        info = ErrorInfo.of(code)
        assert info.retryable == (
            code
            in {
                ErrorCode.TIMEOUT,
                ErrorCode.RETRYABLE_ERROR,
                ErrorCode.UNAVAILABLE,
                ErrorCode.RATE_LIMITED,
            }
        )
    # Codes a stage only ever writes into an outcome (malformed, unknown_tool, ...) need no
    # exception class; every class that exists is raised somewhere and means one code.
    for cls in _subclasses(RatifierError):
        assert isinstance(cls.code, ErrorCode)
        assert cls(None).safe_message == SAFE_MESSAGES[cls.code]


def _subclasses(cls: type[RatifierError]) -> list[type[RatifierError]]:
    found: list[type[RatifierError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found
