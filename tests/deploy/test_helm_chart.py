"""The Helm chart ``deploy/helm/sie`` (issue 18): ``helm lint``, ``helm template`` over
every ``ci/*-values.yaml``, the invalid lane refused by name, every object against the
Kubernetes 1.33 schema (``kubernetes-validate``), the KEDA and Prometheus-operator objects
against the CRD fields they use, the §16.3 lane rules, and every ``SIE_*`` variable
the chart sets being a setting ``sie serve`` reads (``sie.settings.ENV_VARS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from sie.settings import ENV_VARS, ServeSettings
from tests.deploy.chart import (
    CHART,
    INVALID,
    VALUES_FILES,
    containers,
    env_of,
    find,
    helm,
    render,
)

K8S_VERSION = "1.33.0"
IDS = [p.stem for p in VALUES_FILES]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {p.stem: render(p) for p in VALUES_FILES} | {"defaults": render()}


def test_the_ci_values_files_are_the_four_examples() -> None:
    assert set(IDS) == {
        "cpu-only-values",
        "gpu-lanes-values",
        "external-nats-values",
        "persistence-on-values",
    }


@pytest.mark.parametrize("values", [None, *VALUES_FILES], ids=["defaults", *IDS])
def test_helm_lint_is_clean(values: Path | None) -> None:
    args = ["lint", str(CHART), "--strict"]
    if values is not None:
        args += ["-f", str(values)]
    r = helm(*args)
    assert "0 chart(s) failed" in r.stdout + r.stderr
    assert "[WARNING]" not in r.stdout and "[ERROR]" not in r.stdout


def test_the_invalid_lane_fails_the_render_naming_it() -> None:
    r = helm("template", "t", str(CHART), "-f", str(INVALID), check=False)
    assert r.returncode != 0
    assert 'worker lane "l4-b"' in r.stderr and "collides" in r.stderr, r.stderr
    assert "default/l4/default" in r.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            [
                "workers.lanes[0].name=bad",
                "workers.lanes[0].replicas=1",
                "workers.lanes[0].machineProfile=l4.x",
            ],
            'worker lane "bad": machineProfile "l4.x" must match',
        ),
        (
            [
                "workers.lanes[0].name=blank",
                "workers.lanes[0].replicas=1",
                "workers.lanes[0].bundle=  ",
            ],
            'worker lane "blank": bundle is blank',
        ),
        (
            [
                "workers.lanes[0].name=long",
                "workers.lanes[0].replicas=1",
                "workers.lanes[0].pool=" + "p" * 64,
                "queueRouting.staticQueuePools[0]=" + "p" * 64,
            ],
            "longer than 63",
        ),
        (
            [
                "workers.lanes[0].name=ded",
                "workers.lanes[0].replicas=1",
                "workers.lanes[0].pool=acme",
            ],
            'worker lane "ded": pool "acme" must be listed',
        ),
        (["queueRouting.streamReplicas=3"], "more than the NATS cluster size"),
        (["nats.enabled=false"], "nats.external.url is required"),
    ],
    ids=[
        "bad-char",
        "blank",
        "too-long",
        "undeclared-pool",
        "replicas-over-cluster",
        "no-nats-url",
    ],
)
def test_bad_values_fail_the_render_with_a_message(sets: list[str], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    r = helm(*args, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_the_schema_refuses_a_second_config_replica_and_eleven_gateways() -> None:
    for s in ("config.replicas=2", "gateway.replicas=11", "queueRouting.streamStorage=disk"):
        r = helm("template", "t", str(CHART), "--set", s, check=False)
        assert r.returncode != 0 and "schema" in r.stderr.lower(), (s, r.stderr)


@pytest.mark.parametrize("name", ["defaults", *IDS])
def test_every_object_passes_the_kubernetes_schema(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    crds = {"ScaledObject", "ServiceMonitor"}
    for obj in rendered[name]:
        if obj["kind"] in crds:
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


_STR = {"type": "string"}
_INT = {"type": "integer"}
# The fields of KEDA's ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x) the chart uses, with
# their CRD types; anything else the chart writes is an error.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {"apiVersion": _STR, "kind": _STR, "name": _STR},
                },
                "minReplicaCount": {**_INT, "minimum": 0},
                "maxReplicaCount": {**_INT, "minimum": 1},
                "pollingInterval": _INT,
                "cooldownPeriod": _INT,
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "prometheus"},
                            "name": _STR,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": _STR, "kind": _STR},
                            },
                            # the prometheus scaler's metadata: a map of strings
                            "metadata": {
                                "type": "object",
                                "additionalProperties": _STR,
                                "required": ["serverAddress", "query", "threshold"],
                                "properties": {
                                    "serverAddress": {"type": "string", "pattern": "^https?://"},
                                    "query": _STR,
                                    "threshold": {"type": "string", "pattern": r"^\d+(\.\d+)?$"},
                                    "activationThreshold": {
                                        "type": "string",
                                        "pattern": r"^\d+(\.\d+)?$",
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": _STR,
                            "path": _STR,
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "authorization": {
                                "type": "object",
                                "properties": {
                                    "type": _STR,
                                    "credentials": {
                                        "type": "object",
                                        "required": ["name", "key"],
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("name", ["defaults", *IDS])
def test_keda_and_monitoring_objects_use_only_their_crd_fields(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objs = rendered[name]
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    for so in (o for o in objs if o["kind"] == "ScaledObject"):
        jsonschema.validate(so, SCALED_OBJECT)
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"], "KEDA owns the replica count"
        env = env_of(objs, target["spec"]["template"]["spec"]["containers"][0])
        labels = (
            f'pool="{env["SIE_POOL"]}",machine_profile="{env["SIE_MACHINE_PROFILE"]}",'
            f'bundle="{env["SIE_BUNDLE"]}"'
        )
        queries = {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"]}
        assert set(queries) == {"queue-depth", "pending-demand", "warm-floor"}
        for series, q in zip(
            (
                "sie_gateway_lane_queue_depth",
                "sie_gateway_pending_demand",
                "sie_gateway_pool_warm_floor",
            ),
            queries.values(),
            strict=True,
        ):
            assert q.split("(", 1)[1].startswith(series + "{" + labels), q
            assert q.endswith(" or vector(0)"), q  # a missing series is 0, not an error
    for sm in (o for o in objs if o["kind"] == "ServiceMonitor"):
        jsonschema.validate(sm, SERVICE_MONITOR)


def test_autoscaled_lanes_scale_from_zero(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["gpu-lanes-values"]
    so = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "ScaledObject"}
    assert so["t-sie-worker-l4"]["minReplicaCount"] == 0
    assert so["t-sie-worker-l4"]["maxReplicaCount"] == 8
    assert so["t-sie-worker-acme-h100"]["minReplicaCount"] == 0
    assert so["t-sie-worker-cpu"]["minReplicaCount"] == 1
    l4 = {t["name"]: t["metadata"] for t in so["t-sie-worker-l4"]["triggers"]}
    assert l4["queue-depth"]["threshold"] == "64"
    assert l4["pending-demand"]["activationThreshold"] == "0"  # one refusal wakes it
    assert not [o for o in rendered["cpu-only-values"] if o["kind"] == "ScaledObject"]


@pytest.mark.parametrize("name", ["defaults", *IDS])
def test_every_sie_variable_is_a_setting_the_code_reads(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objs = rendered[name]
    for o, c in containers(objs):
        names = [e["name"] for e in c.get("env", [])]
        assert len(names) == len(set(names)), f"{c['name']}: a variable set twice"
        unknown = [n for n in names if n.startswith("SIE_") and n not in ENV_VARS]
        assert not unknown, f"{o['metadata']['name']}: not settings: {unknown}"
        if c["name"] == "nats":
            continue
        env = env_of(objs, c)
        ServeSettings.from_env(env)  # every value parses as its setting
        assert c["command"] == ["sie", "serve"]


REQUIRED = {
    "common": {
        "SIE_ROLES",
        "SIE_BUS",
        "SIE_NATS_URL",
        "SIE_HOST",
        "SIE_AUTH_MODE",
        "SIE_AUTH_TOKEN",
        "SIE_ADMIN_TOKEN",
    },
    "routing": {
        "SIE_CONFIG_SERVICE_URL",
        "SIE_STREAM_STORAGE",
        "SIE_STREAM_REPLICAS",
        "SIE_STREAM_MAX_AGE_S",
        "SIE_GATEWAY_CONFIGURED_GPUS",
        "SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES",
        "SIE_POOL_STORE",
    },
    "gateway": {"SIE_PORT", "SIE_MACHINE_PROFILE"},
    "config": {"SIE_CONFIG_PORT", "SIE_MODELS_DIR", "SIE_BUNDLES_DIR"},
    "worker": {"SIE_METRICS_PORT", "SIE_POOL", "SIE_MACHINE_PROFILE", "SIE_BUNDLE", "SIE_DEVICE"},
}


@pytest.mark.parametrize("name", ["defaults", *IDS])
def test_required_settings_are_rendered_and_shared_values_agree(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objs = rendered[name]
    envs = {
        o["metadata"]["name"]: env_of(objs, c) for o, c in containers(objs) if c["name"] != "nats"
    }
    gateway = envs["t-sie-gateway"]
    config = envs["t-sie-config"]
    workers = {k: v for k, v in envs.items() if "-worker-" in k}
    assert workers
    assert REQUIRED["common"] | REQUIRED["routing"] | REQUIRED["gateway"] <= gateway.keys()
    assert REQUIRED["common"] | REQUIRED["config"] <= config.keys()
    assert gateway["SIE_ROLES"] == "gateway" and config["SIE_ROLES"] == "config"
    routing_keys = {
        k
        for k in gateway
        if k in REQUIRED["routing"] or k.startswith("SIE_GATEWAY_") or k == "SIE_PAYLOAD_STORE_URL"
    } - {"SIE_PORT"}
    for wname, w in workers.items():
        assert REQUIRED["common"] | REQUIRED["routing"] | REQUIRED["worker"] <= w.keys(), wname
        assert w["SIE_ROLES"] == "worker"
        # the two stream creators and the lane catalog cannot disagree (§8.2, §16.3)
        for k in routing_keys | REQUIRED["common"] - {"SIE_ROLES"}:
            assert w.get(k) == gateway[k], (wname, k)
        lane = f"{w['SIE_POOL']}/{w['SIE_MACHINE_PROFILE']}/{w['SIE_BUNDLE']}"
        assert lane in gateway["SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES"].split(",")
        assert w["SIE_MACHINE_PROFILE"] in gateway["SIE_GATEWAY_CONFIGURED_GPUS"].split(",")
    for k in REQUIRED["common"] - {"SIE_ROLES"}:
        assert config[k] == gateway[k], k
    assert config["SIE_CONFIG_PORT"] in gateway["SIE_CONFIG_SERVICE_URL"]


def test_lane_tokens_are_trimmed_and_lowercased(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["gpu-lanes-values"]
    gw = env_of(
        objs, find(objs, "Deployment", "t-sie-gateway")["spec"]["template"]["spec"]["containers"][0]
    )
    assert gw["SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES"] == (
        "default/cpu/default,default/l4/default,customer-acme/h100/default"
    )
    assert gw["SIE_GATEWAY_CONFIGURED_GPUS"] == "cpu,l4,h100"
    assert gw["SIE_MACHINE_PROFILE"] == "cpu"  # the default lane is a configured one
    assert gw["SIE_GATEWAY_STATIC_QUEUE_POOLS"] == "customer-acme"
    assert gw["SIE_GATEWAY_GPU_ALIASES"] == "l4-spot=l4"
    assert gw["SIE_STREAM_STORAGE"] == "file" and gw["SIE_STREAM_REPLICAS"] == "3"
    l4 = find(objs, "Deployment", "t-sie-worker-l4")["spec"]["template"]["spec"]
    c = l4["containers"][0]
    env = env_of(objs, c)
    assert env["SIE_MACHINE_PROFILE"] == "l4" and env["SIE_DEVICE"] == "cuda"
    assert env["SIE_PRELOAD_MODELS"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert env["SIE_MEMORY_BUDGET_FRACTION"] == "0.8"  # extraEnv
    assert c["image"].endswith("-cuda") and c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert l4["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert l4["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_config_is_one_replica_and_persistence_wires_the_store(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name in ("defaults", *IDS):
        cfg = find(rendered[name], "Deployment", "t-sie-config")
        assert cfg["spec"]["replicas"] == 1 and cfg["spec"]["strategy"]["type"] == "Recreate"
    objs = rendered["persistence-on-values"]
    cfg = find(objs, "Deployment", "t-sie-config")["spec"]["template"]["spec"]
    env = env_of(objs, cfg["containers"][0])
    assert env["SIE_CONFIG_STORE_DIR"] == "/var/lib/sie-config"
    assert env["SIE_CONFIG_RESTORE"] == "true"
    mounts = {m["name"]: m["mountPath"] for m in cfg["containers"][0]["volumeMounts"]}
    assert mounts["store"] == "/var/lib/sie-config"
    claim = next(v for v in cfg["volumes"] if v["name"] == "store")["persistentVolumeClaim"]
    pvc = find(objs, "PersistentVolumeClaim", claim["claimName"])
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    off = env_of(
        rendered["cpu-only-values"],
        find(rendered["cpu-only-values"], "Deployment", "t-sie-config")["spec"]["template"]["spec"][
            "containers"
        ][0],
    )
    assert "SIE_CONFIG_STORE_DIR" not in off and "SIE_CONFIG_RESTORE" not in off


def test_probes_and_ports_match_each_role(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["gpu-lanes-values"]
    for _o, c in containers(objs):
        if c["name"] == "nats":
            continue
        env = env_of(objs, c)
        port_env = {
            "gateway": "SIE_PORT",
            "config": "SIE_CONFIG_PORT",
            "worker": "SIE_METRICS_PORT",
        }[env["SIE_ROLES"]]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {c["livenessProbe"]["httpGet"]["port"]: int(env[port_env])}
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_external_nats_and_existing_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["external-nats-values"]
    assert not [o for o in objs if o["kind"] == "StatefulSet"]
    assert not [o for o in objs if o["kind"] == "Secret"]
    gw = find(objs, "Deployment", "t-sie-gateway")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in gw["env"]}
    assert env["SIE_NATS_URL"]["value"] == "nats://nats.nats.svc.cluster.local:4222"
    assert env["SIE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "sie-tokens"


def test_kubernetes_pool_store_gets_rbac_on_configmaps_and_leases(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objs = rendered["gpu-lanes-values"]
    role = find(objs, "Role", "t-sie-pools")
    resources = {
        (g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert resources == {("", "configmaps"), ("coordination.k8s.io", "leases")}
    assert find(objs, "ServiceAccount", "t-sie")["automountServiceAccountToken"] is True
    gw = find(objs, "Deployment", "t-sie-gateway")["spec"]["template"]["spec"]
    assert gw["serviceAccountName"] == "t-sie"
    assert not [o for o in rendered["cpu-only-values"] if o["kind"] == "Role"]
