from __future__ import annotations

from tests.e2e.conftest import signing_keys

__all__ = ["signing_keys"]
