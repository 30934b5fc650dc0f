"""`ratifier policy status` against real Kafka: the published set in force, where it came
from, and whether the local folder differs."""

from __future__ import annotations

import time

import pytest

from commands.policy import PolicySet
from config.settings import Settings
from feeds.policies import local_policies, policy_record, policy_status, publish_policies
from ratifier.cli import main
from ratifier.topics import ensure_topics

pytestmark = pytest.mark.integration


async def test_status_shows_the_published_set_and_the_local_drift(settings: Settings) -> None:
    await ensure_topics(settings)
    local = local_policies(settings)
    newer = PolicySet.from_sources(local.text + "\n// published later\n", local.schema)
    await publish_policies(settings, policy_record(settings, newer))
    status = await policy_status(settings)
    assert status.in_force == newer.version
    assert status.local == local.version
    assert status.differs
    assert status.origin.startswith(f"topic {settings.topic_prefix}policies key 'default'")
    assert "DIFFERS" in status.render()
    await publish_policies(settings, policy_record(settings, local))
    again = await policy_status(settings)
    assert again.in_force == local.version
    assert not again.differs


async def test_a_published_set_equal_to_the_folder_is_said_to_come_from_the_topic(
    settings: Settings,
) -> None:
    await ensure_topics(settings)
    # A set name of its own: the only record under it is the folder's set.
    settings = settings.changed(policies={"set_name": "same-as-folder"})
    local = local_policies(settings)
    await publish_policies(settings, policy_record(settings, local))
    status = await policy_status(settings)
    assert status.in_force == local.version
    assert not status.differs
    assert status.origin.startswith(f"topic {settings.topic_prefix}policies key 'same-as-folder'")


def test_a_prefix_without_a_policies_topic_is_a_clear_refusal_then_topics_fix_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands of docs/operations.md "Run a private pipeline", on a fresh prefix (under
    the session's, so the session deletes its topics)."""
    prefix = f"{settings.topic_prefix}private."
    monkeypatch.setenv("RATIFIER_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("RATIFIER_TOPIC_PARTITIONS", "1")
    started = time.monotonic()
    assert main(["policy", "status"]) == 2
    refused = capsys.readouterr()
    assert time.monotonic() - started < 20  # answered, not waited out
    assert refused.err.startswith(f"ratifier policy: no topic {prefix}policies on ")
    assert "ratifier topics" in refused.err
    assert "Traceback" not in refused.err + refused.out
    assert main(["topics"]) == 0
    assert f"created under prefix {prefix!r}" in capsys.readouterr().out
    assert main(["policy", "status"]) == 0
    status = capsys.readouterr().out
    assert "  from: local folder " in status
    assert "(same)" in status
