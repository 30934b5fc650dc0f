"""Who publishes a call's `commands.committed` record, and the record itself.

A call that needs no approval of any kind (routed `auto` by the policy, with an effect that
needs no approval) is committed by the authorizer, and since contract v1.8 has no
`calls.authorized` record at all: its `commands.committed` record (which carries the permit
policies, v1.8) is the authorization's record. So a read costs no join hop (bench/RESULTS.md:
the join's faust hop was the most expensive hop of a read), and not even a record the join
must skip (in a flood of admitted reads, skipping them cost the join 0.4 s of CPU and the
other tenants' reads their latency; docs/measurements.md, "No calls.authorized record for a
call the authorizer commits"). From v1.4 to v1.7 such a call had a `calls.authorized`
record saying ``committed: true``, which the approval-join still leaves alone. Every other
permitted call is committed by the approval-join: after a human's approval, or with the
signed receipt of an `@approval("auto")` policy (the approval service's signing key stays with
the join), and any `calls.authorized` record of an auto call that does not say it was
committed (a pre-v1.4 authorizer's, during an upgrade), as before.

Exactly one stage commits a call, chosen by the record itself. A duplicate from a redelivery
(the authorizer's batch re-run after a crash before its offsets were committed) carries the
same operation id and is deduplicated by the executor, like a join re-emit. Pure.
"""

from __future__ import annotations

from datetime import datetime

from commands.policy import APPROVAL_EFFECTS
from schemas.envelopes import ApprovalReceipt, AuthorizedCall, CommittedCommand, Route
from schemas.names import Topic
from streams.emit import Emit


def commit(call: AuthorizedCall, *, now: datetime, receipt: ApprovalReceipt | None = None) -> Emit:
    """The `commands.committed` record of ``call``, keyed by its operation id."""
    return Emit(
        topic=Topic.COMMITTED,
        key=call.operation_id,
        value=CommittedCommand(
            operation_id=call.operation_id,
            call_id=call.call_id,
            tenant=call.tenant,
            actor=call.actor,
            tool=call.tool,
            arguments=call.arguments,
            fingerprint=call.fingerprint,
            effect=call.effect,
            policy_version=call.policy_version,
            approval=receipt,
            committed_at=now,
            reply_to=call.reply_to,
            policies=call.policies,
        ),
    )


def auto_receipt_needed(call: AuthorizedCall) -> bool:
    """Whether an auto-routed ``call`` is committed with a signed receipt naming the policy
    that approved it (`@approval("auto")` on an effect that needs an approval)."""
    return call.effect in APPROVAL_EFFECTS and call.auto_approved_by is not None


def committed_at_authorization(call: AuthorizedCall) -> bool:
    """Whether the authorizer commits ``call`` itself: routed `auto`, no receipt to sign."""
    return call.route is Route.AUTO and not auto_receipt_needed(call)


def committed_by_authorizer(call: AuthorizedCall) -> bool:
    """Whether the authorizer already published ``call``'s command: its record says so, and
    it is one the authorizer commits (a `committed` flag on any other call is not honoured:
    the join decides that call as if the flag were absent)."""
    return call.committed and committed_at_authorization(call)
