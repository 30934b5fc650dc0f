"""Topic names, consumer-group ids and Redis key prefixes: the one place they are spelled."""

from __future__ import annotations

from enum import StrEnum


class Topic(StrEnum):
    """Pipeline topics, without the configurable prefix."""

    PROPOSED = "calls.proposed"
    VALIDATED = "calls.validated"
    AUTHORIZED = "calls.authorized"
    DEADLETTER = "calls.deadletter"
    CANCELLED = "calls.cancelled"
    APPROVALS_REQUESTED = "approvals.requested"
    APPROVALS_DECIDED = "approvals.decided"
    COMMITTED = "commands.committed"
    UNKNOWN = "commands.unknown"
    OUTCOMES = "outcomes"
    POLICIES = "policies"
    # v1.5: freezes (the kill switch), compacted, keyed by scope; every stage follows it.
    CONTROLS = "controls"
    # Approval notifications the notifier gave up on (docs/notifications.md), keyed by call id.
    NOTIFICATIONS_DEADLETTER = "notifications.deadletter"
    # v1.5: circuit breaker state changes (docs/execution.md, "Circuit breakers"), keyed by
    # breaker; the audit sink stores them like every record.
    BREAKERS = "breakers"


# The pipeline's topics (keyed by call id, except calls.proposed since v1.6 and calls.validated
# since v1.7: schemas/lanes.py).
PIPELINE_TOPICS: tuple[Topic, ...] = tuple(Topic)

# Compacted topics (latest value per key matters).
COMPACTED_TOPICS: frozenset[Topic] = frozenset({Topic.POLICIES, Topic.CONTROLS})

STREAMS_APP_ID = "ratifier-streams"  # the approval-join's faust app, before issue 44
# The approval-join's consumer group: the faust app's id, kept when the join left faust, so
# that an upgraded join resumes at the offsets the faust join committed.
APPROVAL_JOIN_GROUP = STREAMS_APP_ID
# The faust join's table; its changelog, `<app id>-approvals-changelog`, is read once by
# `ratifier migrate-approvals` on an upgrade (ratifier/approvals_upgrade.py).
APPROVAL_TABLE = "approvals"
VALIDATOR_GROUP = "ratifier-validator"
AUTHORIZER_GROUP = "ratifier-authorizer"
EXECUTOR_GROUP = "ratifier-executor"
RECONCILER_GROUP = "ratifier-reconciler"
AUDIT_SINK_GROUP = "ratifier-audit-sink"
NOTIFIER_GROUP = "ratifier-notifier"

REDIS_CLAIM_PREFIX = "ratifier:claim:"
# An executor's liveness mark (refreshed while it runs), so that a claim held by a dead owner
# is taken over at once instead of after its lease.
REDIS_OWNER_PREFIX = "ratifier:owner:"

# Circuit breakers shared by every executor: `<prefix><topic prefix><breaker>` holds its state,
# `...:window` its per-second call counts (executors/breakers.py).
REDIS_BREAKER_PREFIX = "ratifier:breaker:"
# Fleet admission (streams/limiter.py): token buckets and concurrency slots by scope, and the
# slots each admitted call holds (released when its final outcome is seen).
REDIS_LIMIT_PREFIX = "ratifier:limit:"
REDIS_SLOTS_PREFIX = "ratifier:slots:"
# Fair admission by default (streams/fair_share.py): each lane stage's queueing delay
# (`<prefix><topic prefix>`, a hash by worker) and every tenant's recent calls (likewise, by
# tenant).
REDIS_LOAD_PREFIX = "ratifier:load:"
REDIS_USAGE_PREFIX = "ratifier:usage:"
# Releases concurrency slots when a call's final outcome is published.
ADMISSION_RELEASE_GROUP = "ratifier-admission-release"

TRACEPARENT_HEADER = "traceparent"

# Approval notifications (webhooks, docs/notifications.md): the HMAC signature over timestamp
# and body, and the delivery id a receiver deduplicates on.
SIGNATURE_HEADER = "Ratifier-Signature"
DELIVERY_HEADER = "Ratifier-Delivery"

# Reply topics (an agent's `reply_to`, v1.3) live under `<topic_prefix>replies.`: ratifier
# writes reply copies there and nowhere else. A reply copy names the topic its original was
# published to (`outcomes` or `approvals.requested`) in this header.
REPLY_NAMESPACE = "replies."
REPLY_OF_HEADER = "ratifier-reply-of"


def topic_name(prefix: str, topic: Topic) -> str:
    """The broker-side name of ``topic`` under ``prefix`` (default ``ratifier.``)."""
    return f"{prefix}{topic.value}"


def reply_namespace(prefix: str) -> str:
    """The topic-name prefix every reply topic of the deployment under ``prefix`` has."""
    return f"{prefix}{REPLY_NAMESPACE}"
