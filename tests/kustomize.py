"""A small offline renderer for the Kustomize subset deploy/k8s uses (kustomize itself is not
installed here, and the test must not reach the network).

Supported kustomization fields: resources (files and directories), namespace, labels (pairs,
includeSelectors), images (newName, newTag), replicas, patches (path; a strategic merge for
the built-in kinds: maps merge, lists of named items merge by name, other lists are replaced).
Any other field fails loudly, so the renderer never silently ignores what kubectl would apply.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "replicas",
    "patches",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
POD_OWNERS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}

Resource = dict[str, Any]


class KustomizeError(Exception):
    pass


def load_documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _key(resource: Resource) -> tuple[str, str]:
    return resource["kind"], resource["metadata"]["name"]


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge, simplified: lists of maps that all carry ``name`` merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        merged = [copy.deepcopy(i) for i in base]
        for item in patch:
            at = next((n for n, b in enumerate(merged) if b["name"] == item["name"]), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = merge(merged[at], item)
        return merged
    return copy.deepcopy(patch)


def _containers(resource: Resource) -> list[dict[str, Any]]:
    if resource["kind"] not in POD_OWNERS:
        return []
    spec = resource["spec"]["template"]["spec"]
    return [*spec.get("containers", []), *spec.get("initContainers", [])]


def _set_image(resource: Resource, images: list[dict[str, str]]) -> None:
    for container in _containers(resource):
        name, _, tag = container["image"].partition(":")
        for image in images:
            if image["name"] == name:
                name = image.get("newName", name)
                tag = image.get("newTag", tag)
                container["image"] = f"{name}:{tag}" if tag else name


def _add_labels(resource: Resource, pairs: dict[str, str], selectors: bool) -> None:
    resource["metadata"].setdefault("labels", {}).update(pairs)
    if resource["kind"] in POD_OWNERS:
        template = resource["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        if selectors and "selector" in resource["spec"]:
            resource["spec"]["selector"].setdefault("matchLabels", {}).update(pairs)


def render(directory: Path) -> list[Resource]:
    """The resources of the kustomization in ``directory``, transformed as kubectl would."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            resources.extend(render(target))
        elif target.is_file():
            resources.extend(load_documents(target))
        else:
            raise KustomizeError(f"{directory}: resource {entry} does not exist")
    seen: set[tuple[str, str]] = set()
    for resource in resources:
        if _key(resource) in seen:
            raise KustomizeError(f"{directory}: {_key(resource)} defined twice")
        seen.add(_key(resource))
    by_key = {_key(r): r for r in resources}
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"{directory}: only file patches are supported: {patch_entry}")
        for patch in load_documents(directory / patch_entry["path"]):
            if _key(patch) not in by_key:
                raise KustomizeError(f"{directory}: patch target {_key(patch)} not found")
            patched = merge(by_key[_key(patch)], patch)
            by_key[_key(patch)].clear()
            by_key[_key(patch)].update(patched)
    for entry in kustomization.get("replicas", []):
        target = by_key.get(("Deployment", entry["name"]))
        if target is None:
            raise KustomizeError(f"{directory}: replicas for unknown {entry['name']}")
        target["spec"]["replicas"] = entry["count"]
    for label in kustomization.get("labels", []):
        for resource in resources:
            _add_labels(resource, label["pairs"], label.get("includeSelectors", False))
    images = kustomization.get("images", [])
    for resource in resources:
        _set_image(resource, images)
    namespace = kustomization.get("namespace")
    if namespace:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = namespace
    return resources
