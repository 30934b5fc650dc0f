"""How much fuzzing a run does: a short run in `make test`, the full one in `make fuzz`."""

from __future__ import annotations

import os

# Examples per pure fuzz test (hypothesis) and records through Kafka.
PURE_EXAMPLES = int(os.environ.get("RATIFIER_FUZZ_EXAMPLES", "300"))
KAFKA_RECORDS = int(os.environ.get("RATIFIER_FUZZ_KAFKA_RECORDS", "300"))
# Generous per-test timeouts for the full run; the short run stays well inside them.
PURE_TIMEOUT = max(60, PURE_EXAMPLES // 200)
KAFKA_TIMEOUT = max(180, KAFKA_RECORDS // 20)
