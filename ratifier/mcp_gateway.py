"""`ratifier mcp`: the catalog served over MCP, every call through the pipeline.

- ``tools/list`` is the catalog (the same definitions as
  ``ratifier catalog export --format mcp``), plus ``ratifier_call_status`` to ask again about
  a call that is still pending.
- ``tools/call`` publishes the call to ``calls.proposed`` with the MCP client's bearer token as
  its signed context: the token is verified here as an OAuth resource server would (signature,
  audience, issuer, expiry; `runtime.identity`) and again by the authorizer. Identity never
  comes from ``_meta`` or the arguments. The answer is the call's final outcome rendered as a
  ``CallToolResult`` (`schemas.providers`): refusals are ``isError`` with the code and the
  message that is safe to show the model. The gateway's own refusals (no verified token, a
  status question about a call that is not the caller's) have the same shape.
- A call that waits for the end user's confirmation (the approval request's ``subject`` is
  the caller) asks the user through MCP elicitation when the client supports it: with the
  handshake protocols a form ``elicitation/create`` request on the session, with 2026-07-28 an
  ``InputRequiredResult`` whose input request is that form and whose ``request_state`` is the
  call id (the client retries ``tools/call`` with the answer). Accept publishes the user's
  signed confirmation through the approval API (``POST /confirmations/{call_id}`` with the
  caller's own bearer token; the approval service verifies and signs it), decline a refusal;
  the tool call then answers with the final outcome. Cancel, no elicitation support, or a
  call that waits for staff: a pending result naming the call id, and
  ``ratifier_call_status`` answers with the final outcome once there is one.

Over streamable HTTP the bearer token is required on every request (401 without it). Over
stdio (a local client that starts this process) the token comes from ``--context-token-file``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette

from commands.catalog import Catalog
from commands.export import ExportFormat, export_catalog
from ratifier_client.adapters.confirmation import ConfirmationApi, ConfirmationRefused
from ratifier_client.client import Pending, RatifierClient
from runtime.identity import ContextKeys, verify_context_token
from schemas.envelopes import ErrorInfo, Outcome, Stage, Status
from schemas.errors import ErrorCode, Unauthenticated
from schemas.providers import to_mcp_call_tool_result

log = logging.getLogger("ratifier.mcp")

STATUS_TOOL = "ratifier_call_status"
CONFIRM_INPUT = "confirm"  # the key of the confirmation form among the input requests
CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "confirm": {
            "type": "boolean",
            "title": "Confirm",
            "description": "Confirm exactly this action",
        }
    },
    "required": ["confirm"],
}
SERVER_NAME = "ratifier"


class ContextTokenVerifier:
    """The MCP SDK's token verifier: a bearer token is accepted when it is a valid signed
    context token (the agent runtime's), and names its subject and tenant."""

    def __init__(self, keys: ContextKeys) -> None:
        self._keys = keys

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            actor = verify_context_token(token, self._keys)
        except Unauthenticated:
            return None
        return AccessToken(
            token=token,
            client_id=actor.sub,
            scopes=[],
            subject=actor.sub,
            claims={"tenant": actor.tenant, "roles": list(actor.roles)},
        )


@dataclass
class McpGateway:
    """The MCP handlers over one `RatifierClient`."""

    catalog: Catalog
    client: RatifierClient
    keys: ContextKeys
    wait_seconds: float = 30.0
    # For stdio: the context token of the local user, read at start.
    fixed_context: str | None = None
    # Where end users confirm (the streams worker's approval API); None: no elicitation.
    confirmations: ConfirmationApi | None = None
    # Calls this gateway published, by id, with the principal (tenant/subject) that may ask
    # about them.
    _owners: dict[str, str] = field(default_factory=dict)

    def tools(self) -> list[types.Tool]:
        listed = export_catalog(self.catalog, ExportFormat.MCP)
        assert isinstance(listed, list)
        tools = [
            types.Tool(
                name=entry["name"],
                description=entry["description"],
                input_schema=entry["inputSchema"],
                annotations=types.ToolAnnotations(
                    read_only_hint=entry["annotations"].get("readOnlyHint"),
                    destructive_hint=entry["annotations"].get("destructiveHint"),
                ),
            )
            for entry in listed
        ]
        tools.append(
            types.Tool(
                name=STATUS_TOOL,
                description=(
                    "The outcome of a call that was still pending (for example waiting for "
                    "approval): pass the call_id the pending answer named."
                ),
                input_schema={
                    "type": "object",
                    "properties": {"call_id": {"type": "string"}},
                    "required": ["call_id"],
                    "additionalProperties": False,
                },
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        return tools

    def _principal(self) -> tuple[str, str, str] | None:
        """The verified context token of this request, its principal and subject, or None."""
        access = get_access_token()
        token = access.token if access is not None else self.fixed_context
        if token is None:
            return None
        try:
            actor = verify_context_token(token, self.keys)
        except Unauthenticated:
            return None
        return token, f"{actor.tenant}/{actor.sub}", actor.sub

    async def list_tools(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        principal = self._principal()
        if principal is None:
            return _refusal(
                ErrorCode.UNAUTHENTICATED,
                "No verified context token came with this call.",
                tool=params.name,
            )
        context, owner, subject = principal
        arguments: Mapping[str, Any] = params.arguments or {}
        if params.name == STATUS_TOOL:
            return await self._status(str(arguments.get("call_id", "")), owner)
        if params.request_state is not None:
            # 2026-07-28: the retry carrying the user's answer to our confirmation form.
            return await self._confirmed(params, context, owner)
        # A `rate_limited` refusal is proposed again after its retry_after while the wait
        # allows; the last one is answered as an error result naming retry_after.
        handle = await self.client.submit_admitted(
            params.name, arguments, context=context, within=self.wait_seconds
        )
        self._owners[handle.call_id] = owner
        waiting = await self.client.wait(handle.call_id, within=0.05)
        if isinstance(waiting, Pending) and self._user_confirms(ctx, waiting, subject):
            return await self._elicit(ctx, waiting, context)
        return await self._answer(handle.call_id)

    def _user_confirms(self, ctx: ServerRequestContext[Any], pending: Pending, sub: str) -> bool:
        """Whether to ask the caller to confirm: the call waits for its subject, who is the
        caller, and the client can show a form."""
        return (
            self.confirmations is not None
            and pending.status is Status.AWAITING_APPROVAL
            and pending.approval is not None
            and pending.approval.subject == sub
            and ctx.session.check_client_capability(
                types.ClientCapabilities(elicitation=types.ElicitationCapability())
            )
        )

    async def _elicit(
        self, ctx: ServerRequestContext[Any], pending: Pending, context: str
    ) -> types.CallToolResult | types.InputRequiredResult:
        assert pending.approval is not None
        message = "Confirm this action:\n" + "\n".join(pending.approval.preview)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            form = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=message, requested_schema=CONFIRM_SCHEMA
                )
            )
            return types.InputRequiredResult(
                input_requests={CONFIRM_INPUT: form}, request_state=pending.call_id
            )
        try:
            answer = await ctx.session.elicit_form(
                message, CONFIRM_SCHEMA, related_request_id=ctx.request_id
            )
        except MCPError:
            log.warning("elicitation failed for %s; answering pending", pending.call_id)
            return await self._answer(pending.call_id)
        return await self._decide(pending.call_id, answer, context)

    async def _confirmed(
        self, params: types.CallToolRequestParams, context: str, owner: str
    ) -> types.CallToolResult:
        call_id = params.request_state or ""
        if self._owners.get(call_id) != owner:
            return _not_yours(call_id, tool=params.name)
        answer = (params.input_responses or {}).get(CONFIRM_INPUT)
        if not isinstance(answer, types.ElicitResult):
            return await self._answer(call_id)
        return await self._decide(call_id, answer, context)

    async def _decide(
        self, call_id: str, answer: types.ElicitResult, context: str
    ) -> types.CallToolResult:
        """The user's answer to the form, as their signed confirmation; then the outcome."""
        if answer.action == "cancel" or self.confirmations is None:
            return await self._answer(call_id)  # no decision: still pending
        approve = answer.action == "accept" and bool((answer.content or {}).get("confirm"))
        try:
            await self.confirmations.confirm(
                call_id,
                user_token=context,
                approve=approve,
                reason=None if approve else "declined by the user",
            )
        except (ConfirmationRefused, OSError) as exc:
            log.warning("confirmation of %s not accepted: %s", call_id, exc)
        return await self._answer(call_id, wait_final=True)

    async def _status(self, call_id: str, owner: str) -> types.CallToolResult:
        if self._owners.get(call_id) != owner:
            # Same answer for a call of someone else and a call that never existed.
            return _not_yours(call_id, tool=STATUS_TOOL)
        return await self._answer(call_id)

    async def _answer(self, call_id: str, *, wait_final: bool = False) -> types.CallToolResult:
        # Answer as soon as the call is final or waits for a human, whichever comes first
        # (after a confirmation: when it is final).
        if wait_final:
            outcome = await self.client.wait(call_id, within=self.wait_seconds)
        else:
            await self.client.awaiting_approval(call_id, within=self.wait_seconds)
            outcome = await self.client.wait(call_id, within=0.05)
        if isinstance(outcome, Pending):
            return _pending(outcome)
        self.client.forget(call_id)
        self._owners.pop(call_id, None)
        return _rendered(outcome)

    def server(self) -> Server[Any]:
        return Server(
            SERVER_NAME,
            version="1",
            instructions=(
                "Tool calls are checked by ratifier: schema, policy and, for risky effects, "
                "human approval. A refusal says why; a pending call names its call_id: ask "
                f"{STATUS_TOOL} later."
            ),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    def http_app(self, *, resource_url: str, issuer_url: str) -> Starlette:
        """The streamable-HTTP app at ``/mcp``; every request needs a bearer context token."""
        return self.server().streamable_http_app(
            streamable_http_path="/mcp",
            auth=AuthSettings(issuer_url=issuer_url, resource_server_url=resource_url),
            token_verifier=ContextTokenVerifier(self.keys),
        )


def _rendered(outcome: Outcome) -> types.CallToolResult:
    result = to_mcp_call_tool_result(outcome)
    return types.CallToolResult.model_validate(result)


def _pending(pending: Pending) -> types.CallToolResult:
    waiting = pending.status is Status.AWAITING_APPROVAL
    body: dict[str, Any] = {
        "status": pending.status.value if pending.status else "pending",
        "call_id": pending.call_id,
        "ask_again_with": STATUS_TOOL,
    }
    if pending.approval is not None:
        body["preview"] = list(pending.approval.preview)
        body["expires_at"] = pending.approval.expires_at.isoformat()
    text = (
        f"Waiting for approval; call {pending.call_id}. Ask {STATUS_TOOL} later."
        if waiting
        else f"Still in progress; call {pending.call_id}. Ask {STATUS_TOOL} later."
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text + "\n" + json.dumps(body))],
        structured_content=body,
        is_error=False,
    )


def _refusal(
    code: ErrorCode, message: str, *, tool: str, call_id: str | None = None
) -> types.CallToolResult:
    """A refusal of the gateway's own, in the shape of every refusal the pipeline answers
    (`schemas.providers`): status ``denied`` as the authorizer answers the same codes, the
    code and the safe message; ``call_id`` is the call asked about, if any."""
    refused = Outcome.for_call(
        call_id="gateway-refusal",  # not rendered: replaced below
        tool=tool,
        tenant=None,
        status=Status.DENIED,
        stage=Stage.VALIDATE,
        error=ErrorInfo.of(code, message),
        at=datetime.now(UTC),
    )
    result = to_mcp_call_tool_result(refused)
    result["structuredContent"]["call_id"] = call_id or None
    return types.CallToolResult.model_validate(result)


def _not_yours(call_id: str, *, tool: str) -> types.CallToolResult:
    return _refusal(
        ErrorCode.NOT_FOUND,
        "No call with this id is pending for you.",
        tool=tool,
        call_id=call_id,
    )


async def serve_http(gateway: McpGateway, *, host: str, port: int, issuer_url: str | None) -> None:
    """Serve streamable HTTP on ``host:port`` until cancelled (SIGINT/SIGTERM)."""
    import uvicorn  # noqa: PLC0415 - only the HTTP transport needs it

    resource_url = f"http://{host}:{port}/mcp"
    app = gateway.http_app(resource_url=resource_url, issuer_url=issuer_url or resource_url)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    log.info("mcp gateway listening on %s", resource_url)
    await server.serve()


async def serve_stdio(gateway: McpGateway) -> None:
    """Serve one local client over stdin/stdout."""
    from mcp.server.stdio import stdio_server  # noqa: PLC0415 - only the stdio transport

    server = gateway.server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
