from __future__ import annotations

import pytest

from commands.catalog import Catalog, load_catalog
from commands.reference import catalog as reference_catalog
from schemas.errors import ConfigurationError


def test_default_and_plugged_in_catalogs_load() -> None:
    assert load_catalog("commands.reference:catalog") is reference_catalog
    helpdesk = load_catalog("examples.helpdesk:catalog")
    assert helpdesk.names == ("get_ticket", "reset_password")


@pytest.mark.parametrize(
    "spec", ["nope", "no.such.module:catalog", "commands.reference:TOOLS", "commands.reference:"]
)
def test_bad_catalog_setting_is_a_readable_error(spec: str) -> None:
    with pytest.raises(ConfigurationError):
        load_catalog(spec)


def test_duplicate_tool_names_are_refused() -> None:
    tool = next(iter(reference_catalog))
    with pytest.raises(ConfigurationError, match="declared twice"):
        Catalog([tool, tool])


def test_secret_fields_are_masked() -> None:
    tool = load_catalog("examples.helpdesk:catalog").get("reset_password")
    assert tool is not None
    assert tool.secret_fields == frozenset({"temporary_password"})
    args = {"user_email": "a@b.c", "temporary_password": "correct horse battery"}
    assert tool.masked(args) == {"user_email": "a@b.c", "temporary_password": "***"}
    salted = tool.masked(args, salt="s1")["temporary_password"]
    assert salted.startswith("sha256:")
    assert "horse" not in salted
    assert salted == tool.masked(args, salt="s1")["temporary_password"]
    assert salted != tool.masked(args, salt="s2")["temporary_password"]


def test_reference_models_are_strict() -> None:
    for tool in reference_catalog:
        config = tool.arguments.model_config
        assert config.get("extra") == "forbid"
        assert config.get("strict") is True
        assert config.get("frozen") is True
