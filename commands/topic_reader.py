"""Moved to :mod:`runtime.reader`; kept so that existing importers keep working."""

from __future__ import annotations

from runtime.reader import Apply, TopicReader

__all__ = ["Apply", "TopicReader"]
