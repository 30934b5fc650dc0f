"""The settings model refuses what it does not know."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config.settings import Settings


def test_unknown_setting_keyword_is_refused() -> None:
    """A renamed setting passed the old way must fail loudly, not keep its default (the chaos
    suite once ran against the shared broker through `Settings(kafka_bootstrap=...)`)."""
    with pytest.raises(ValidationError):
        Settings(kafka_bootstrap="127.0.0.1:1")  # type: ignore[call-arg]
