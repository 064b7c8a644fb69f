"""Render the Helm chart ``deploy/helm/sie`` with the real ``helm`` (``make k8s-tools``)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

CHART = ROOT / "deploy" / "helm" / "sie"
CI = CHART / "ci"
TOOLS = ROOT / ".cache" / "k8s-tools"
HELM = TOOLS / "helm"
KUBECTL = TOOLS / "kubectl"
VALUES_FILES = sorted(CI.glob("*-values.yaml"))
INVALID = CI / "invalid-lane-collision.yaml"
NAMESPACE = "sie-test"


def helm_bin() -> str:
    if not HELM.exists():
        pytest.skip("helm not installed: run `make k8s-tools`")
    return str(HELM)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([helm_bin(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def render(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    """``helm template`` (release ``t``) as a list of objects."""
    args = ["template", "t", str(CHART), "--namespace", NAMESPACE]
    if values is not None:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(
        f"no {kind} {name} in {[(o['kind'], o['metadata']['name']) for o in objs]}"
    )


def containers(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) of every Deployment/StatefulSet container."""
    return [
        (o, c)
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


def secret_value(objs: list[dict[str, Any]], name: str, key: str) -> str:
    """A rendered Secret's value; ``<name/key>`` for a Secret the chart does not render
    (``auth.existingSecret``)."""
    found = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    if not found:
        return f"<{name}/{key}>"
    s = found[0]
    if key in s.get("stringData", {}):
        return str(s["stringData"][key])
    return base64.b64decode(s["data"][key]).decode()


def env_of(objs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """A container's env as the kubelet would give it (Secret refs resolved from the
    rendered Secrets; field refs as their path)."""
    out: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            out[e["name"]] = secret_value(objs, ref["name"], ref["key"])
        elif "fieldRef" in e.get("valueFrom", {}):
            out[e["name"]] = "<" + e["valueFrom"]["fieldRef"]["fieldPath"] + ">"
        else:
            raise AssertionError(f"unsupported env source {e}")
    return out
