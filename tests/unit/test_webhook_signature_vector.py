"""A known-answer vector for the webhook signature (docs/notifications.md, "What a receiver
gets"): ``Ratifier-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``.

The signer (`approvals.notify.sign`) and the verifier (`verify_signature`) share one helper,
so a change of the scheme in that helper passes every round-trip test while every receiver
built from the documentation refuses each notification. Here the expected value is fixed,
computed outside ratifier (`openssl dgst -sha256 -hmac` over ``1796115600.<body>``), and the
verifier printed in the documentation is run against it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from pathlib import Path
from typing import Any

import pytest

from approvals.notify import sign, signature_problem, verify_signature
from schemas.names import SIGNATURE_HEADER

SECRET = b"whsec-known-answer-0123456789"
TIMESTAMP = 1796115600  # 2026-12-01T09:00:00Z
BODY = b'{"call_id":"call-1234","type":"approval.requested"}'
# printf '%s' '1796115600.{"call_id":"call-1234","type":"approval.requested"}' \
#   | openssl dgst -sha256 -hmac 'whsec-known-answer-0123456789'
EXPECTED_V1 = "83491ca83aa21dd28787673c3b55d970912dba9aec026105cb8780cdcd983253"
EXPECTED_HEADER = f"t={TIMESTAMP},v1={EXPECTED_V1}"

DOCS = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def _documented_verifier() -> Any:
    """The `verify` function printed under "Verifying the signature", as a receiver would
    copy it."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Verifying the signature", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "docs/notifications.md no longer prints a verifier"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), str(DOCS), "exec"), namespace)  # the documented code
    return namespace["verify"]


def test_the_vector_is_the_documented_scheme_computed_independently() -> None:
    # The scheme as the documentation states it, with nothing of ratifier's.
    message = str(TIMESTAMP).encode() + b"." + BODY
    assert hmac.new(SECRET, message, hashlib.sha256).hexdigest() == EXPECTED_V1


def test_the_signer_produces_the_known_answer() -> None:
    assert sign(SECRET, BODY, TIMESTAMP) == EXPECTED_HEADER


def test_the_verifier_accepts_the_known_answer_and_nothing_near_it() -> None:
    assert verify_signature(SECRET, EXPECTED_HEADER, BODY, TIMESTAMP + 1)
    flipped = EXPECTED_V1[:-1] + ("0" if EXPECTED_V1[-1] != "0" else "1")
    assert signature_problem(SECRET, f"t={TIMESTAMP},v1={flipped}", BODY, now=TIMESTAMP) == (
        "signature mismatch"
    )
    assert not verify_signature(SECRET, EXPECTED_HEADER, BODY + b" ", TIMESTAMP)
    assert not verify_signature(SECRET, f"t={TIMESTAMP + 1},v1={EXPECTED_V1}", BODY, TIMESTAMP)


def test_the_documented_header_format_and_verifier_match_the_vector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert f"| `{SIGNATURE_HEADER}` | `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, " in text
    assert '"<t>.<body>")>`' in text
    verify = _documented_verifier()
    monkeypatch.setattr(time, "time", lambda: float(TIMESTAMP + 5))
    assert verify(SECRET, EXPECTED_HEADER, BODY) is True
    # What ratifier signs, the documented receiver accepts; a wrong secret or body it does not.
    assert verify(SECRET, sign(SECRET, BODY, TIMESTAMP), BODY) is True
    assert verify(b"another-secret", EXPECTED_HEADER, BODY) is False
    assert verify(SECRET, EXPECTED_HEADER, BODY.replace(b"1234", b"1235")) is False
    # Outside its replay window (300 s) it refuses even the right signature.
    monkeypatch.setattr(time, "time", lambda: float(TIMESTAMP + 301))
    assert verify(SECRET, EXPECTED_HEADER, BODY) is False
