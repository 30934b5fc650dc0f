"""ratifier's agent-side library (distribution ``ratifier-client``): the client that sends an
agent's tool calls to ratifier and awaits their outcomes, its framework adapters
(`ratifier_client.adapters`) and the wire contract it speaks (`schemas`). It installs without
the server: aiokafka, pydantic and PyJWT are all it needs."""

from __future__ import annotations

from ratifier_client.client import (
    CallHandle,
    Pending,
    RatifierClient,
    SyncRatifierClient,
    idempotency_key_for,
)
from ratifier_client.settings import ClientSettings

__all__ = [
    "CallHandle",
    "ClientSettings",
    "Pending",
    "RatifierClient",
    "SyncRatifierClient",
    "idempotency_key_for",
]
