"""Secure by default: outside development mode no built-in key is accepted, `ratifier keys
generate` writes what a start needs, and an unknown RATIFIER_* variable stops every entry
point with the closest valid name (docs/operations.md, "Secrets and keys", "Settings")."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from approvals.signing import approval_keys, sign_decision, statement_for, verify_decision
from config.settings import (
    DEVELOPMENT_MODE_ENV,
    LOCAL_DEPLOYMENT_VARIABLES,
    REMOVED_SETTINGS,
    RENAMED_SETTINGS,
    Settings,
    check_environment,
    unknown_settings,
)
from ratifier.cli import build_parser, main, start_settings
from ratifier.demo import worker_env
from ratifier.keys import (
    AUDIT_SALT_FILE,
    CONTEXT_SECRET_FILE,
    ENV_FILE,
    FILES,
    SERVICE_JWKS_FILE,
    SIGNING_KEY_FILE,
    generate_keys,
)
from runtime.identity import context_keys, issue_context_token, verify_context_token
from schemas.envelopes import Actor, ApprovalVerdict
from schemas.errors import ConfigurationError, MissingKeyMaterial, UnknownSetting

REPO = Path(__file__).resolve().parents[2]
KEY_SETTINGS = {
    "RATIFIER_CONTEXT__SECRET",
    "RATIFIER_APPROVALS__SIGNING_KEY_FILE",
    "RATIFIER_AUDIT_SALT",
}


@pytest.fixture
def production_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment without any RATIFIER_* variable (no development mode)."""
    for name in list(os.environ):
        if name.upper().startswith("RATIFIER_"):
            monkeypatch.delenv(name)


def clean_env(**settings: str) -> dict[str, str]:
    """A child's environment with nothing of ours but ``settings``."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **settings}


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratifier.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- key material ------------------------------------------------------------------------


@pytest.mark.usefixtures("production_env")
def test_defaults_outside_development_mode_lack_every_key() -> None:
    settings = Settings()
    assert settings.development_mode is False
    assert set(settings.missing_key_material()) == KEY_SETTINGS
    with pytest.raises(MissingKeyMaterial) as refused:
        settings.require_key_material()
    for name in KEY_SETTINGS:
        assert name in refused.value.safe_message
    assert DEVELOPMENT_MODE_ENV in refused.value.safe_message


@pytest.mark.usefixtures("production_env")
def test_development_mode_accepts_the_built_in_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVELOPMENT_MODE_ENV, "true")
    settings = Settings()
    assert settings.development_mode is True
    assert settings.missing_key_material() == ()
    settings.require_key_material()
    assert approval_keys(settings).kid == settings.approvals.signing_kid
    assert context_keys(settings).secret == settings.context.secret


@pytest.mark.usefixtures("production_env")
def test_key_loaders_refuse_the_built_in_keys_outside_development_mode() -> None:
    """Defence in depth: a library caller that skipped the start check gets no public key."""
    settings = Settings()
    with pytest.raises(MissingKeyMaterial, match="RATIFIER_APPROVALS__SIGNING_KEY_FILE"):
        approval_keys(settings)
    with pytest.raises(MissingKeyMaterial, match="RATIFIER_CONTEXT__SECRET"):
        context_keys(settings)


@pytest.mark.usefixtures("production_env")
def test_jwks_only_context_needs_no_secret_but_hs256_without_jwks_is_missing() -> None:
    jwks_only = Settings(context={"hs256": False, "jwks_file": "/etc/jwks.json"})
    assert "RATIFIER_CONTEXT__SECRET" not in jwks_only.missing_key_material()
    neither = Settings(context={"hs256": False})
    assert "RATIFIER_CONTEXT__JWKS_FILE" in neither.missing_key_material()
    # A JWKS does not make the public HS256 secret safe: HS256 still accepts it.
    both = Settings(context={"jwks_file": "/etc/jwks.json"})
    assert "RATIFIER_CONTEXT__SECRET" in both.missing_key_material()


# -- ratifier keys generate --------------------------------------------------------------


@pytest.mark.usefixtures("production_env")
def test_generated_keys_are_private_and_make_a_start_possible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "keys"
    generated = generate_keys(out, kid="test-kid-1")
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for name in FILES:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert (out / SIGNING_KEY_FILE).read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert '"d"' not in (out / SERVICE_JWKS_FILE).read_text()  # public only
    env_lines = (out / ENV_FILE).read_text().splitlines()
    assert dict(line.split("=", 1) for line in env_lines) == generated.settings
    assert generated.settings["RATIFIER_CONTEXT__SECRET"] == (out / CONTEXT_SECRET_FILE).read_text()
    assert generated.settings["RATIFIER_AUDIT_SALT"] == (out / AUDIT_SALT_FILE).read_text()

    for name, value in generated.settings.items():
        monkeypatch.setenv(name, value)
    check_environment()
    settings = Settings()
    assert settings.development_mode is False
    assert settings.missing_key_material() == ()
    settings.require_key_material()

    # The keys load: a decision signed with the generated key verifies (also by a verifier
    # that trusts only the generated JWKS), and a token with the generated secret verifies.
    keys = approval_keys(settings)
    assert keys.kid == "test-kid-1" and keys.algorithm == "EdDSA"
    now = datetime.now(UTC)
    statement = statement_for(
        call_id="c-1",
        tenant="tenant-a",
        fingerprint="f" * 64,
        approver=Actor(sub="alice", tenant="tenant-a", roles=("approver",)),
        verdict=ApprovalVerdict.APPROVE,
        now=now,
        validity=timedelta(minutes=5),
    )
    decision = sign_decision(statement, keys)
    verified = verify_decision(decision, kafka_key="c-1", keys=keys, now=now)
    assert not isinstance(verified, str) and verified.statement == statement
    other = generate_keys(tmp_path / "other", kid="test-kid-1")
    monkeypatch.setenv(
        "RATIFIER_APPROVALS__SIGNING_KEY_FILE",
        other.settings["RATIFIER_APPROVALS__SIGNING_KEY_FILE"],
    )
    monkeypatch.setenv("RATIFIER_APPROVALS__SIGNING_KID", "other-kid")
    verifier = approval_keys(Settings())  # trusts test-kid-1 only through the generated JWKS
    assert verify_decision(decision, kafka_key="c-1", keys=verifier, now=now) == verified
    tokens = context_keys(settings)
    token = issue_context_token(tokens, sub="agent-1", tenant="tenant-a")
    assert verify_context_token(token, tokens).sub == "agent-1"


def test_generate_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    first = generate_keys(tmp_path, kid="k1")
    with pytest.raises(ConfigurationError, match="--force"):
        generate_keys(tmp_path, kid="k2")
    assert (tmp_path / SIGNING_KEY_FILE).read_text() != ""
    second = generate_keys(tmp_path, kid="k2", force=True, mounted_at="/etc/ratifier/keys")
    assert second.settings["RATIFIER_CONTEXT__SECRET"] != first.settings["RATIFIER_CONTEXT__SECRET"]
    assert second.settings["RATIFIER_APPROVALS__SIGNING_KEY_FILE"] == (
        "/etc/ratifier/keys/approval-signing-key.pem"
    )
    assert stat.S_IMODE((tmp_path / ENV_FILE).stat().st_mode) == 0o600


# -- unknown settings --------------------------------------------------------------------


def test_renamed_settings_name_their_new_name() -> None:
    problems = unknown_settings({"RATIFIER_DATABASE_URL": "postgresql://x", "PATH": "/bin"})
    assert problems == ["RATIFIER_DATABASE_URL was renamed to RATIFIER_STORAGE__DATABASE_URL"]
    for old in ("RATIFIER_POLICY_DIR", "RATIFIER_HTTP_PORT", "RATIFIER_APPROVAL_TTL_SECONDS"):
        (problem,) = unknown_settings({old: "1"})
        assert problem == f"{old} was renamed to {RENAMED_SETTINGS[old]}"
    # Every new name is a real setting.
    assert set(RENAMED_SETTINGS.values()) <= Settings.environment_names()


def test_a_misspelt_setting_names_the_closest_valid_one() -> None:
    (problem,) = unknown_settings({"RATIFIER_STORAGE__DATABSE_URL": "x"})
    assert problem == (
        "RATIFIER_STORAGE__DATABSE_URL is not a setting; did you mean "
        "RATIFIER_STORAGE__DATABASE_URL?"
    )
    (problem,) = unknown_settings({"RATIFIER_KAFKA_SASL_PASSWORD": "x"})
    assert problem.endswith("did you mean RATIFIER_KAFKA__SASL_PASSWORD?")
    with pytest.raises(UnknownSetting, match="RATIFIER_DEVELOPMENT_MODE"):
        check_environment({"RATIFIER_DEVELOPMENT_MOD": "true"})


def test_valid_settings_and_harness_knobs_pass() -> None:
    environ = {name: "x" for name in Settings.environment_names()}
    environ |= {name: "x" for name in LOCAL_DEPLOYMENT_VARIABLES}
    environ |= {
        "RATIFIER_TEST_DATABASE_URL": "x",
        "RATIFIER_TEST_ARTIFACTS": "x",
        "RATIFIER_FUZZ_EXAMPLES": "1",
        "RATIFIER_FUZZ_KAFKA_RECORDS": "1",
        "RATIFIER_CHAOS_SECONDS": "1",
        "RATIFIER_SOAK_SECONDS": "1",
        "RATIFIER_BENCH_DATABASE_URL": "x",
        "RATIFIER_BIN": "ratifier",
        "HOME": "/root",
    }
    assert unknown_settings(environ) == []
    check_environment(environ)


def test_every_ratifier_variable_the_repository_sets_is_known() -> None:
    """CI, the demo, deploy/local and the suites keep working: every RATIFIER_* name written
    anywhere in the repository is a setting, a renamed one (docs), or a harness knob."""
    import re

    found: set[str] = set()
    for pattern in ("**/*.py", "**/*.sh", "**/*.yaml", "Makefile", "deploy/local/*", ".ci/*"):
        for path in REPO.glob(pattern):
            if ".venv" in path.parts or not path.is_file():
                continue
            found |= set(re.findall(r"\bRATIFIER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8")))
    # The old names of the docs and of this file's tests are meant to be refused.
    found -= (
        set(RENAMED_SETTINGS)
        | set(REMOVED_SETTINGS)
        | {
            "RATIFIER_KAFKA_SASL_PASSWORD",
            "RATIFIER_STORAGE__DATABSE_URL",
            "RATIFIER_DEVELOPMENT_MOD",
            "RATIFIER_EXECUTOR__RETRY_ATEMPTS",
        }
    )
    assert unknown_settings(dict.fromkeys(found, "x")) == []


# -- every entry point -------------------------------------------------------------------


@pytest.mark.usefixtures("production_env")
def test_cli_main_refuses_an_unknown_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DEVELOPMENT_MODE_ENV, "true")
    monkeypatch.setenv("RATIFIER_POLICY_DIR", "/tmp/policies")
    assert main(["token", "--tenant", "t", "--sub", "u"]) == 2
    err = capsys.readouterr().err
    assert "RATIFIER_POLICY_DIR was renamed to RATIFIER_POLICIES__DIRECTORY" in err


def test_executor_without_key_material_exits_naming_the_missing_settings() -> None:
    done = run_cli("executor", env=clean_env())
    assert done.returncode == 2, done.stderr
    assert "ratifier executor: no key material for" in done.stderr
    for name in KEY_SETTINGS:
        assert name in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["streams"],
        ["stages"],
        ["approval-join"],
        ["executor"],
        ["reconciler"],
        ["audit", "sink"],
        ["dashboard"],
        ["mcp"],
        ["approvals", "list"],
        ["token", "--tenant", "t", "--sub", "u"],
        ["policy", "replay", "--policies", "x"],
    ],
)
@pytest.mark.usefixtures("production_env")
def test_every_keyed_entry_point_refuses_to_start_without_keys(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"ratifier {command[0]}: no key material for" in err
    assert "RATIFIER_APPROVALS__SIGNING_KEY_FILE" in err


@pytest.mark.usefixtures("production_env")
def test_keyless_commands_start_without_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "schema"]) == 0
    assert "no key material" not in capsys.readouterr().err


def test_an_unknown_variable_stops_the_executor_with_the_closest_name() -> None:
    done = run_cli(
        "executor",
        env=clean_env(RATIFIER_DEVELOPMENT_MODE="true", RATIFIER_EXECUTOR__RETRY_ATEMPTS="3"),
    )
    assert done.returncode == 2, done.stderr
    assert (
        "RATIFIER_EXECUTOR__RETRY_ATEMPTS is not a setting; did you mean "
        "RATIFIER_EXECUTOR__RETRY_ATTEMPTS?"
    ) in done.stderr


def test_the_crash_test_entry_point_checks_too() -> None:
    """`python -m testsupport.crashing` (spawned by the e2e suite) runs the same start."""
    done = subprocess.run(
        [sys.executable, "-m", "testsupport.crashing", "after_effect:1", "executor"],
        env=clean_env(RATIFIER_DATABASE_URL="postgresql://x"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "RATIFIER_DATABASE_URL was renamed to RATIFIER_STORAGE__DATABASE_URL" in done.stderr


def test_generated_keys_start_a_command_outside_development_mode(tmp_path: Path) -> None:
    done = run_cli("keys", "generate", "--out", str(tmp_path / "k"), env=clean_env())
    assert done.returncode == 0, done.stderr
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in done.stdout.splitlines()
        if line.startswith("export ")
    )
    assert set(exported) >= KEY_SETTINGS
    assert "$(cat " in exported["RATIFIER_CONTEXT__SECRET"]  # the secret is not printed
    generated = dict(
        line.split("=", 1) for line in (tmp_path / "k" / ENV_FILE).read_text().splitlines()
    )
    assert generated["RATIFIER_CONTEXT__SECRET"] not in done.stdout
    token = run_cli("token", "--tenant", "t", "--sub", "u", env=clean_env(**generated))
    assert token.returncode == 0, token.stderr
    assert token.stdout.count(".") == 2  # a JWS
    assert "development mode" not in token.stderr


def test_development_mode_warns_at_start() -> None:
    done = run_cli(
        "token", "--tenant", "t", "--sub", "u", env=clean_env(RATIFIER_DEVELOPMENT_MODE="true")
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING ratifier: development mode is on" in done.stderr


@pytest.mark.usefixtures("production_env")
def test_the_demo_runs_in_development_mode_with_zero_config() -> None:
    """`make demo` / `ratifier demo` need no configuration: the demo and its workers are in
    development mode even when the shell is not."""
    settings = start_settings(build_parser().parse_args(["demo"]))
    assert settings.development_mode
    assert settings.missing_key_material() == ()
    assert worker_env(settings) == {DEVELOPMENT_MODE_ENV: "true"}
    executor = start_settings(build_parser().parse_args(["migrate"]))
    assert not executor.development_mode  # only the demo turns it on by itself
