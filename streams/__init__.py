"""Stream processors: validator, authorizer (`ratifier stages`) and the approval-join
(`ratifier approval-join`). Never imports executors."""

from __future__ import annotations
