"""Masking what must never reach the audit store in clear. Pure: values in, values out.

- Catalog secret fields (`commands.catalog.Secret()`, `Tool.secret_fields`): every object key
  that names a secret field of any tool in the catalog — compared without case, ``_`` or
  ``-`` — has its value replaced by the catalog's salted hash (`salted_hash`), wherever it
  sits: tool arguments, an approval's edited arguments, a provider ``call`` object, a dead
  letter's raw payload, or a string that holds JSON (OpenAI sends arguments that way).
  Masking by name across the whole catalog over-masks a same-named field of another tool;
  that is the safe side.
- A string that looks like JSON but does not parse and mentions a secret field name (a
  half-written arguments string) is hashed whole: its secret cannot be located, so none of
  it is kept.
- Bearer tokens (compact JWS: the agent's ``context``, the approver's token, or one passed
  anywhere else) are credentials: each becomes ``{"token": "masked", "sha256": ...}`` plus,
  when the token verifies, the identity it proves (``sub``, ``tenant``, ``roles``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from commands.catalog import Catalog, salted_hash
from schemas.envelopes import Actor

# A compact JWS: base64url JSON header ("eyJ" = '{"'), payload and signature.
_JWS = re.compile(r"^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
# The masked form the approval-join already gives secret fields in requests and previews.
ALREADY_MASKED = "***"
# Strings longer than this are not parsed as embedded JSON (they are still checked for
# secret field names).
_MAX_EMBEDDED_JSON = 256 * 1024

TokenVerifier = Callable[[str], Actor | None]


def normalized(name: str) -> str:
    return re.sub(r"[_\-\s]", "", name).lower()


@dataclass(frozen=True, kw_only=True)
class Masker:
    """Masks secret fields (by normalized name) and bearer tokens in JSON values."""

    secret_names: frozenset[str]
    salt: str
    verify: TokenVerifier | None = None

    @classmethod
    def for_catalog(
        cls, catalog: Catalog, *, salt: str, verify: TokenVerifier | None = None
    ) -> Masker:
        names: Iterable[str] = (name for tool in catalog for name in tool.secret_fields)
        return cls(secret_names=frozenset(normalized(n) for n in names), salt=salt, verify=verify)

    def is_secret(self, key: str) -> bool:
        return normalized(key) in self.secret_names

    def secret(self, value: Any) -> Any:
        """The masked form of a secret field's value."""
        if value is None or value == ALREADY_MASKED:
            return value
        return salted_hash(value, self.salt)

    def token(self, token: str) -> dict[str, Any]:
        masked: dict[str, Any] = {"token": "masked", "sha256": salted_hash(token, self.salt)}
        actor = self.verify(token) if self.verify is not None else None
        if actor is None:
            masked["verified"] = False
        else:
            masked.update(verified=True, sub=actor.sub, tenant=actor.tenant, roles=actor.roles)
        return masked

    def mask(self, value: Any) -> Any:
        """``value`` (a parsed JSON value) with secrets masked. Raises RecursionError on
        absurd nesting (the caller stores such a record as unparseable)."""
        if isinstance(value, dict):
            return {
                key: self.secret(item) if self.is_secret(key) else self.mask(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.mask(item) for item in value]
        if isinstance(value, str):
            return self._text(value)
        return value

    def _text(self, text: str) -> Any:
        if _JWS.match(text):
            return self.token(text)
        stripped = text.strip()
        if stripped[:1] in ("{", "[") and len(stripped) <= _MAX_EMBEDDED_JSON:
            try:
                embedded = json.loads(stripped, parse_constant=reject_constant)
            except (ValueError, RecursionError):
                embedded = None
            if isinstance(embedded, dict | list):
                masked = self.mask(embedded)
                return text if masked == embedded else json.dumps(masked, ensure_ascii=False)
            if self._mentions_secret(text):
                return salted_hash(text, self.salt)
        return text

    def _mentions_secret(self, text: str) -> bool:
        folded = normalized(text)
        return any(name in folded for name in self.secret_names)


def reject_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (and PostgreSQL's jsonb refuses them)."""
    raise ValueError(f"not JSON: {name}")
