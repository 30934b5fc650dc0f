"""The benchmarks run against the local deployment in development mode (built-in keys;
docs/operations.md, "Development mode"), as do the workers they start."""

from __future__ import annotations

import os

from config.settings import DEVELOPMENT_MODE_ENV

os.environ.setdefault(DEVELOPMENT_MODE_ENV, "true")
