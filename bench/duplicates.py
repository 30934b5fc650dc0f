"""T6's duplicate count: what could really be done or answered twice when an executor is
killed under load (pure; :func:`bench.measure.kill_one` gathers the history).

The run's calls are reads and auto-approved refunds (writes), some of the refunds proposed
again with the same idempotency key by another call, as a client retrying does. A refund's
effect is keyed by its *operation* (tenant + idempotency key), so what must not happen twice
is counted per idempotency key the client chose, through every name an effect can be filed
under (the key, or a call id when the key was lost on the way):

- effects applied more than once: the provider's applied effects of one key summed over the
  names it was applied under (the provider deduplicates per name itself, so a count per name
  is always 1 and proves nothing);
- ledger entries more than one per key: the ledger's entries of this run grouped by the key
  their call carried (the ledger's primary key is (tenant, idempotency key): grouping by it
  is always 1);
- calls settled twice: a call (read or write) with two different final outcomes
  (status / error code; `unknown` is not final: reconciliation settles it);
- keys settled differently: the calls of one key ending with different final statuses;
- effects applied and not reported succeeded, and writes reported succeeded with no effect;
- calls never settled.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Final outcome statuses: `awaiting_approval` and `unknown` are followed by another outcome.
FINAL = frozenset({"succeeded", "failed", "rejected", "denied", "conflict", "expired", "cancelled"})


@dataclass(frozen=True)
class Call:
    kind: str  # "read" or "write"
    key: str  # the idempotency key the call carried (its call id when it carried none)


@dataclass(frozen=True)
class Duplicates:
    calls: int
    writes: int
    keys: int  # distinct idempotency keys of the writes
    effects: int  # the provider's applied effects of this run's writes
    effects_applied_twice: int  # keys whose effect was applied more than once
    ledger_entries_twice: int  # keys with more than one ledger entry
    settled_twice: int  # calls with two different final outcomes
    keys_settled_differently: int  # keys whose calls ended with different final statuses
    applied_not_succeeded: int  # keys with an effect and no call that succeeded
    succeeded_not_applied: int  # write keys reported succeeded without an effect
    unsettled: int  # calls without a final outcome

    @property
    def duplicates(self) -> int:
        """Everything that was done or answered twice (must be 0)."""
        return (
            self.effects_applied_twice
            + self.ledger_entries_twice
            + self.settled_twice
            + self.keys_settled_differently
        )

    @property
    def effects_match(self) -> bool:
        """Every applied effect was reported succeeded, and every reported one applied."""
        return self.applied_not_succeeded == 0 and self.succeeded_not_applied == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duplicates": self.duplicates}


def count_duplicates(
    calls: Mapping[str, Call],
    finals: Mapping[str, Collection[tuple[str, str | None]]],
    effects: Mapping[str, int],
    ledger: Iterable[tuple[str, str]],
) -> Duplicates:
    """``calls`` by call id; ``finals``: each call's outcome records (status, error code), in
    any number (repeats of the same outcome are fine; non-final statuses are ignored);
    ``effects``: the provider's applied effects by the key it was given (an operation id,
    ``tenant:key``; names not of this run are ignored); ``ledger``: (call id, idempotency
    key) of each ledger entry of this run."""
    # Every name an operation of this run can be filed under → the key the client chose.
    key_of: dict[str, str] = {}
    for call_id, call in calls.items():
        key_of[call.key] = call.key
        key_of.setdefault(call_id, call.key)
    write_keys = {c.key for c in calls.values() if c.kind == "write"}

    applied: dict[str, int] = {}
    for name, count in effects.items():
        key = key_of.get(name.split(":", 1)[-1])
        if key is not None and count > 0:
            applied[key] = applied.get(key, 0) + count

    entries: dict[str, int] = {}
    for call_id, idempotency_key in ledger:
        key = key_of.get(idempotency_key) or key_of.get(call_id)
        if key is not None:
            entries[key] = entries.get(key, 0) + 1

    settled: dict[str, set[tuple[str, str | None]]] = {}
    for call_id in calls:
        settled[call_id] = {(s, c) for s, c in finals.get(call_id, ()) if s in FINAL}
    statuses_of_key: dict[str, set[str]] = {}
    for call_id, call in calls.items():
        for status, _code in settled[call_id]:
            statuses_of_key.setdefault(call.key, set()).add(status)
    succeeded_keys = {k for k, statuses in statuses_of_key.items() if "succeeded" in statuses}

    return Duplicates(
        calls=len(calls),
        writes=sum(1 for c in calls.values() if c.kind == "write"),
        keys=len(write_keys),
        effects=sum(applied.values()),
        effects_applied_twice=sum(1 for n in applied.values() if n > 1),
        ledger_entries_twice=sum(1 for n in entries.values() if n > 1),
        settled_twice=sum(1 for s in settled.values() if len(s) > 1),
        keys_settled_differently=sum(1 for s in statuses_of_key.values() if len(s) > 1),
        applied_not_succeeded=sum(1 for k in applied if k not in succeeded_keys),
        succeeded_not_applied=sum(1 for k in write_keys & succeeded_keys if k not in applied),
        unsettled=sum(1 for s in settled.values() if not s),
    )
