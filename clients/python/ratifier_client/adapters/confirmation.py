"""End-user confirmation over the streams worker's HTTP API (docs/approvals.md).

When a call waits for the subject it acts for (the request's ``subject``, e.g. the customer
who owns the payment), that person confirms or declines the exact preview with the context
token the agent runtime issued for them: ``POST /confirmations/{call_id}``. The approval
service verifies the token, checks ownership and signs the decision; nothing here signs or
holds a key. Used by the framework adapters to turn an app's approve/reject into that
confirmation.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from schemas.envelopes import ApprovalVerdict


class ConfirmationRefused(Exception):
    """The approval API did not accept the confirmation (not the subject's call, already
    decided or expired, or the token was refused)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"confirmation refused with HTTP {status}: {body}")
        self.status = status
        self.body = body


@dataclass(frozen=True, kw_only=True)
class ConfirmationApi:
    """Where end users confirm: the streams worker's HTTP API (``http://host:6066``)."""

    base_url: str
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError(f"the approval API is an http(s) URL, not {self.base_url!r}")

    async def confirm(
        self,
        call_id: str,
        *,
        user_token: str,
        approve: bool,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Publish the user's signed confirmation (or refusal) of ``call_id``; returns the
        API's answer (``decision_id``, ``fingerprint``)."""
        verdict = ApprovalVerdict.APPROVE if approve else ApprovalVerdict.REJECT
        body: dict[str, Any] = {"decision": verdict.value}
        if reason:
            body["reason"] = reason
        return await asyncio.to_thread(self._post, call_id, user_token, body)

    def _post(self, call_id: str, user_token: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
            f"{self.base_url.rstrip('/')}/confirmations/{urllib.parse.quote(call_id, safe='')}",
            method="POST",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {user_token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:  # noqa: S310
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
            try:
                detail: Any = json.loads(raw or b"null")
            except ValueError:
                detail = raw[:200].decode(errors="replace")
            raise ConfirmationRefused(exc.code, detail) from exc
