"""The `ratifier` command: the composition root that wires schemas, commands, streams and
executors into processes."""

from __future__ import annotations
