"""A history checker in the style of Jepsen's queue workload.

History: every operation proposed (commands published), every effect the downstream system
holds (the provider's count per idempotency key), every outcome published. Checked:

- no lost operation: every proposed call has an outcome;
- no duplicate effect: no key was applied more than once downstream;
- timeouts are indeterminate: an `unknown` outcome may be followed by either result, but
  once settled, an operation's final outcome agrees with the downstream record — succeeded
  if and only if the effect exists;
- one settlement: an operation never has two different settled outcomes. A call turned away
  before any effect with a "try again later" (`rate_limited`, `unavailable`: admission or an
  open breaker) settles the call, not its operation, whose retry may end otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SETTLED = {"succeeded", "failed", "conflict", "expired", "cancelled", "rejected", "denied"}
TRY_AGAIN_LATER = {"rate_limited", "unavailable"}  # error codes: nothing was attempted


@dataclass
class History:
    proposed: dict[str, str] = field(default_factory=dict)  # call id → operation id
    effects: dict[str, int] = field(default_factory=dict)  # operation id → times applied
    outcomes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by call id

    def problems(self, *, settled: bool) -> list[str]:
        """Everything that contradicts the guarantees; ``settled`` demands that no operation
        is left unknown (after reconciliation)."""
        found: list[str] = []
        for key, times in self.effects.items():
            if times > 1:
                found.append(f"duplicate effect: {key} applied {times} times")
        final_by_operation: dict[str, set[str]] = {}
        for call_id, operation_id in self.proposed.items():
            seen = self.outcomes.get(call_id, [])
            if not seen:
                found.append(f"lost: {call_id} has no outcome")
                continue
            done = [o for o in seen if o["status"] in SETTLED]
            statuses = {o["status"] for o in done}
            if len(statuses) > 1:
                found.append(f"settled twice: {call_id} {sorted(statuses)}")
            if not done:
                if settled:
                    found.append(f"still unknown: {call_id}")
                continue
            final = done[-1]["status"]
            code = (done[-1].get("error") or {}).get("code")
            if code not in TRY_AGAIN_LATER:
                final_by_operation.setdefault(operation_id, set()).add(final)
            applied = self.effects.get(operation_id, 0) > 0
            if final == "succeeded" and not applied:
                found.append(f"succeeded without an effect: {call_id}")
            # Applied means succeeded, whatever the code (an escalation is `unknown`, never
            # `failed`). Not this call's effect: a `conflict` (the key is another call's) and
            # a call turned away before anything ran (its retry applied it).
            if applied and final not in ("succeeded", "conflict") and code not in TRY_AGAIN_LATER:
                found.append(f"{final} ({code}) although applied downstream: {call_id}")
        for operation_id, finals in final_by_operation.items():
            if len(finals) > 1:
                found.append(f"operation {operation_id} ended differently: {sorted(finals)}")
        return found
