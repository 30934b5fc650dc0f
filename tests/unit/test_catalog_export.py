"""Catalog export: every format for the reference catalog, loaded with the official SDKs'
own types; OpenAI strict-mode rules checked recursively; the CLI subcommand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anthropic.types
import mcp.types
import openai
import openai.types.chat
import openai.types.shared_params
import pytest
from pydantic import BaseModel, Field, TypeAdapter

from commands.catalog import SECRET_MARK, Catalog, Tool, ToolArguments
from commands.export import (
    FORMATS,
    OPENAI_KEYWORDS,
    ExportFormat,
    base_schema,
    export_catalog,
    openai_schema,
)
from commands.payments.tools import TOOLS
from commands.reference import catalog as reference_catalog
from ratifier.cli import build_parser, main
from schemas.envelopes import Effect
from schemas.errors import ConfigurationError

SCHEMA_LIST_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONE_KEYWORDS = ("items", "additionalProperties", "not")


def _tool_list(fmt: str) -> list[dict[str, Any]]:
    exported = export_catalog(reference_catalog, fmt)
    assert isinstance(exported, list)
    return exported


def _materialize(value: Any) -> Any:
    """Plain lists/dicts from a pydantic-validated TypedDict: `Iterable[...]` fields come
    back as lazy validating iterators, whose items are validated only when consumed."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "__iter__") and not isinstance(value, (str, bytes))
    ):
        return [_materialize(v) for v in value]
    return value


def _validate_typed_dict(kind: Any, value: dict[str, Any]) -> None:
    """Validate ``value`` against an SDK TypedDict and require that nothing was dropped or
    changed (pydantic ignores unknown keys of a TypedDict by default)."""
    adapter = TypeAdapter(kind)
    validated = adapter.validate_python(value, strict=True)
    # The lazy iterators need their adapter alive while they are consumed: pydantic-core
    # panics instead of validating when it was garbage-collected first.
    assert _materialize(validated) == value
    del adapter


def _schema_nodes(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (sub)schema with its path; property *names* are not mistaken for keywords."""
    if not isinstance(node, dict):
        return
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _schema_nodes(child, f"{path}.properties.{name}")
    for key in SCHEMA_LIST_KEYWORDS:
        for index, child in enumerate(node.get(key) or ()):
            yield from _schema_nodes(child, f"{path}.{key}[{index}]")
    for key in SCHEMA_ONE_KEYWORDS:
        yield from _schema_nodes(node.get(key), f"{path}.{key}")


def assert_openai_strict(schema: dict[str, Any]) -> None:
    assert schema["type"] == "object"
    for path, node in _schema_nodes(schema):
        assert "default" not in node, path
        assert "title" not in node, path
        assert "$ref" not in node and "$defs" not in node, path
        assert set(node) <= OPENAI_KEYWORDS, (path, set(node) - OPENAI_KEYWORDS)
        if node.get("type") == "object" or "properties" in node:
            assert node["additionalProperties"] is False, path
            assert node["required"] == list(node["properties"]), path


def _propose_refund_properties(schema: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"]
    amount = properties["amount_minor"]
    assert amount["type"] == "integer"
    assert amount.get("exclusiveMinimum") == 0 or amount.get("minimum") == 1
    assert properties["reason"]["maxLength"] == 300
    assert properties["payment_id"]["pattern"] == "^pay_[0-9A-Za-z]+$"
    return properties


# ---------------------------------------------------------------------------------- formats


def test_formats_are_the_cli_choices() -> None:
    assert tuple(f.value for f in ExportFormat) == FORMATS
    for fmt in FORMATS:
        args = build_parser().parse_args(["catalog", "export", "--format", fmt])
        assert args.format == fmt
    with pytest.raises(SystemExit):
        build_parser().parse_args(["catalog", "export", "--format", "yaml"])


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown export format"):
        export_catalog(reference_catalog, "gemini")


def test_openai_tools_load_as_sdk_types_and_follow_strict_mode() -> None:
    tools = _tool_list("openai")
    assert [t["function"]["name"] for t in tools] == sorted(reference_catalog.names)
    for tool in tools:
        _validate_typed_dict(openai.types.chat.ChatCompletionToolParam, tool)
        _validate_typed_dict(openai.types.shared_params.FunctionDefinition, tool["function"])
        assert tool["type"] == "function"
        assert tool["function"]["strict"] is True
        declared = reference_catalog.get(tool["function"]["name"])
        assert declared is not None
        assert tool["function"]["description"] == declared.description
        assert_openai_strict(tool["function"]["parameters"])
        assert "writeOnly" not in json.dumps(tool)
    refund = next(t for t in tools if t["function"]["name"] == "propose_refund")
    _propose_refund_properties(refund["function"]["parameters"])


def test_openai_parameters_match_the_sdks_own_strict_schema() -> None:
    """`openai.pydantic_function_tool` is the SDK's strict-schema conversion of a pydantic
    model; ours agrees with it (apart from the titles and the secret marks we drop)."""
    for tool in TOOLS:
        theirs = openai.pydantic_function_tool(tool.arguments)["function"]["parameters"]
        assert openai_schema(tool) == _without_titles(dict(theirs)), tool.name


def _without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if k not in ("title", SECRET_MARK)}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _without_titles(v) for k, v in out["properties"].items()}
    return out


def test_anthropic_tools_load_as_sdk_types() -> None:
    tools = _tool_list("anthropic")
    for tool in tools:
        _validate_typed_dict(anthropic.types.ToolParam, tool)
        assert set(tool) == {"name", "description", "input_schema"}
        assert tool["input_schema"]["type"] == "object"
        assert tool["input_schema"]["additionalProperties"] is False
    refund = next(t for t in tools if t["name"] == "propose_refund")
    _propose_refund_properties(refund["input_schema"])


def test_mcp_tools_load_as_sdk_types_with_effect_annotations() -> None:
    tools = _tool_list("mcp")
    for tool in tools:
        model = mcp.types.Tool.model_validate(tool)
        # Nothing was ignored: the SDK model dumps back to exactly what we exported.
        assert model.model_dump(by_alias=True, exclude_none=True) == tool
        declared = reference_catalog.get(tool["name"])
        assert declared is not None
        effect = declared.effect
        assert model.annotations is not None
        assert model.annotations.read_only_hint is (effect is Effect.READ)
        if effect is Effect.DESTRUCTIVE:
            assert model.annotations.destructive_hint is True
    listed = mcp.types.ListToolsResult.model_validate({"tools": tools})
    assert [t.name for t in listed.tools] == sorted(reference_catalog.names)
    refund = next(t for t in tools if t["name"] == "propose_refund")
    _propose_refund_properties(refund["inputSchema"])


def test_jsonschema_export_has_effect_and_dialect() -> None:
    exported = export_catalog(reference_catalog, "jsonschema")
    assert isinstance(exported, dict)
    assert sorted(exported) == sorted(reference_catalog.names)
    for name, entry in exported.items():
        tool = reference_catalog.get(name)
        assert tool is not None
        assert entry["description"] == tool.description
        assert entry["effect"] == tool.effect.value
        assert entry["schema"]["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert "title" not in json.dumps(entry["schema"])
    _propose_refund_properties(exported["propose_refund"]["schema"])


# ------------------------------------------------------------ shapes beyond the reference catalog


class Channel(BaseModel):
    kind: Literal["email", "sms"]
    note: str | None = None


class RichArguments(ToolArguments):
    """Developer notes that must not reach a model."""

    title: str = Field(max_length=80, description="Shown to the customer.")
    channels: list[Channel] = Field(min_length=1, max_length=3)
    primary: Channel
    limit: Annotated[int, Field(ge=1, le=50)] = 10
    api_key: str


def _rich_tool(**overrides: Any) -> Tool:
    fields: dict[str, Any] = {
        "name": "notify",
        "description": "Notify a customer.",
        "arguments": RichArguments,
        "effect": Effect.REVERSIBLE_WRITE,
        "handler": TOOLS[0].handler,
        "secret_fields": frozenset({"api_key"}),
    }
    fields.update(overrides)
    return Tool(**fields)


def test_nested_models_are_inlined_and_strict() -> None:
    tool = _rich_tool()
    assert "$defs" in tool.arguments.model_json_schema()  # the case being exercised
    schema = openai_schema(tool)
    assert_openai_strict(schema)
    props = schema["properties"]
    # A property named "title" is kept; only the keyword is dropped.
    assert props["title"] == {
        "type": "string",
        "maxLength": 80,
        "description": "Shown to the customer.",
    }
    assert props["primary"]["properties"]["kind"]["enum"] == ["email", "sms"]
    assert props["primary"]["required"] == ["kind", "note"]
    assert props["channels"]["items"]["additionalProperties"] is False
    assert props["channels"]["minItems"] == 1
    assert "description" not in schema  # the model's docstring stays private
    assert schema["required"] == ["title", "channels", "primary", "limit", "api_key"]
    _validate_typed_dict(
        openai.types.chat.ChatCompletionToolParam,
        export_catalog(Catalog([tool]), "openai")[0],  # type: ignore[index]
    )
    # Other formats keep defaults and optional fields, still without $ref or titles.
    plain = base_schema(tool)
    assert plain["properties"]["limit"]["default"] == 10
    assert "limit" not in plain["required"]
    assert "$ref" not in json.dumps(plain) and "$defs" not in plain


def test_secret_fields_are_write_only_in_jsonschema_only() -> None:
    catalog = Catalog([_rich_tool()])
    exported = export_catalog(catalog, "jsonschema")
    assert isinstance(exported, dict)
    properties = exported["notify"]["schema"]["properties"]
    assert properties["api_key"]["writeOnly"] is True
    assert "writeOnly" not in properties["title"]
    for fmt in ("openai", "anthropic", "mcp"):
        assert "writeOnly" not in json.dumps(export_catalog(catalog, fmt)), fmt


def test_unknown_secret_field_is_a_configuration_error() -> None:
    catalog = Catalog([_rich_tool(secret_fields=frozenset({"password"}))])
    with pytest.raises(ConfigurationError, match="password"):
        export_catalog(catalog, "jsonschema")


def test_mcp_annotations_follow_effects() -> None:
    tool = _rich_tool()
    exported = export_catalog(Catalog([tool]), "mcp")
    assert isinstance(exported, list)
    model = mcp.types.Tool.model_validate(exported[0])
    assert model.annotations is not None
    assert model.annotations.read_only_hint is False
    assert model.annotations.destructive_hint is False


class FreeForm(ToolArguments):
    metadata: dict[str, str]


class Pair(ToolArguments):
    pair: tuple[int, str]


class Node(ToolArguments):
    children: list[Node] = Field(max_length=3)


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        (FreeForm, "open-ended object"),
        (Pair, "prefixItems"),
        (Node, "recursive"),
    ],
)
def test_shapes_strict_mode_cannot_express_are_refused(
    arguments: type[ToolArguments], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        openai_schema(_rich_tool(arguments=arguments, secret_fields=frozenset()))


# -------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_writes_the_export(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RATIFIER_CATALOG", "commands.reference:catalog")
    out = tmp_path / f"{fmt}.json"
    assert main(["catalog", "export", "--format", fmt, "--output", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == export_catalog(reference_catalog, fmt)
    assert str(out) in capsys.readouterr().out


def test_cli_writes_to_stdout_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RATIFIER_CATALOG", "commands.reference:catalog")
    assert main(["catalog", "export", "--format", "anthropic"]) == 0
    assert json.loads(capsys.readouterr().out) == export_catalog(reference_catalog, "anthropic")


def test_cli_reports_a_bad_catalog(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RATIFIER_CATALOG", "no_such_module:catalog")
    assert main(["catalog", "export", "--format", "openai"]) == 2
    assert "cannot be imported" in capsys.readouterr().err
