"""The async client of the payment provider, used by the executor to pay refunds.

Every failure is classified by what it says about the effect:

- ``TransientFailure``: known not applied (503 with ``applied: false``, or no connection could
  be established), so the same operation may be retried;
- ``PermanentFailure``: refused (409, 422, other 4xx), nothing applied, retrying cannot help;
- ``OutcomeUnknown``: the request may have reached the provider and been applied (timeout,
  disconnect after sending, any other 5xx); the caller must reconcile with ``find_refund``
  instead of blindly retrying.

The client never retries: the executor owns the retry policy.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.errors import OutcomeUnknown, PermanentFailure, TransientFailure

# Short, safe messages: no URLs, keys, amounts or provider payloads.
_UNREACHABLE = "The payment provider could not be reached; nothing was sent."
_UNAVAILABLE = "The payment provider is unavailable; the refund was not applied."
_UNKNOWN = "The payment provider did not confirm the refund; its outcome is not known."
_CONFLICT = "The payment provider refused a reused idempotency key with other details."
_REFUSED = "The payment provider refused the refund."
_LOOKUP_FAILED = "The payment provider lookup failed; try again later."
_LOOKUP_REFUSED = "The payment provider refused the lookup."
_BAD_KEY = "The idempotency key is not usable with the payment provider."
MAX_KEY_LENGTH = 200  # the provider's limit


class ProviderRefund(BaseModel):
    """A refund as the provider reports it (a foreign system's response: extra keys ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    status: str
    idempotency_key: str
    tenant: str
    payment_id: str
    amount_minor: int
    currency: str


async def _read_json(response: aiohttp.ClientResponse) -> Any:
    """The response body as JSON, or None when it is not JSON. Transport errors propagate."""
    raw = await response.read()
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _valid_key(key: str) -> bool:
    """1-200 printable ASCII characters: what an HTTP header carries unchanged."""
    return 1 <= len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable()


def _refund(payload: Any) -> ProviderRefund | None:
    try:
        return ProviderRefund.model_validate(payload)
    except ValidationError:
        return None


class PaymentProvider:
    """One shared ``aiohttp.ClientSession``, created on first use; ``close()`` releases it."""

    def __init__(self, base_url: str, *, timeout_seconds: float = 5.0) -> None:
        self._base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def create_refund(
        self,
        *,
        idempotency_key: str,
        tenant: str,
        payment_id: str,
        amount_minor: int,
        currency: str,
    ) -> ProviderRefund:
        if not _valid_key(idempotency_key):
            raise PermanentFailure(_BAD_KEY)  # refused before sending: nothing applied
        body = {
            "tenant": tenant,
            "payment_id": payment_id,
            "amount_minor": amount_minor,
            "currency": currency,
        }
        try:
            async with self._client().post(
                f"{self._base_url}/refunds",
                json=body,
                headers={"Idempotency-Key": idempotency_key},
                allow_redirects=False,
            ) as response:
                status = response.status
                payload = await _read_json(response)
        # Order matters: connector errors and connect timeouts are subclasses of the broader
        # connection / timeout errors below, and are the only ones where nothing was sent.
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise TransientFailure(_UNREACHABLE) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            # ServerDisconnectedError, ClientPayloadError, ClientOSError after sending,
            # asyncio.TimeoutError (= TimeoutError): the request may have been applied.
            raise OutcomeUnknown(_UNKNOWN) from exc
        if status in (200, 201):
            refund = _refund(payload)
            if refund is None:
                raise OutcomeUnknown(_UNKNOWN)  # accepted, but the answer is unreadable
            return refund
        if status == 503 and isinstance(payload, dict) and payload.get("applied") is False:
            raise TransientFailure(_UNAVAILABLE)
        if status == 409:
            raise PermanentFailure(_CONFLICT)
        if 400 <= status < 500:
            raise PermanentFailure(_REFUSED)
        raise OutcomeUnknown(_UNKNOWN)  # 5xx without `applied: false`, or anything unexpected

    async def find_refund(self, idempotency_key: str) -> ProviderRefund | None:
        """The reconciliation lookup: the refund applied under this key, or None."""
        if not _valid_key(idempotency_key):
            raise PermanentFailure(_BAD_KEY)
        try:
            async with self._client().get(
                f"{self._base_url}/refunds",
                params={"idempotency_key": idempotency_key},
                allow_redirects=False,
            ) as response:
                status = response.status
                payload = await _read_json(response)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise TransientFailure(_LOOKUP_FAILED) from exc  # a lookup has no effect
        if status == 200:
            refund = _refund(payload)
            if refund is None:
                raise TransientFailure(_LOOKUP_FAILED)
            return refund
        # Only the provider's own "not found" means absent: a 404 from a wrong base URL or a
        # proxy must not be read as "never applied".
        if status == 404 and isinstance(payload, dict) and payload.get("error") == "not_found":
            return None
        if 400 <= status < 500:
            raise PermanentFailure(_LOOKUP_REFUSED)
        raise TransientFailure(_LOOKUP_FAILED)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> PaymentProvider:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()


__all__ = ["PaymentProvider", "ProviderRefund"]
