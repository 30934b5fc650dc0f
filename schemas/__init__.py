"""The ratifier wire contract (v1): every record that crosses a process boundary.

This package imports nothing else of ours; agents in other languages use the JSON Schema
files under ``schemas/json`` generated from these models.
"""

from __future__ import annotations

CONTRACT_VERSION = 1
