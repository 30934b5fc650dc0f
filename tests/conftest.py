"""Every test suite runs in development mode: the built-in keys are accepted (docs/operations.md,
"Development mode"), in this process and in the workers it starts (they inherit its
environment). A test of a start outside development mode gives its process a clean one."""

from __future__ import annotations

import os

from config.settings import DEVELOPMENT_MODE_ENV

os.environ.setdefault(DEVELOPMENT_MODE_ENV, "true")
