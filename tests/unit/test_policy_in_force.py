"""The policy set in force is never a surprise: start-up says which set and where it came
from, and a local folder that differs from the published set is loud (or fatal)."""

from __future__ import annotations

import logging

import pytest

from commands.policy import PolicySet
from config.settings import Settings
from feeds.policies import PolicyFeed, PolicyStatus, policy_record
from schemas.errors import ConfigurationError


def published(local: PolicySet, settings: Settings) -> bytes:
    other = PolicySet.from_sources(local.text + "\n// another version\n", local.schema)
    return policy_record(settings, other).to_bytes()


def test_start_up_names_the_set_and_its_origin(
    policies: PolicySet, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings()
    feed = PolicyFeed(settings, policies)
    with caplog.at_level(logging.WARNING, logger="ratifier.policies"):
        feed.announce()
    assert f"policy set in force: default {policies.version}, from local folder" in caplog.text
    assert "DIFFERS" not in caplog.text


def test_a_differing_local_folder_is_loud(
    policies: PolicySet, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings()
    feed = PolicyFeed(settings, policies)
    feed.apply(published(policies, settings))
    assert feed.current.version != policies.version
    with caplog.at_level(logging.WARNING, logger="ratifier.policies"):
        feed.announce()
    assert f"from topic {settings.topic_prefix}policies key 'default'" in caplog.text
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors
    assert "LOCAL POLICY FOLDER DIFFERS" in errors[0].getMessage()
    assert policies.version in errors[0].getMessage()


def test_a_differing_local_folder_can_stop_start_up(policies: PolicySet) -> None:
    settings = Settings(policies={"directory_mismatch": "error"})
    feed = PolicyFeed(settings, policies)
    feed.apply(published(policies, settings))
    with pytest.raises(ConfigurationError, match="LOCAL POLICY FOLDER DIFFERS"):
        feed.announce()


def test_status_renders_drift() -> None:
    status = PolicyStatus(
        name="default",
        in_force="sha256:b",
        origin="topic ratifier.policies key 'default'",
        local="sha256:a",
        local_dir="/policies",
        refusals=(),
    )
    assert status.differs
    assert "DIFFERS" in status.render()


def test_a_published_set_equal_to_the_folder_comes_from_the_topic(policies: PolicySet) -> None:
    settings = Settings()
    feed = PolicyFeed(settings, policies)
    feed.apply(policy_record(settings, policies).to_bytes())
    assert feed.current.version == policies.version
    assert feed.origin.startswith(f"topic {settings.topic_prefix}policies key 'default'")
    # Another set name on the same topic is not ours: the origin stays.
    other = Settings(policies={"set_name": "other"})
    mine = PolicyFeed(settings, policies)
    mine.apply(policy_record(other, policies).to_bytes())
    assert mine.origin.startswith("local folder")
