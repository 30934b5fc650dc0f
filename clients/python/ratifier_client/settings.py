"""What an agent process needs to reach ratifier, read from the same ``RATIFIER_*``
environment variables the services read (docs/operations.md): the Kafka connection, the topic
prefix and the largest record a topic takes. Everything else of the services' settings is no
business of an agent's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.connection import KafkaConnection

# The bootstrap list's variable before `RATIFIER_KAFKA__BOOTSTRAP` (the nested one wins).
LEGACY_BOOTSTRAP_ENV = "RATIFIER_KAFKA_BOOTSTRAP"


class ClientLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # `max.message.bytes` of the pipeline's topics (RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES).
    kafka_max_message_bytes: int = Field(default=1_048_588, ge=64 * 1024)


class ClientSettings(BaseModel):
    """The agent client's settings; the services' `Settings` has the same three fields, so
    `RatifierClient.from_settings` takes either."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka: KafkaConnection = KafkaConnection()
    topic_prefix: str = Field(default="ratifier.", pattern=r"^[A-Za-z0-9._-]*$", max_length=100)
    limits: ClientLimits = ClientLimits()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        """Read ``RATIFIER_KAFKA__<FIELD>``, ``RATIFIER_TOPIC_PREFIX`` and
        ``RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES`` (unset ones keep their defaults)."""
        env = os.environ if environ is None else environ
        kafka: dict[str, Any] = {
            name: env[f"RATIFIER_KAFKA__{name.upper()}"]
            for name in KafkaConnection.model_fields
            if f"RATIFIER_KAFKA__{name.upper()}" in env
        }
        if "bootstrap" not in kafka and env.get(LEGACY_BOOTSTRAP_ENV):
            kafka["bootstrap"] = env[LEGACY_BOOTSTRAP_ENV]
        values: dict[str, Any] = {"kafka": kafka}
        if "RATIFIER_TOPIC_PREFIX" in env:
            values["topic_prefix"] = env["RATIFIER_TOPIC_PREFIX"]
        if "RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES" in env:
            values["limits"] = {
                "kafka_max_message_bytes": env["RATIFIER_LIMITS__KAFKA_MAX_MESSAGE_BYTES"]
            }
        return cls.model_validate(values)
