from __future__ import annotations

import re

from ratifier_client.client import idempotency_key_for
from schemas.envelopes import CALL_ID_PATTERN


def test_a_step_keeps_its_idempotency_key_and_other_steps_get_others() -> None:
    key = idempotency_key_for(agent="support-bot", run="conv-42", step=3)
    assert key == idempotency_key_for(agent="support-bot", run="conv-42", step=3)
    assert key != idempotency_key_for(agent="support-bot", run="conv-42", step=4)
    assert key != idempotency_key_for(agent="support-bot", run="conv-43", step=3)
    assert key != idempotency_key_for(agent="other-bot", run="conv-42", step=3)
    # No ambiguity from joining: ("a", "bc") and ("ab", "c") differ.
    assert idempotency_key_for(agent="a", run="bc", step=1) != idempotency_key_for(
        agent="ab", run="c", step=1
    )
    assert re.fullmatch(CALL_ID_PATTERN, key)
