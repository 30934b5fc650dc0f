"""Export a catalog's tool definitions for a provider: OpenAI (strict function tools),
Anthropic, MCP, or plain JSON Schema.

Every schema comes from the tool's pydantic argument model (``model_json_schema()``), with
``$ref``/``$defs`` inlined, ``title`` keywords dropped and the root ``description`` (the
model's docstring, meant for developers) left out: the tool's own description is the one a
model reads.

The OpenAI schemas follow strict mode (Structured Outputs): every object has
``additionalProperties: false`` and lists every property in ``required``; there is no
``default``; ``oneOf`` becomes ``anyOf``; only the keywords in `OPENAI_KEYWORDS` are kept
(other annotations and constraints are dropped: the exported schema guides the model, and
ratifier's validator still enforces the full pydantic model). Shapes strict mode cannot
express (free-form maps, tuples, ``not``, conditionals, recursive models) raise
`ConfigurationError` rather than export a schema that promises less than it checks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from commands.catalog import Catalog, Tool
from schemas.envelopes import Effect
from schemas.errors import ConfigurationError


class ExportFormat(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    MCP = "mcp"
    JSONSCHEMA = "jsonschema"


FORMATS: tuple[str, ...] = tuple(f.value for f in ExportFormat)
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Keywords whose value is a map of name → subschema, a list of subschemas, or one subschema.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)

# What OpenAI strict mode accepts; everything else is dropped or (see below) refused.
OPENAI_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "const",
        "description",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
    }
)
OPENAI_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# Structural keywords strict mode cannot express: dropping them would change the shape.
_OPENAI_REFUSED = frozenset(
    {
        "prefixItems",
        "patternProperties",
        "dependentSchemas",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)


# ---------------------------------------------------------------------------- walking schemas


SchemaFn = Callable[[dict[str, Any], str], dict[str, Any]]


def _map_schema(node: Any, fn: SchemaFn, path: str = "$") -> Any:
    """Rebuild a schema bottom-up: subschemas first, then ``fn(node, path)`` on the node."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {
                name: _map_schema(child, fn, f"{path}.{key}.{name}")
                for name, child in node[key].items()
            }
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [
                _map_schema(child, fn, f"{path}.{key}[{i}]") for i, child in enumerate(node[key])
            ]
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out[key] = _map_schema(node[key], fn, f"{path}.{key}")
    return fn(out, path)


def _inline_refs(tool: Tool, schema: dict[str, Any]) -> dict[str, Any]:
    """Replace every local ``$ref`` with a copy of its target; drop ``$defs``."""
    defs: dict[str, Any] = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if not ref.startswith(("#/$defs/", "#/definitions/")) or name not in defs:
                raise ConfigurationError(f"tool {tool.name!r}: cannot resolve $ref {ref!r}")
            if name in seen:
                raise ConfigurationError(
                    f"tool {tool.name!r}: recursive argument model {name!r} cannot be inlined"
                )
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            target = resolve(copy.deepcopy(defs[name]), (*seen, name))
            return {**target, **{k: resolve(v, seen) for k, v in siblings.items()}}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("$defs", "definitions"):
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: resolve(child, seen) for name, child in value.items()}
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [resolve(child, seen) for child in value]
            elif key in _SCHEMA_ONE and isinstance(value, dict):
                out[key] = resolve(value, seen)
            else:
                out[key] = value
        return out

    resolved: dict[str, Any] = resolve(schema, ())
    return resolved


def _drop_titles(node: dict[str, Any], _path: str) -> dict[str, Any]:
    node.pop("title", None)
    return node


def base_schema(tool: Tool) -> dict[str, Any]:
    """The tool's argument schema with refs inlined and titles dropped (every format)."""
    inlined = _inline_refs(tool, tool.arguments.model_json_schema(mode="validation"))
    schema: dict[str, Any] = _map_schema(inlined, _drop_titles)
    schema.pop("description", None)
    if schema.get("type") != "object":
        raise ConfigurationError(f"tool {tool.name!r}: arguments must be a JSON object schema")
    return schema


# -------------------------------------------------------------------------- OpenAI strict mode


def _strict_node(tool: Tool, node: dict[str, Any], path: str) -> dict[str, Any]:
    refused = _OPENAI_REFUSED & node.keys()
    if refused:
        raise ConfigurationError(
            f"tool {tool.name!r}: {path} uses {sorted(refused)}, which OpenAI strict mode "
            "cannot express"
        )
    if "allOf" in node:
        parts = node["allOf"]
        if len(parts) != 1 or not isinstance(parts[0], dict):
            raise ConfigurationError(
                f"tool {tool.name!r}: {path} uses allOf, which OpenAI strict mode cannot express"
            )
        node = {**parts[0], **{k: v for k, v in node.items() if k != "allOf"}}
    if "oneOf" in node:
        node = {**{k: v for k, v in node.items() if k != "oneOf"}, "anyOf": node["oneOf"]}
    out = {k: v for k, v in node.items() if k in OPENAI_KEYWORDS}
    if "format" in out and out["format"] not in OPENAI_FORMATS:
        del out["format"]
    if out.get("type") == "object" or "properties" in out:
        extra = out.get("additionalProperties", False)
        if extra is not False:
            raise ConfigurationError(
                f"tool {tool.name!r}: {path} is an open-ended object, which OpenAI strict "
                "mode cannot express"
            )
        properties = out.get("properties", {})
        out["type"] = "object"
        out["properties"] = properties
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def openai_schema(tool: Tool) -> dict[str, Any]:
    """The tool's argument schema in OpenAI strict-mode form."""
    strict: dict[str, Any] = _map_schema(
        base_schema(tool), lambda node, path: _strict_node(tool, node, path)
    )
    return strict


# -------------------------------------------------------------------------------- the formats


def jsonschema_schema(tool: Tool) -> dict[str, Any]:
    """A standalone JSON Schema (2020-12); secret fields are marked ``writeOnly``."""
    schema = base_schema(tool)
    properties = schema.get("properties", {})
    for name in sorted(tool.secret_fields):
        if name not in properties:
            raise ConfigurationError(
                f"tool {tool.name!r}: secret field {name!r} is not one of its arguments"
            )
        properties[name] = {**properties[name], "writeOnly": True}
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def mcp_annotations(effect: Effect) -> dict[str, bool]:
    """MCP ``ToolAnnotations`` hints from the effect class. An external write leaves
    ``destructiveHint`` at MCP's default (true): its effect cannot be undone by us."""
    if effect is Effect.READ:
        return {"readOnlyHint": True}
    if effect is Effect.DESTRUCTIVE:
        return {"readOnlyHint": False, "destructiveHint": True}
    if effect is Effect.REVERSIBLE_WRITE:
        return {"readOnlyHint": False, "destructiveHint": False}
    return {"readOnlyHint": False}


def _tools(catalog: Catalog) -> list[Tool]:
    """Sorted by name: the output does not depend on declaration order."""
    tools: list[Tool] = sorted(catalog, key=lambda tool: tool.name)
    return tools


def export_catalog(
    catalog: Catalog, fmt: ExportFormat | str
) -> list[dict[str, Any]] | dict[str, Any]:
    """Tool definitions for ``fmt``: a list of tools (openai, anthropic, mcp) or a map
    name → ``{description, effect, schema}`` (jsonschema)."""
    try:
        kind = ExportFormat(fmt)
    except ValueError:
        raise ValueError(
            f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}"
        ) from None
    tools = _tools(catalog)
    if kind is ExportFormat.OPENAI:
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "strict": True,
                    "parameters": openai_schema(tool),
                },
            }
            for tool in tools
        ]
    if kind is ExportFormat.ANTHROPIC:
        return [
            {"name": tool.name, "description": tool.description, "input_schema": base_schema(tool)}
            for tool in tools
        ]
    if kind is ExportFormat.MCP:
        return [
            {
                "name": tool.name,
                "description": tool.description,
                "inputSchema": base_schema(tool),
                "annotations": mcp_annotations(tool.effect),
            }
            for tool in tools
        ]
    return {
        tool.name: {
            "description": tool.description,
            "effect": tool.effect.value,
            "schema": jsonschema_schema(tool),
        }
        for tool in tools
    }
