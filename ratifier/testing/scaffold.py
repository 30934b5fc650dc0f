"""`ratifier catalog import`: pydantic argument models and `Tool` stubs from existing tool
definitions (OpenAI, Anthropic or MCP JSON), as Python source to edit.

Each item is recognised by its shape: OpenAI ``{"type": "function", "function": {name,
description, parameters}}`` (or the flat Responses form), Anthropic ``{name, description,
input_schema}``, MCP ``{name, description, inputSchema}`` (a list, or a ``tools/list`` result
``{"tools": [...]}``). The scaffold is a start, not a catalog: every tool gets effect
``read`` and a handler that raises; choose effects, write loaders and ``ResourceFacts``.
"""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path
from typing import Any

from schemas.errors import ConfigurationError


def _definitions(data: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, JSON Schema of the arguments) of each tool."""
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list):
        raise ConfigurationError("tool JSON must be a list of tool definitions")
    found = []
    for item in data:
        if not isinstance(item, dict):
            raise ConfigurationError("each tool definition must be an object")
        function = item.get("function")
        body: dict[str, Any] = function if isinstance(function, dict) else item
        schema = body.get("parameters") or body.get("input_schema") or body.get("inputSchema")
        name = body.get("name")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise ConfigurationError(
                f"not an OpenAI, Anthropic or MCP tool definition: {item!r}"[:300]
            )
        found.append((name, str(body.get("description") or ""), schema))
    return found


def _class_name(name: str) -> str:
    return "".join(p.capitalize() for p in re.split(r"[^0-9A-Za-z]+", name) if p) or "Tool"


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit() or keyword.iskeyword(ident):
        ident = f"{ident}_"
    return ident


class _Writer:
    def __init__(self) -> None:
        self.classes: list[str] = []
        self.notes: list[str] = []

    def type_of(self, schema: dict[str, Any], owner: str, field: str) -> tuple[str, bool]:
        """(annotation, nullable) of one property."""
        kinds = schema.get("type")
        nullable = False
        if isinstance(kinds, list):
            nullable = "null" in kinds
            rest = [k for k in kinds if k != "null"]
            kinds = rest[0] if len(rest) == 1 else None
        variants = schema.get("anyOf") or schema.get("oneOf")
        if variants:
            rest = [v for v in variants if v.get("type") != "null"]
            nullable = len(rest) < len(variants)
            if len(rest) == 1:
                annotation, _ = self.type_of(rest[0], owner, field)
                return annotation, nullable
            self.notes.append(f"{owner}.{field}: a union; narrowed to str, check it")
            return "str", nullable
        if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            values = ", ".join(json.dumps(v) for v in schema["enum"])
            return f"Literal[{values}]", nullable
        constraints: list[str] = []
        if kinds == "string":
            for key, arg in (("minLength", "min_length"), ("maxLength", "max_length")):
                if key in schema:
                    constraints.append(f"{arg}={schema[key]}")
            if "pattern" in schema:
                constraints.append(f"pattern={schema['pattern']!r}")
            if "maxLength" not in schema:
                constraints.append("max_length=1000")
                self.notes.append(f"{owner}.{field}: no maxLength given; 1000 assumed")
            return f"Annotated[str, StringConstraints({', '.join(constraints)})]", nullable
        if kinds in ("integer", "number"):
            if kinds == "number":
                self.notes.append(
                    f"{owner}.{field}: a number; made an integer (Cedar has no floats: "
                    "money in minor units)"
                )
            for key, arg in (
                ("minimum", "ge"),
                ("maximum", "le"),
                ("exclusiveMinimum", "gt"),
                ("exclusiveMaximum", "lt"),
            ):
                if isinstance(schema.get(key), int | float):
                    constraints.append(f"{arg}={int(schema[key])}")
            return (f"Annotated[int, Field({', '.join(constraints)})]" if constraints else "int"), (
                nullable
            )
        if kinds == "boolean":
            return "bool", nullable
        if kinds == "array":
            items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
            element, _ = self.type_of(items or {"type": "string"}, owner, f"{field}[]")
            limit = schema.get("maxItems")
            if not isinstance(limit, int):
                limit = 100
                self.notes.append(f"{owner}.{field}: no maxItems given; 100 assumed")
            return f"Annotated[list[{element}], Field(max_length={limit})]", nullable
        if kinds == "object" and isinstance(schema.get("properties"), dict):
            nested = f"{owner}{_class_name(field)}"
            self.model(nested, schema, base="ToolArguments")
            return nested, nullable
        self.notes.append(f"{owner}.{field}: type {kinds!r} has no strict equivalent; str used")
        return "str", nullable

    def model(self, name: str, schema: dict[str, Any], *, base: str, doc: str = "") -> None:
        required = set(schema.get("required", ()))
        lines = [f"class {name}({base}):"]
        if doc:
            lines.append(f'    """{doc.strip()[:200]}"""' if '"""' not in doc else "    pass")
        properties = schema.get("properties") or {}
        for field, spec in properties.items():
            annotation, nullable = self.type_of(spec if isinstance(spec, dict) else {}, name, field)
            ident = _identifier(field)
            alias = "" if ident == field else f"  # was {field!r}: rename or alias it"
            if field in required and not nullable:
                lines.append(f"    {ident}: {annotation}{alias}")
            else:
                lines.append(f"    {ident}: {annotation} | None = None{alias}")
        if len(lines) == 1 or (doc and len(lines) == 2 and not properties):
            lines.append("    pass")
        self.classes.append("\n".join(lines))


def scaffold_catalog(path: Path) -> str:
    """Python source of argument models and `Tool` stubs for the tools in ``path``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path}: not a readable JSON file ({exc})") from exc
    writer = _Writer()
    tools = []
    for name, description, schema in _definitions(data):
        model = f"{_class_name(name)}Arguments"
        writer.model(model, schema, base="ToolArguments")
        tools.append(
            "        Tool(\n"
            f"            name={name!r},\n"
            f"            description={description!r},\n"
            f"            arguments={model},\n"
            "            effect=Effect.READ,  # TODO: read, reversible_write, external_write or "
            "destructive\n"
            "            handler=not_implemented,  # TODO: a handler; a loader and ResourceFacts\n"
            "        ),"
        )
    notes = "".join(f"# NOTE {n}\n" for n in writer.notes)
    return (
        f'"""Catalog scaffolded by `ratifier catalog import` from {path.name}: edit it."""\n\n'
        "from __future__ import annotations\n\n"
        "from typing import Annotated, Literal\n\n"
        "from pydantic import Field, StringConstraints\n\n"
        "from commands.catalog import Catalog, ExecutionContext, HandlerResult, Tool, "
        "ToolArguments\n"
        "from schemas.envelopes import Effect\n"
        "from schemas.errors import PermanentFailure\n\n"
        + (f"{notes}\n\n" if notes else "\n")
        + "\n\n\n".join(writer.classes)
        + "\n\n\nasync def not_implemented(ctx: ExecutionContext) -> HandlerResult:\n"
        '    raise PermanentFailure("not implemented yet", for_model="This tool is not '
        'available yet.")\n\n\n'
        "catalog = Catalog(\n    [\n" + "\n".join(tools) + "\n    ]\n)\n"
    )
