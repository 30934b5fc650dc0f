"""The operator's commands start fast because they import only what they use (issue 42):
`ratifier --help` loads nothing of the server, `ratifier freeze` neither the PostgreSQL and
Redis drivers nor the catalog, its policies, an HTTP server or faust. Each check runs in a
fresh interpreter (this one has imported everything by now). The times themselves are
measured in docs/kill-switch.md, not here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Never loaded by the operator's fast paths below.
SERVER = (
    "psycopg",
    "psycopg_pool",
    "redis",
    "aiohttp",
    "faust",
    "prometheus_client",
    "opentelemetry",
    "commands.catalog",
    "commands.policy",
    "streams",
    "executors.executor",
    "executors.reconciler_store",
    "dashboard",
)


def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in loaded or any(m.startswith(f"{n}.") for m in loaded))


def test_help_loads_nothing_but_the_standard_library() -> None:
    loaded = _loaded_after("from ratifier.cli import build_parser\nbuild_parser().format_help()")
    assert not _heavy(loaded, (*SERVER, "pydantic", "aiokafka", "config", "cedarpy")), loaded


@pytest.mark.parametrize("module", ["ratifier.freeze"])
def test_the_kill_switch_loads_no_storage_driver_catalog_or_server(module: str) -> None:
    loaded = _loaded_after(f"import ratifier.cli, {module}")
    assert not _heavy(loaded, SERVER)
    # What it does use: the settings, the broker's client, Cedar for the rights check.
    assert {"config.settings", "aiokafka", "cedarpy"} <= loaded


@pytest.mark.parametrize("module", ["ratifier.budgets", "ratifier.limits", "ratifier.ops"])
def test_the_other_operator_commands_load_no_http_server_or_faust(module: str) -> None:
    loaded = _loaded_after(f"import ratifier.cli, {module}")
    assert not _heavy(loaded, ("aiohttp", "faust", "streams", "dashboard", "opentelemetry"))
