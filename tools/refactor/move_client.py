"""Issue 26 item 3: the agent client and its adapters live in the `ratifier-client`
distribution (clients/python/ratifier_client). The files were moved with `git mv`; this
rewrites the old import paths (re-run it after merging a branch that still uses them)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from imports import rewrite_repository

MOVES = {
    "ratifier.client": "ratifier_client.client",
    "ratifier.adapters": "ratifier_client.adapters",
}

if __name__ == "__main__":
    for path in rewrite_repository(MOVES):
        print(path)
