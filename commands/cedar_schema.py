"""The Cedar schema of a catalog, generated from its declarations: each tool's argument model
(the request context) and the `ResourceFacts` its loader declares (the resource entity).

Type mapping (pydantic field → Cedar type), documented in docs/policies.md:

| pydantic | Cedar |
|---|---|
| ``str``, ``Literal["a"]``, a ``StrEnum``, dates and times (ISO strings) | ``String`` |
| ``int`` (money: integers in minor units) | ``Long`` |
| ``bool`` | ``Boolean`` |
| ``list[X]``, ``tuple[X, ...]``, ``set[X]``, ``frozenset[X]`` | ``Set`` of X (unordered) |
| a nested model | ``Record`` |
| ``X | None`` or a field with a default of ``None`` | X, ``"required": false`` |
| a float, a ``Decimal``, a free-form ``dict``, a union of several types | refused (named) |

Fields with a non-``None`` default stay required: validation fills the default in.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from commands.budgets import Budget, budgets_of_tool
from commands.catalog import Catalog, Tool

PRINCIPAL_TYPE = "User"
TENANT_TYPE = "Tenant"
RESERVED_TYPES = frozenset({PRINCIPAL_TYPE, TENANT_TYPE, "Action"})


def entity_type(kind: str) -> str:
    """Cedar entity type of a resource kind: ``refund_policy`` → ``RefundPolicy``."""
    return "".join(part.capitalize() for part in kind.split("_"))


@dataclass(frozen=True, kw_only=True)
class SchemaProblem:
    """A declaration the Cedar schema cannot express, with where it was declared."""

    tool: str
    where: str  # "arguments.amount" or "resource.total"
    problem: str
    source: str = ""  # file:line of the declaring model

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return f"{prefix}tool {self.tool}: {self.where}: {self.problem}"


def _source_of(model: type[Any]) -> str:
    try:
        path = inspect.getsourcefile(model) or "?"
        _, line = inspect.getsourcelines(model)
    except (OSError, TypeError):
        return ""
    return f"{path}:{line}"


class _Mapper:
    def __init__(self, tool: str, root: str, defs: dict[str, Any], source: str) -> None:
        self.tool, self.root, self.defs, self.source = tool, root, defs, source
        self.problems: list[SchemaProblem] = []

    def problem(self, path: str, text: str) -> None:
        where = f"{self.root}{path}"
        self.problems.append(
            SchemaProblem(tool=self.tool, where=where, problem=text, source=self.source)
        )

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = self.defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def record(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        node = self.resolve(node)
        properties = node.get("properties")
        if not isinstance(properties, dict):
            self.problem(path, "a free-form object has no Cedar type; declare a model")
            return {"type": "Record", "attributes": {}}
        required = set(node.get("required", ()))
        attributes: dict[str, Any] = {}
        for name, field in properties.items():
            cedar, optional = self.value(field, f"{path}.{name}")
            if cedar is None:
                continue
            if optional or (name not in required and field.get("default", ...) is None):
                cedar = {**cedar, "required": False}
            attributes[name] = cedar
        return {"type": "Record", "attributes": attributes}

    def value(self, node: dict[str, Any], path: str) -> tuple[dict[str, Any] | None, bool]:
        """(Cedar type, optional) of one JSON Schema node."""
        node = self.resolve(node)
        variants = node.get("anyOf") or node.get("oneOf")
        if variants:
            kept = [v for v in variants if self.resolve(v).get("type") != "null"]
            if len(kept) == 1:
                cedar, _ = self.value(kept[0], path)
                return cedar, len(kept) < len(variants)
            self.problem(path, "a union of several types has no Cedar type")
            return None, False
        kind = node.get("type")
        if kind is None and "enum" in node:
            values = node["enum"]
            kind = "string" if all(isinstance(v, str) for v in values) else "mixed"
        if kind is None and "const" in node:
            kind = "string" if isinstance(node["const"], str) else "mixed"
        if kind == "string":
            return {"type": "String"}, False
        if kind == "integer":
            return {"type": "Long"}, False
        if kind == "boolean":
            return {"type": "Boolean"}, False
        if kind == "number":
            self.problem(path, "a float has no Cedar type: use an integer (money in minor units)")
            return None, False
        if kind == "array":
            items = node.get("items")
            if not isinstance(items, dict):
                self.problem(path, "a tuple of mixed types has no Cedar type")
                return None, False
            element, _ = self.value(items, f"{path}[]")
            return ({"type": "Set", "element": element} if element else None), False
        if kind == "object":
            return self.record(node, path), False
        self.problem(path, f"type {kind!r} has no Cedar type")
        return None, False


def _model_record(
    tool: str, model: type[BaseModel], root: str
) -> tuple[dict[str, Any], list[SchemaProblem]]:
    schema = model.model_json_schema()
    mapper = _Mapper(tool, root, schema.get("$defs", {}), _source_of(model))
    return mapper.record(schema, ""), mapper.problems


def _resource_type(tool: Tool) -> tuple[str, dict[str, Any] | None, list[SchemaProblem]]:
    """(entity type, its shape or None for the tenant, problems) of a tool's resource."""
    if tool.load is None:
        return TENANT_TYPE, None, []
    if tool.resource is None:
        return (
            "",
            None,
            [
                SchemaProblem(
                    tool=tool.name,
                    where="resource",
                    problem="the loader declares no attributes: set Tool(resource=<ResourceFacts>)",
                    source=_source_of_function(tool.load),
                )
            ],
        )
    kind = getattr(tool.resource, "kind", None)
    source = _source_of(tool.resource)
    if not isinstance(kind, str) or not kind:
        return (
            "",
            None,
            [
                SchemaProblem(
                    tool=tool.name, where="resource", problem="declares no kind", source=source
                )
            ],
        )
    cedar_type = entity_type(kind)
    if cedar_type in RESERVED_TYPES:
        return (
            "",
            None,
            [
                SchemaProblem(
                    tool=tool.name,
                    where="resource.kind",
                    problem=(
                        f"kind {kind!r} becomes the Cedar type {cedar_type}, which ratifier uses "
                        "for the principal, the tenant or actions: choose another kind "
                        "(for example 'customer' or 'account')"
                    ),
                    source=source,
                )
            ],
        )
    shape, problems = _model_record(tool.name, tool.resource, "resource")
    if "tenant" in shape["attributes"]:
        problems.append(
            SchemaProblem(
                tool=tool.name,
                where="resource.tenant",
                problem="'tenant' is added by ratifier; do not declare it",
                source=source,
            )
        )
    shape["attributes"] = {"tenant": {"type": "String"}, **shape["attributes"]}
    return cedar_type, shape, problems


def _source_of_function(function: Any) -> str:
    code = getattr(function, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


@dataclass(frozen=True, kw_only=True)
class GeneratedSchema:
    schema: dict[str, Any]
    problems: tuple[SchemaProblem, ...]

    def text(self) -> str:
        return json.dumps(self.schema, indent=2, sort_keys=True) + "\n"


# The context attribute with the call's budgets.
BUDGETS_CONTEXT = "budgets"
# One budget's standing in ``context.budgets`` (commands.budgets.BudgetStanding.cedar).
BUDGET_STANDING_TYPE: dict[str, Any] = {
    "type": "Record",
    "attributes": {
        "name": {"type": "String"},
        "used": {"type": "Long"},
        "reserved": {"type": "Long"},
        "cap": {"type": "Long"},
        "percent_used": {"type": "Long"},
    },
}


def budgets_context(budgets: Sequence[Budget], tool: Tool) -> dict[str, Any]:
    """``context.budgets`` of ``tool``: a record keyed by the name of each budget its calls
    can fall under, so `policy check` refuses a policy naming a budget that is not there.
    Empty (and then left out of the schema) when none applies: a set without budgets keeps
    the schema and version it always had, and a v1.4 worker keeps deciding its calls."""
    names = [b.name for b in budgets_of_tool(budgets, tool)]
    if not names:
        return {}
    return {
        BUDGETS_CONTEXT: {
            "type": "Record",
            "attributes": {n: BUDGET_STANDING_TYPE for n in sorted(names)},
        }
    }


def generate_schema(catalog: Catalog, budgets: Sequence[Budget] = ()) -> GeneratedSchema:
    """The Cedar schema (JSON form) of ``catalog``, and what it could not express; with the
    ``budgets`` of the policy directory in each action's ``context.budgets``."""
    entity_types: dict[str, Any] = {
        PRINCIPAL_TYPE: {
            "shape": {
                "type": "Record",
                "attributes": {
                    "tenant": {"type": "String"},
                    "sub": {"type": "String"},
                    "roles": {"type": "Set", "element": {"type": "String"}},
                },
            }
        },
        TENANT_TYPE: {"shape": {"type": "Record", "attributes": {"tenant": {"type": "String"}}}},
    }
    declared_by: dict[str, str] = {}
    actions: dict[str, Any] = {}
    problems: list[SchemaProblem] = []
    for tool in sorted(catalog, key=lambda t: t.name):
        resource_type, shape, found = _resource_type(tool)
        problems += found
        if shape is not None:
            earlier = entity_types.get(resource_type)
            if earlier is not None and earlier["shape"] != shape:
                problems.append(
                    SchemaProblem(
                        tool=tool.name,
                        where="resource",
                        problem=(
                            f"declares {resource_type} with other attributes than tool "
                            f"{declared_by[resource_type]}: one kind, one declaration"
                        ),
                        source=_source_of(tool.resource) if tool.resource else "",
                    )
                )
            else:
                entity_types[resource_type] = {"shape": shape}
                declared_by.setdefault(resource_type, tool.name)
        arguments, found = _model_record(tool.name, tool.arguments, "arguments")
        problems += found
        actions[tool.name] = {
            "appliesTo": {
                "principalTypes": [PRINCIPAL_TYPE],
                "resourceTypes": [resource_type] if resource_type else [],
                "context": {
                    "type": "Record",
                    "attributes": {
                        "effect": {"type": "String"},
                        "arguments": arguments,
                        **budgets_context(budgets, tool),
                    },
                },
            }
        }
    return GeneratedSchema(
        schema={"": {"entityTypes": entity_types, "actions": actions}}, problems=tuple(problems)
    )
