"""`ratifier keys generate`: the key material a deployment needs outside development mode
(docs/operations.md, "Secrets and keys"), written once into a directory of its own.

* ``approval-signing-key.pem``: the service's Ed25519 private key (PKCS#8 PEM); signs
  decisions and receipts (`approvals.signing`).
* ``service-jwks.json``: its public key under the kid, for verifiers and rotation.
* ``context-secret``: the HS256 secret of context tokens (when the deployment uses HS256).
* ``audit-salt``: keys the audit's pseudonyms of masked values.
* ``ratifier.env``: the ``RATIFIER_*`` settings naming all of it (compose ``env_file``,
  ``kubectl create secret generic --from-env-file``).

Every file is created with mode 0600 in a 0700 directory; existing files are not overwritten
unless asked."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from schemas.errors import ConfigurationError

SIGNING_KEY_FILE = "approval-signing-key.pem"
SERVICE_JWKS_FILE = "service-jwks.json"
CONTEXT_SECRET_FILE = "context-secret"  # noqa: S105 - a file name
AUDIT_SALT_FILE = "audit-salt"
ENV_FILE = "ratifier.env"
FILES = (SIGNING_KEY_FILE, SERVICE_JWKS_FILE, CONTEXT_SECRET_FILE, AUDIT_SALT_FILE, ENV_FILE)


@dataclass(frozen=True, kw_only=True)
class GeneratedKeys:
    directory: Path
    kid: str
    # RATIFIER_* → value, as the services see it (file paths under ``mounted_at``).
    settings: dict[str, str]


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _write_private(path: Path, data: bytes, *, overwrite: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        raise ConfigurationError(f"{path} exists; keep it, or pass --force to replace") from exc
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # also when it existed, and whatever the umask
        file.write(data)


def service_jwks(key: ed25519.Ed25519PrivateKey, kid: str) -> dict[str, object]:
    """The public JWKS of one Ed25519 service key (`approvals.signing` reads it)."""
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    entry = {"kty": "OKP", "crv": "Ed25519", "x": _b64url(public), "kid": kid, "alg": "EdDSA"}
    return {"keys": [{**entry, "use": "sig"}]}


def generate_keys(
    out: Path, *, mounted_at: str | None = None, kid: str | None = None, force: bool = False
) -> GeneratedKeys:
    """Write fresh key material into ``out``. ``mounted_at``: where the services will see
    these files (a container's mount point); default ``out`` itself."""
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not force:
        existing = [name for name in FILES if (out / name).exists()]
        if existing:
            raise ConfigurationError(
                f"{out} already holds {', '.join(existing)}; keep them, or pass --force"
            )
    kid = kid or f"ratifier-approvals-{datetime.now(UTC):%Y%m%d%H%M%S}"
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    context_secret = secrets.token_urlsafe(48)
    audit_salt = secrets.token_urlsafe(32)
    base = (mounted_at or str(out.resolve())).rstrip("/")
    settings = {
        "RATIFIER_APPROVALS__SIGNING_KEY_FILE": f"{base}/{SIGNING_KEY_FILE}",
        "RATIFIER_APPROVALS__SIGNING_KID": kid,
        "RATIFIER_APPROVALS__SERVICE_JWKS_FILE": f"{base}/{SERVICE_JWKS_FILE}",
        "RATIFIER_CONTEXT__SECRET": context_secret,
        "RATIFIER_AUDIT_SALT": audit_salt,
    }
    _write_private(out / SIGNING_KEY_FILE, pem, overwrite=force)
    jwks = json.dumps(service_jwks(key, kid), indent=2) + "\n"
    _write_private(out / SERVICE_JWKS_FILE, jwks.encode(), overwrite=force)
    _write_private(out / CONTEXT_SECRET_FILE, context_secret.encode(), overwrite=force)
    _write_private(out / AUDIT_SALT_FILE, audit_salt.encode(), overwrite=force)
    env = "".join(f"{name}={value}\n" for name, value in settings.items())
    _write_private(out / ENV_FILE, env.encode(), overwrite=force)
    return GeneratedKeys(directory=out, kid=kid, settings=settings)


def exports(generated: GeneratedKeys) -> str:
    """Shell lines that set the settings (``eval "$(ratifier keys generate --out DIR)"``);
    secret values are read from their files, never printed."""
    local = generated.directory.resolve()
    by_file = {
        "RATIFIER_CONTEXT__SECRET": local / CONTEXT_SECRET_FILE,
        "RATIFIER_AUDIT_SALT": local / AUDIT_SALT_FILE,
    }
    lines = [f"# ratifier keys written to {local} (mode 0600); {ENV_FILE} holds them all"]
    for name, value in generated.settings.items():
        shown = f'"$(cat {shlex.quote(str(by_file[name]))})"' if name in by_file else value
        shown = shown if name in by_file else shlex.quote(value)
        lines.append(f"export {name}={shown}")
    return "\n".join(lines) + "\n"
