"""The old import paths of the agent client (``ratifier.client``, ``ratifier.adapters``) keep
working for one minor version: each warns at import, naming the new import, and hands out the
very objects of ``ratifier_client`` (docs/upgrading.md)."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ratifier_client import ClientSettings

ROOT = Path(__file__).resolve().parents[2]

# Every public name each old module defined in the previous release (32c8ee8, the last main
# before the client moved: `git show 32c8ee8:ratifier/client.py`), and its new module.
OLD_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ratifier.client": (
        "ratifier_client.client",
        (
            "DEFAULT_WAIT_SECONDS",
            "PUBLISH_ATTEMPTS",
            "PUBLISH_BACKOFF_SECONDS",
            "AwaitingApproval",
            "CallHandle",
            "Pending",
            "ProposedToolCall",
            "RatifierClient",
            "SyncRatifierClient",
            "T",
            "idempotency_key_for",
            "log",
        ),
    ),
    "ratifier.adapters": ("ratifier_client.adapters", ()),
    "ratifier.adapters.confirmation": (
        "ratifier_client.adapters.confirmation",
        ("ConfirmationApi", "ConfirmationRefused"),
    ),
    "ratifier.adapters.langgraph": (
        "ratifier_client.adapters.langgraph",
        ("ContextSource", "RatifierToolNode", "approval_payload"),
    ),
    "ratifier.adapters.openai_agents": (
        "ratifier_client.adapters.openai_agents",
        (
            "ContextSource",
            "RatifierAgentTools",
            "ToolDefinition",
            "pending_text",
            "tool_definitions",
        ),
    ),
}


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the old modules, so that the next import runs them (and warns) again; the
    modules cached before the test are put back after it."""
    for name in list(sys.modules):
        if name == "ratifier.client" or name.split(".")[:2] == ["ratifier", "adapters"]:
            monkeypatch.delitem(sys.modules, name)


def _import_warned(old: str) -> ModuleType:
    new = OLD_MODULES[old][0]
    expected = f"{old} is deprecated and will be removed in 0.3: import from {new}"
    # Importing a module of ratifier.adapters imports (and warns about) the package too.
    with pytest.warns(
        DeprecationWarning, match="is deprecated and will be removed in 0.3"
    ) as caught:
        module = importlib.import_module(old)
    assert any(str(w.message).startswith(expected) for w in caught), [
        str(w.message) for w in caught
    ]
    return module


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_old_import_warns_with_the_new_path_and_exports_the_same_objects(
    fresh: None, old: str
) -> None:
    module = _import_warned(old)
    new = importlib.import_module(OLD_MODULES[old][0])
    for name in OLD_MODULES[old][1]:
        assert getattr(module, name) is getattr(new, name), name


def test_the_warning_points_at_the_importing_line(fresh: None) -> None:
    with pytest.warns(DeprecationWarning, match=r"import from ratifier_client\.client") as caught:
        import ratifier.client  # noqa: F401
    (warning,) = [w for w in caught if "ratifier.client" in str(w.message)]
    assert warning.filename == __file__


def test_a_script_importing_the_old_path_is_told_with_default_warning_filters() -> None:
    """Python shows a DeprecationWarning by default only when it is attributed to __main__:
    the warning's stack level must name the importer, not the shim or importlib."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-c", "from ratifier.client import RatifierClient"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert (
        "<string>:1: DeprecationWarning: ratifier.client is deprecated and will be removed "
        "in 0.3: import from ratifier_client.client (or ratifier_client)"
    ) in done.stderr


def test_calls_through_the_old_path_work(fresh: None) -> None:
    old_client = _import_warned("ratifier.client")
    import ratifier_client

    client = old_client.RatifierClient.from_settings(
        ClientSettings(topic_prefix="upgraded."), client_id="old-path"
    )
    assert isinstance(client, ratifier_client.RatifierClient)
    assert client.reply_to is None

    # An agent's idempotency keys stay what the previous release derived (sha256 of agent,
    # run and step), so a step re-proposed after the upgrade is still recognised.
    digest = hashlib.sha256(b"support-bot\x00conv-1\x001").hexdigest()
    key = old_client.idempotency_key_for(agent="support-bot", run="conv-1", step=1)
    assert key == f"ik-{digest[:40]}"

    agents = _import_warned("ratifier.adapters.openai_agents")
    text = agents.pending_text(old_client.Pending(call_id="c-1"))
    assert '"call_id":"c-1"' in text
    assert '"status":"pending"' in text

    confirmation = _import_warned("ratifier.adapters.confirmation")
    assert issubclass(confirmation.ConfirmationRefused, Exception)
