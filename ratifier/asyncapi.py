"""The AsyncAPI 3 document of the wire contract, generated from the same models as the JSON
Schema files (`make schemas` writes ``schemas/json/asyncapi.json``), so that agents in other
languages can generate clients for every topic.

Each topic is a channel whose address carries the deployment's topic prefix as a parameter;
each record is a message with its Kafka key (``bindings.kafka.key``) and the W3C
``traceparent`` header. Record schemas live once under ``components.schemas``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.json_schema import models_json_schema

from schemas.envelopes import CONTRACT_RECORDS, Record
from schemas.names import REPLY_NAMESPACE, REPLY_OF_HEADER, TRACEPARENT_HEADER

ASYNCAPI_VERSION = "3.0.0"
# The contract's version: major = the records' "v", minor = additive changes since.
CONTRACT_VERSION = "1.9.0"
KAFKA_BINDING_VERSION = "0.5.0"

# What each topic's Kafka key is (the partition key): a field of the record.
TOPIC_KEYS: dict[str, str] = {
    "calls.proposed": "call_id",
    "calls.validated": "call_id",
    "calls.authorized": "call_id",
    "calls.deadletter": "call_id",
    "calls.cancelled": "call_id",
    "approvals.requested": "call_id",
    "approvals.decided": "call_id",
    "commands.committed": "operation_id",
    "commands.unknown": "operation_id",
    "outcomes": "call_id",
    "policies": "name",
    "controls": "scope",
    "notifications.deadletter": "call_id",
    "breakers": "breaker",
}

# Keys that are not simply a field of the record: their description.
KEY_DESCRIPTIONS: dict[str, str] = {
    "calls.proposed": (
        "v1.6: the tenant's lane, `<tenant>#<lane>` (the context token's `tenant` claim, read "
        "without verifying it: routing only; lane in 0..1 from the call id), so that one "
        "tenant's calls share a small subset of the partitions (schemas/lanes.py); the "
        "record's `call_id` (up to v1.5, and when the token names no tenant) is still accepted"
    ),
    "calls.validated": (
        "v1.7: the key its proposal came with when that is the call's tenant lane "
        "(`<tenant>#<lane>`, as schemas/lanes.py computes it), so that the authorizer reads "
        "one tenant's calls on that tenant's partitions; otherwise the record's `call_id` "
        "(as up to v1.6)"
    ),
}

# Who writes each topic (the channel's description).
WRITTEN_BY: dict[str, str] = {
    "calls.proposed": "agents (the client library, adapters, the MCP gateway)",
    "calls.validated": "the validator",
    "calls.authorized": (
        "the authorizer, for every permitted call that the approval-join commits or asks a "
        "human about (keyed by the call id, or since v1.5 by the `joins` call id: a repeat of "
        "an operation whose approval request is pending); since v1.8 not for a call the "
        "authorizer commits itself (routed auto, no receipt to sign), whose "
        "commands.committed record is its only record of the authorization; the "
        "approval-join re-publishes a joining call under its own call id when the request it "
        "joins is gone"
    ),
    "calls.deadletter": "any stage, for a record it could not handle or publish",
    "calls.cancelled": "agents and operators (cancel requests)",
    "approvals.requested": "the approval-join",
    "approvals.decided": "approvers (the approver endpoint, the dashboard, their own tools)",
    "commands.committed": (
        "the authorizer, for a call routed auto that needs no approval receipt (v1.4; since "
        "v1.8 with no calls.authorized record, and with the permit policies in `policies`; "
        "from v1.4 to v1.7 its calls.authorized record said `committed: true`), and the "
        "approval-join for every other permitted call (approved, auto-approved with a signed "
        "receipt, or a pre-v1.4 authorizer's record)"
    ),
    "commands.unknown": "the executor",
    "outcomes": (
        "every stage, for a call that ends or waits there; the authorizer also answers a "
        "repeat of an operation that already ended (v1.5, `repeats`)"
    ),
    "policies": "operators (`ratifier policy publish`)",
    "controls": "operators (`ratifier freeze` / `unfreeze`, the dashboard's freeze API; v1.5)",
    "notifications.deadletter": (
        "the notifier, for an approval notification it gave up on after its bound (v1.5)"
    ),
    "breakers": "the executor that moved a downstream's circuit breaker (v1.5)",
}

# Who writes a topic from outside the pipeline (agents, approvers, operators): the operations
# an external client performs. Every topic can be read (dashboards, audit).
EXTERNAL_WRITERS: frozenset[str] = frozenset(
    {"calls.proposed", "calls.cancelled", "approvals.decided", "policies", "controls"}
)


def _channel_id(topic: str) -> str:
    head, *rest = re.split(r"[._]", topic)
    return head + "".join(part.capitalize() for part in rest)


def _summary(model: type[Record]) -> str:
    doc = (model.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def render() -> dict[str, Any]:
    """The AsyncAPI 3 document as a JSON-ready dict."""
    models = sorted({model for model in CONTRACT_RECORDS.values()}, key=lambda m: m.__name__)
    _, top = models_json_schema(
        [(model, "validation") for model in models],
        ref_template="#/components/schemas/{model}",
    )
    schemas: dict[str, Any] = dict(sorted(top.get("$defs", {}).items()))
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for topic, model in sorted(CONTRACT_RECORDS.items()):
        channel_id = _channel_id(topic)
        message_id = f"{channel_id}Record"
        key_field = TOPIC_KEYS[topic]
        messages[message_id] = {
            "name": model.__name__,
            "title": f"{model.__name__} on {topic}",
            "summary": _summary(model),
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
            "headers": {
                "type": "object",
                "properties": {
                    TRACEPARENT_HEADER: {
                        "type": "string",
                        "description": "W3C trace context of the hop that wrote the record",
                    }
                },
            },
            "bindings": {
                "kafka": {
                    "key": {
                        "type": "string",
                        "description": KEY_DESCRIPTIONS.get(
                            topic, f"the record's `{key_field}` (the partition key)"
                        ),
                    },
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
        channels[channel_id] = {
            "address": "{prefix}" + topic,
            "title": topic,
            "description": f"Written by {WRITTEN_BY[topic]}.",
            "messages": {message_id: {"$ref": f"#/components/messages/{message_id}"}},
            "parameters": {"prefix": {"$ref": "#/components/parameters/prefix"}},
        }
        message_ref = {"$ref": f"#/channels/{channel_id}/messages/{message_id}"}
        operations[f"read{channel_id[0].upper()}{channel_id[1:]}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": [message_ref],
        }
        if topic in EXTERNAL_WRITERS:
            operations[f"write{channel_id[0].upper()}{channel_id[1:]}"] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{channel_id}"},
                "messages": [message_ref],
            }
    _add_reply_channel(messages, channels, operations)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "ratifier wire contract",
            "version": CONTRACT_VERSION,
            "description": (
                "Kafka topics of ratifier: agents publish tool calls on calls.proposed and read "
                "their terminal outcome on outcomes (deduplicate by call_id: stages are "
                'at-least-once). Every record is UTF-8 JSON with "v": 1.'
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:9092",
                "protocol": "kafka",
                "description": "the local broker started by `make up`",
            }
        },
        "channels": channels,
        "operations": dict(sorted(operations.items())),
        "components": {
            "schemas": schemas,
            "messages": messages,
            "parameters": {
                "prefix": {
                    "description": "the deployment's topic prefix (RATIFIER_TOPIC_PREFIX)",
                    "default": "ratifier.",
                },
                "replyName": {
                    "description": (
                        "the rest of a reply topic's name, chosen by the agent (the client "
                        "library: its client id); the agent's `reply_to.topic` is the whole "
                        "address"
                    ),
                },
            },
        },
    }


# The records copied to a call's reply address (v1.3), by the topic their original is on.
REPLY_MESSAGES: dict[str, str] = {"outcomes": "Outcome", "approvals.requested": "ApprovalRequest"}


def _add_reply_channel(
    messages: dict[str, Any], channels: dict[str, Any], operations: dict[str, Any]
) -> None:
    """Reply topics (v1.3): a copy of each outcome and approval request of a call that names a
    `reply_to`, keyed by call id; the ``ratifier-reply-of`` header says which of the two."""
    channel_messages: dict[str, Any] = {}
    for topic, model in REPLY_MESSAGES.items():
        message_id = f"reply{model}"
        messages[message_id] = {
            "name": f"Reply{model}",
            "title": f"a copy of a {model} on {topic}, at the call's reply address",
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{model}"},
            "headers": {
                "type": "object",
                "properties": {
                    REPLY_OF_HEADER: {
                        "type": "string",
                        "const": topic,
                        "description": "the topic the original record is on",
                    },
                    TRACEPARENT_HEADER: {
                        "type": "string",
                        "description": "W3C trace context of the hop that wrote the record",
                    },
                },
            },
            "bindings": {
                "kafka": {
                    "key": {"type": "string", "description": "the record's `call_id`"},
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            },
        }
        channel_messages[message_id] = {"$ref": f"#/components/messages/{message_id}"}
    channels["replies"] = {
        "address": "{prefix}" + REPLY_NAMESPACE + "{replyName}",
        "title": "reply topics",
        "description": (
            "An agent's own reply topic (a call's `reply_to`): ratifier writes only to topics "
            "under the reply namespace; the agent creates the topic and reads only it."
        ),
        "messages": channel_messages,
        "parameters": {
            "prefix": {"$ref": "#/components/parameters/prefix"},
            "replyName": {"$ref": "#/components/parameters/replyName"},
        },
    }
    operations["readReplies"] = {
        "action": "receive",
        "channel": {"$ref": "#/channels/replies"},
        "messages": [{"$ref": f"#/channels/replies/messages/{m}"} for m in channel_messages],
    }
