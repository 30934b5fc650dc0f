"""The validator's pure decisions: bytes → envelope, envelope → validated call or rejection.

Nothing here does I/O; every input, however broken, yields exactly one typed value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from commands.catalog import Catalog, Tool, ToolArguments
from schemas.envelopes import (
    CALL_ID_PATTERN,
    CallFormat,
    FieldProblem,
    ProposedCall,
    ReplyAddress,
)
from schemas.errors import ErrorCode

_CALL_ID = re.compile(CALL_ID_PATTERN)
# Recover a call id from a record too broken or too big to parse whole.
_CALL_ID_PROBE = re.compile(rb'"call_id"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')
MAX_FIELD_PROBLEMS = 20


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_record_bytes: int = 64 * 1024
    max_nesting_depth: int = 16
    max_string_length: int = 8192
    # The only topic-name prefix a `reply_to` may name (Settings.reply_namespace).
    reply_namespace: str = "ratifier.replies."


@dataclass(frozen=True, kw_only=True)
class Malformed:
    """The record is not a valid envelope."""

    reason: str
    call_id: str | None


@dataclass(frozen=True, kw_only=True)
class Validated:
    call: ProposedCall
    tool: Tool
    arguments: ToolArguments
    normalized: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Rejection:
    call: ProposedCall
    tool_name: str
    code: ErrorCode
    fields: tuple[FieldProblem, ...] = ()


def _depth_and_longest_string(value: Any) -> tuple[int, int]:
    """Nesting depth and longest string (keys included), iteratively."""
    depth, longest = 0, 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            depth = max(depth, level)
            for key, child in node.items():
                longest = max(longest, len(key))
                stack.append((child, level + 1))
        elif isinstance(node, list):
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in node)
        elif isinstance(node, str):
            longest = max(longest, len(node))
    return depth, longest


def _probe_call_id(raw: bytes) -> str | None:
    match = _CALL_ID_PROBE.search(raw[:4096])
    return match.group(1).decode() if match else None


def parse_envelope(raw: bytes | None, limits: Limits) -> ProposedCall | Malformed:
    """Turn a raw `calls.proposed` value into an envelope, or say why it is not one."""
    if raw is None:
        return Malformed(reason="empty record", call_id=None)
    if len(raw) > limits.max_record_bytes:
        return Malformed(reason="record too large", call_id=_probe_call_id(raw))
    try:
        data = json.loads(raw)
    except RecursionError:
        return Malformed(reason="nesting too deep", call_id=_probe_call_id(raw))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return Malformed(reason="not JSON", call_id=_probe_call_id(raw))
    if not isinstance(data, dict):
        return Malformed(reason="not a JSON object", call_id=None)
    raw_id = data.get("call_id")
    call_id = raw_id if isinstance(raw_id, str) and _CALL_ID.match(raw_id) else None
    if call_id is None:
        return Malformed(reason="missing or invalid call_id", call_id=None)
    if data.get("v") != 1:
        return Malformed(reason="unsupported or missing version 'v'", call_id=call_id)
    try:
        return ProposedCall.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "envelope"
        return Malformed(reason=f"invalid envelope field {where}"[:200], call_id=call_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class Glance:
    """What fleet admission reads of a proposed call before validating it
    (streams/admission.py): who asks (the context token, verified there) for which tool, and
    where its refusal goes."""

    call_id: str
    tool: str  # the catalog's name of the tool
    context: str
    reply_to: ReplyAddress | None


# The envelope's fields (a record with any other is malformed: not glanced at).
_ENVELOPE_FIELDS = frozenset(ProposedCall.model_fields)
_CONTEXT_MAX = 8192  # as ProposedCall.context
_NATIVE = CallFormat.NATIVE.value


def glance(raw: bytes | None, catalog: Catalog, limits: Limits) -> Glance | None:
    """A cheap first read of a `calls.proposed` record, for admission to judge it before it
    is validated (a flood is refused without validating each call): None unless the record is
    a JSON object of the envelope's fields, version 1, in the native format, with a valid call
    id, a context token, a catalog tool and no reply address the validator would refuse. A
    record glanced at is validated as any other when admission admits it; one it is not is
    validated first and admitted after (parse_envelope and validate are the judges of
    validity, this is not)."""
    if raw is None or len(raw) > limits.max_record_bytes:
        return None
    try:
        # orjson: a quarter of json's cost, and no more lenient (what it cannot read is left
        # to parse_envelope).
        data = orjson.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("v") != 1 or not data.keys() <= _ENVELOPE_FIELDS:
        return None
    if data.get("format", _NATIVE) != _NATIVE:
        return None
    call_id, name, context = data.get("call_id"), data.get("tool"), data.get("context")
    if not isinstance(call_id, str) or _CALL_ID.match(call_id) is None:
        return None
    if not isinstance(context, str) or not 0 < len(context) <= _CONTEXT_MAX:
        return None
    tool = catalog.get(name) if isinstance(name, str) else None
    if tool is None:
        return None
    reply_to = None
    if data.get("reply_to") is not None:
        try:
            reply_to = ReplyAddress.model_validate(data["reply_to"])
        except ValidationError:
            return None
        if not reply_to.under(limits.reply_namespace):
            return None
    return Glance(call_id=call_id, tool=tool.name, context=context, reply_to=reply_to)


def _tool_and_arguments(call: ProposedCall) -> tuple[str | None, Any, str]:
    """(tool name, raw arguments, JSON path prefix of the arguments) for any format."""
    if call.format is CallFormat.NATIVE:
        return call.tool, call.arguments, "$.arguments"
    body = call.call or {}
    if call.format is CallFormat.OPENAI:
        function = body.get("function")
        if not isinstance(function, dict):
            return None, None, "$.call.function"
        return function.get("name"), function.get("arguments"), "$.call.function.arguments"
    if call.format is CallFormat.ANTHROPIC:
        return body.get("name"), body.get("input"), "$.call.input"
    return body.get("name"), body.get("arguments"), "$.call.arguments"


def _json_path(prefix: str, loc: tuple[int | str, ...]) -> str:
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


_PROBLEMS = {
    "missing": "required field is missing",
    "extra_forbidden": "unexpected field",
    "int_type": "must be an integer",
    "string_type": "must be a string",
    "bool_type": "must be a boolean",
    "string_pattern_mismatch": "does not match the required pattern",
    "string_too_long": "is too long",
    "string_too_short": "is too short",
    "greater_than": "is too small",
    "greater_than_equal": "is too small",
    "less_than": "is too large",
    "less_than_equal": "is too large",
    "literal_error": "is not one of the allowed values",
    "enum": "is not one of the allowed values",
}


def _problems(prefix: str, exc: ValidationError) -> tuple[FieldProblem, ...]:
    problems = []
    for error in exc.errors(include_url=False, include_input=False)[:MAX_FIELD_PROBLEMS]:
        text = _PROBLEMS.get(error["type"], error["msg"])
        problems.append(
            FieldProblem(path=_json_path(prefix, error["loc"])[:256], problem=text[:200])
        )
    return tuple(problems)


def validate(call: ProposedCall, catalog: Catalog, limits: Limits) -> Validated | Rejection:
    """Decide whether ``call`` names a known tool with schema-valid arguments, and a reply
    address (if any) that ratifier may write to."""
    if call.reply_to is not None and not call.reply_to.under(limits.reply_namespace):
        # An agent must not make ratifier write into any other topic.
        return Rejection(
            call=call,
            tool_name=(call.tool or "")[:128],
            code=ErrorCode.INVALID_REPLY_ADDRESS,
            fields=(
                FieldProblem(
                    path="$.reply_to.topic",
                    problem=f"must start with {limits.reply_namespace}"[:200],
                ),
            ),
        )
    name, arguments, prefix = _tool_and_arguments(call)
    shown_name = name if isinstance(name, str) else ""
    tool = catalog.get(name) if isinstance(name, str) else None
    if tool is None:
        return Rejection(call=call, tool_name=shown_name[:128], code=ErrorCode.UNKNOWN_TOOL)

    def reject(problem: str, path: str = prefix) -> Rejection:
        return Rejection(
            call=call,
            tool_name=tool.name,
            code=ErrorCode.INVALID_ARGUMENTS,
            fields=(FieldProblem(path=path, problem=problem),),
        )

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except RecursionError:
            return reject("nesting is too deep")
        except ValueError:
            return reject("is not valid JSON")
    if not isinstance(arguments, dict):
        return reject("must be a JSON object")
    depth, longest = _depth_and_longest_string(arguments)
    if depth > limits.max_nesting_depth:
        return reject("nesting is too deep")
    if longest > limits.max_string_length:
        return reject("contains a string that is too long")
    try:
        parsed = tool.arguments.model_validate(arguments, strict=True)
    except ValidationError as exc:
        return Rejection(
            call=call,
            tool_name=tool.name,
            code=ErrorCode.INVALID_ARGUMENTS,
            fields=_problems(prefix, exc),
        )
    return Validated(
        call=call, tool=tool, arguments=parsed, normalized=parsed.model_dump(mode="json")
    )
