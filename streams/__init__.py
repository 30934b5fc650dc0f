"""Stream processors (faust): validator, authorizer, approval-join. Never imports executors."""

from __future__ import annotations
