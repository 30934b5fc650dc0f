"""What the mixed load of `make chaos` and `make partitions` must get back (issue 43): each
acknowledged call's final outcome by its kind, and the least an experiment must have had
acknowledged and applied, so that a pipeline answering wrongly, or a run that sends or
applies nothing, fails instead of passing with a smaller history. Pure; unit-tested in
tests/unit/test_chaos_expectations.py.

The answers are the contract's (docs/agents.md, "What an agent sees"):

- a read of the agent's own payment, and its retry under the same key: `succeeded`;
- an invalid call (a `tenant_id` injected into the arguments, as a prompt injection would):
  `rejected` / `invalid_arguments` — the schema refuses the field before anything reads it
  (tests/e2e/test_authorizer.py, test_injected_text_cannot_change_tenant);
- a read of another tenant's payment: `denied` / `not_found` (the resource does not exist
  for this identity; tests/e2e/test_walking_skeleton.py);
- an approved refund, and its retry under the same key: `succeeded`, or one of the named
  "not now" refusals (`rejected` / `rate_limited`: admission fails closed for writes while
  Redis is away; `rejected` / `unavailable`: the provider's breaker is open), which promise
  that nothing ran. Where the experiment makes the provider itself fail (PROVIDER_FAILS), also
  `failed` / `retry_exhausted`: every attempt failed before any effect (the history checker
  verifies that no effect exists for it). Never `expired`, `denied`, `frozen` (nobody
  freezes anything here) or any code not named here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.e2e.history import SETTLED  # final statuses: not `unknown`, `awaiting_approval`

Answer = tuple[str, str | None]  # (status, error code); a success has no code

SUCCEEDED: Answer = ("succeeded", None)
REFUND_NOT_NOW: frozenset[Answer] = frozenset(
    {("rejected", "rate_limited"), ("rejected", "unavailable")}
)
PROVIDER_GAVE_UP: Answer = ("failed", "retry_exhausted")

EXPECTED: Mapping[str, frozenset[Answer]] = {
    "read": frozenset({SUCCEEDED}),
    "duplicate": frozenset({SUCCEEDED}),
    "invalid": frozenset({("rejected", "invalid_arguments")}),
    "foreign": frozenset({("denied", "not_found")}),
    "refund": frozenset({SUCCEEDED, *REFUND_NOT_NOW}),
    "refund_retry": frozenset({SUCCEEDED, *REFUND_NOT_NOW}),
}
KINDS = tuple(EXPECTED)
REFUNDS = ("refund", "refund_retry")

# The load's mix (MixedLoad.next_call draws one number in [0, 1) per call): the share of
# each kind. A duplicate needs an earlier read and a refund retry an earlier refund, so both
# fall a little short of their share at the very start; the rest is read.
SHARES: Mapping[str, float] = {
    "duplicate": 0.10,
    "invalid": 0.10,
    "refund_retry": 0.05,
    "refund": 0.15,
    "foreign": 0.05,
    "read": 0.55,
}

# The least an experiment must have had acknowledged by the broker, of the calls its load
# planned (seconds x rate). Healthy runs have every call acknowledged: 899 of 900 planned in
# every chaos experiment (the last is still due when the load stops; docs/reliability.md) and
# 719 of 720 in most partition rows; the lowest ever seen is 580 of 720 (81 %), leader_isolated
# on a machine at load average 12-16, where sends wait for the isolated leader's partitions.
# Three quarters keeps that run passing and fails any run where most sends fail or are
# never made.
MIN_ACKNOWLEDGED = 0.75
# Per kind, the least acknowledged calls as a fraction of the kind's share of the plan. The
# draws are seeded by the experiment's name, so each kind's count of calls made is the same
# in every run: 0.69-1.22 times its share in every experiment at 75 s and 60 s (0.7-1.5 at
# 30 s). Half leaves room for the lowest times the 81 % above (0.56) and fails a load that
# stops sending a kind, or has most of one unacknowledged.
MIN_KIND = 0.5
# Provider effects (distinct refund keys applied), as a fraction of the refunds planned
# (share x plan). A healthy experiment applies nearly every refund: the refusals allowed
# above are few (in provider_faults, the calls that met the 503s and the open breaker).
# Half fails a run that applies nothing or refuses most refunds with a "not now", which no
# single call's answer would show.
MIN_EFFECTS = 0.5


def answer(outcome: Mapping[str, Any]) -> Answer:
    error = outcome.get("error") or {}
    code = error.get("code") if isinstance(error, Mapping) else None
    return str(outcome.get("status")), None if code is None else str(code)


def label(found: Answer) -> str:
    status, code = found
    return status if code is None else f"{status}/{code}"


def final_answers(outcomes: Iterable[Mapping[str, Any]]) -> set[Answer]:
    """The settled answers among a call's outcome records (repeats of one answer count once)."""
    return {answer(o) for o in outcomes if o.get("status") in SETTLED}


def expected(kind: str, *, provider_fails: bool = False) -> frozenset[Answer]:
    """Every final answer a call of ``kind`` may get; ``provider_fails``: the experiment makes
    the provider refuse refunds before their effect."""
    allowed = EXPECTED[kind]
    if provider_fails and kind in REFUNDS:
        allowed = allowed | {PROVIDER_GAVE_UP}
    return allowed


def unexpected(
    calls: Mapping[str, str],
    finals: Mapping[str, set[Answer]],
    *,
    provider_fails: bool = False,
) -> Counter[str]:
    """``kind:answer`` → how many calls got that answer although their kind never may (calls
    by id → kind; their settled answers by id). A call without a final answer is lost, counted
    elsewhere; a call with two counts each one that is not allowed."""
    found: Counter[str] = Counter()
    for call_id, kind in calls.items():
        allowed = expected(kind, provider_fails=provider_fails)
        for got in finals.get(call_id, set()) - allowed:
            found[f"{kind}:{label(got)}"] += 1
    return found


def answers_by_kind(
    calls: Mapping[str, str], finals: Mapping[str, set[Answer]]
) -> dict[str, dict[str, int]]:
    """For the report: per kind, how many calls ended in each answer (``none``: no final)."""
    table: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    for call_id, kind in calls.items():
        got = finals.get(call_id) or set()
        for one in got or {("none", None)}:
            table.setdefault(kind, Counter())[label(one)] += 1
    return {kind: dict(sorted(c.items())) for kind, c in table.items()}


def minimums(planned: int) -> dict[str, int]:
    """The least acknowledged calls (in all and per kind) and provider effects for a load of
    ``planned`` calls; never below one."""
    least = {
        "acknowledged": max(1, math.floor(MIN_ACKNOWLEDGED * planned)),
        "provider_effects": max(1, math.floor(MIN_EFFECTS * SHARES["refund"] * planned)),
    }
    least |= {kind: max(1, math.floor(MIN_KIND * SHARES[kind] * planned)) for kind in KINDS}
    return least


def shortfalls(planned: int, acknowledged: Mapping[str, int], effects: int) -> list[str]:
    """What falls below the minimums: acknowledged calls by kind, their total, the effects."""
    least = minimums(planned)
    total = sum(acknowledged.values())
    found = []
    if total < least["acknowledged"]:
        found.append(f"{total} calls acknowledged of {planned} planned < {least['acknowledged']}")
    found += [
        f"{acknowledged.get(kind, 0)} {kind} calls acknowledged < {least[kind]}"
        for kind in KINDS
        if acknowledged.get(kind, 0) < least[kind]
    ]
    if effects < least["provider_effects"]:
        found.append(f"{effects} provider effects < {least['provider_effects']}")
    return found


def violations(row: Mapping[str, Any]) -> list[str]:
    """What breaks a guarantee or an expectation in one experiment's row (empty: clean)."""
    found = [
        f"{key}={row[key]}"
        for key in ("lost", "duplicate_effects", "two_final_outcomes", "history_problems")
        if row.get(key)
    ]
    if not row.get("effects_equal_ledger", False):
        found.append("provider effects differ from the ledger")
    if any(row.get("streams_commit_lag", {}).values()):
        found.append(f"consumer lag {row['streams_commit_lag']}")
    if row.get("unexpected_outcomes"):
        found.append(f"unexpected outcomes {row['unexpected_outcomes']}")
    shortfall: Sequence[str] = row.get("shortfalls", ())
    found += [f"too little: {s}" for s in shortfall]
    return found
