"""Static checks of deploy/ (no cluster, no Docker here, so this is the check).

- Every Kubernetes object of the kustomize base and of each overlay is validated against
  the Kubernetes OpenAPI schema (strict: unknown fields fail) with ``kubernetes-validate``
  (its bundled JSON schemas, Kubernetes 1.33). There is no kustomize or helm binary here:
  :func:`render` builds the objects for the subset of kustomize the files use (resources,
  configMapGenerator, ``$patch: delete`` and JSON 6902 patches) and refuses any other key,
  so a file using more fails here instead of going unchecked.
- The ServiceMonitor (a CRD, not in those schemas) and the cross-object references (labels,
  ports, metric names, the routing header) are checked field by field.
- The proxy configurations in deploy/ are the renderer's output (``triton_sam.scaleout``),
  which tests/integration/test_replicas.py runs in a real nginx.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.33.0"
_KUSTOMIZE_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "resources",
    "configMapGenerator",
    "patches",
}


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kustomize build directory`` would emit (the subset used in deploy/)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _KUSTOMIZE_KEYS
    assert not unknown, f"{directory}: kustomization keys this check cannot render: {unknown}"
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        objects += render(path) if path.is_dir() else _load_all(path)
    for generator in kustomization.get("configMapGenerator", []):
        data = {}
        for item in generator["files"]:
            key, _, name = item.partition("=")
            data[key] = (directory / name).read_text()
        labels = generator.get("options", {}).get("labels", {})
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"], "labels": labels},
                "data": data,
            }
        )
    for patch in kustomization.get("patches", []):
        objects = _apply_patch(directory, patch, objects)
    namespace = kustomization.get("namespace")
    for obj in objects:
        if namespace and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = namespace
    return objects


def _apply_patch(directory: Path, patch: dict, objects: list[dict]) -> list[dict]:
    body = (directory / patch["path"]).read_text()
    if "target" not in patch:  # strategic merge: only `$patch: delete` is used here
        spec = yaml.safe_load(body)
        assert spec.pop("$patch") == "delete", f"{patch}: only $patch: delete is rendered here"
        remaining = [o for o in objects if not _same(o, spec)]
        assert len(remaining) == len(objects) - 1, f"{patch}: deletes no object"
        return remaining
    target = patch["target"]
    matches = [
        o
        for o in objects
        if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]
    ]
    assert len(matches) == 1, f"{patch}: target matches {len(matches)} objects"
    for op in json.loads(body):
        _json_patch(matches[0], op)
    return objects


def _same(obj: dict, spec: dict) -> bool:
    return obj["kind"] == spec["kind"] and obj["metadata"]["name"] == spec["metadata"]["name"]


def _json_patch(document: dict, op: dict) -> None:
    """RFC 6902 add / replace / remove (what the overlays use)."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")]
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    if op["op"] == "remove":
        del node[key]
    elif op["op"] == "replace":
        assert key in node if isinstance(node, dict) else key < len(node), op
        node[key] = copy.deepcopy(op["value"])
    elif op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if key == "-" else key, copy.deepcopy(op["value"]))
        else:
            node[key] = copy.deepcopy(op["value"])
    else:
        raise AssertionError(f"unsupported JSON patch op {op['op']!r}")


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


LAYERS = [
    K8S / "base",
    K8S / "overlays" / "init-container",
    K8S / "overlays" / "tenancy",
    K8S / "overlays" / "sam-service-gateway",
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda p: p.name)
def test_objects_validate_against_the_kubernetes_schema(layer):
    import kubernetes_validate

    objects = render(layer)
    assert objects
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked field by field below
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{layer.name}: {obj['kind']} {obj['metadata']['name']}: {e.message}")


def test_the_schema_check_catches_a_wrong_field():
    """The validator is strict: a misspelt field fails (so the test above can fail)."""
    import kubernetes_validate

    pdb = copy.deepcopy(_one(render(K8S / "base"), "PodDisruptionBudget"))
    pdb["spec"]["maxUnavailabel"] = pdb["spec"].pop("maxUnavailable")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pdb, KUBERNETES_VERSION, strict=True)


def test_replicas_probe_health_request_gpus_and_mount_the_repository():
    from triton_sam.scaleout.replicas import METRICS_ARGS

    objects = render(K8S / "base")
    deployment = _one(objects, "Deployment", "triton-sam")
    pod = deployment["spec"]["template"]["spec"]
    (triton,) = pod["containers"]
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert set(METRICS_ARGS) <= set(triton["args"])  # the dashboard's quantiles
    assert "--model-repository=/models" in triton["args"]
    mount = next(m for m in triton["volumeMounts"] if m["mountPath"] == "/models")
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert _one(objects, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_init_container_overlay_copies_the_repository_instead_of_a_pvc():
    objects = render(K8S / "overlays" / "init-container")
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    pod = _one(objects, "Deployment", "triton-sam")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert "emptyDir" in models and "persistentVolumeClaim" not in models
    assert init["volumeMounts"][0] == {"name": "models", "mountPath": "/models"}
    assert "/models" in " ".join(init["command"])


def test_selectors_ports_and_targets_agree():
    objects = render(K8S / "base")
    deployment = _one(objects, "Deployment", "triton-sam")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {
        p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    service = _one(objects, "Service", "triton-sam")
    pdb = _one(objects, "PodDisruptionBudget")
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    # ServiceMonitor (CRD): selects the Service, scrapes its metrics port
    monitor = _one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    # HPA scales the Deployment
    hpa = _one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "triton-sam",
    }
    assert hpa["spec"]["minReplicas"] >= 2  # a lost replica leaves one to fail over to
    # Ingress backends exist
    for ingress in [o for o in objects if o["kind"] == "Ingress"]:
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] == service["metadata"]["name"]
                assert backend["port"]["name"] in service_ports


def test_ingress_hashes_the_clients_routing_header():
    from triton_sam.client.routing import ROUTING_HEADER
    from triton_sam.scaleout.nginx import HASH_VARIABLE

    assert "$http_" + ROUTING_HEADER.replace("-", "_") == HASH_VARIABLE
    ingresses = [o for o in render(K8S / "base") if o["kind"] == "Ingress"]
    assert {i["metadata"]["name"] for i in ingresses} == {"triton-sam-http", "triton-sam-grpc"}
    for ingress in ingresses:
        annotations = ingress["metadata"]["annotations"]
        prefix = "nginx.ingress.kubernetes.io/"
        assert annotations[prefix + "upstream-hash-by"] == HASH_VARIABLE
        assert "non_idempotent" in annotations[prefix + "proxy-next-upstream"]
    grpc = _one(ingresses, "Ingress", "triton-sam-grpc")
    assert grpc["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert grpc["spec"]["tls"]  # ingress-nginx serves HTTP/2 (gRPC) over TLS


def test_hpa_metrics_are_the_adapters():
    objects = render(K8S / "base")
    hpa = _one(objects, "HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    values = yaml.safe_load((DEPLOY / "prometheus" / "adapter-values.yaml").read_text())
    rules = values["rules"]["custom"]
    assert {r["name"]["as"] for r in rules} == wanted
    for rule in rules:
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert re.fullmatch(rule["name"]["matches"], series)
        assert series in rule["metricsQuery"]
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def dashboard_metrics() -> set[str]:
    """Metric names the Grafana dashboard queries."""
    dashboard = json.loads((DEPLOY / "grafana" / "triton-sam.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"])
    names = set()
    for expr in exprs:
        names |= set(re.findall(r"\b((?:nv|triton_sam)_\w+)\b", expr))
    return names


def test_dashboard_covers_latency_queue_gpu_and_session_cache():
    # the session model's metric names come from its protocol module;
    # tests/integration/test_replicas.py checks these names on a live server's /metrics
    from triton_sam.serving.protocol.embedding_cache import METRIC_PREFIX

    names = dashboard_metrics()
    assert {"nv_inference_request_summary_us", "nv_inference_queue_summary_us"} <= names
    assert {"nv_gpu_utilization", "nv_inference_pending_request_count"} <= names
    for gauge in ("cached_images", "cached_bytes", "hits", "misses", "evictions"):
        assert METRIC_PREFIX + gauge in names
    dashboard = json.loads((DEPLOY / "grafana" / "triton-sam.json").read_text())
    quantiles = {
        q
        for p in dashboard["panels"]
        for t in p["targets"]
        for q in re.findall(r'quantile="([\d.]+)"', t["expr"])
    }
    assert quantiles == {"0.5", "0.95", "0.99"}
    # the generator ships it as a ConfigMap the Grafana sidecar picks up
    config_map = _one(render(K8S / "base"), "ConfigMap", "triton-sam-grafana-dashboard")
    assert config_map["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(config_map["data"]["triton-sam.json"]) == dashboard


def test_compose_proxy_config_is_the_rendered_one():
    from triton_sam.scaleout.nginx import COMPOSE_TOKENS_FILE, compose_config, render_nginx_conf

    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    tritons = sorted(s for s in compose["services"] if s.startswith("triton-"))
    assert tritons == [f"triton-{i}" for i in range(len(tritons))]
    conf = (DEPLOY / "compose" / "nginx.conf").read_text()
    assert conf == render_nginx_conf(compose_config(len(tritons)))
    # tokens on: the same proxy, reading the tokens from the mounted, git-ignored directory
    tokens_conf = (DEPLOY / "compose" / "nginx-tokens.conf").read_text()
    assert tokens_conf == render_nginx_conf(
        compose_config(len(tritons), tokens_file=COMPOSE_TOKENS_FILE)
    )
    ignored = (DEPLOY / "compose" / "tokens" / ".gitignore").read_text().split("\n")
    assert "*" in ignored and "!.gitignore" in ignored
    devices = [
        compose["services"][t]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for t in tritons
    ]
    assert devices == [[str(i)] for i in range(len(tritons))]  # one GPU each
    proxy = compose["services"]["proxy"]
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    assert "./nginx-tokens.conf:/etc/nginx/nginx-tokens.conf:ro" in proxy["volumes"]
    assert "./tokens:" + COMPOSE_TOKENS_FILE.rsplit("/", 1)[0] + ":ro" in proxy["volumes"]
    # tokens are off unless the operator picks the tokens configuration
    assert proxy["command"] == ["nginx", "-c", "/etc/nginx/${TRITON_SAM_PROXY_CONF:-nginx.conf}"]
    assert set(proxy["depends_on"]) == set(tritons)
    assert all(p.startswith("${TRITON_BIND:-127.0.0.1}:") for p in proxy["ports"])
    for name in tritons:
        assert "ports" not in compose["services"][name]  # reached through the proxy only


# -- the admin key -----------------------------------------------------------------------------
ENTRYPOINT = DEPLOY.parent / "scripts" / "triton_entrypoint.sh"


def _triton_container(objects: list[dict]) -> dict:
    (triton,) = _one(objects, "Deployment", "triton-sam")["spec"]["template"]["spec"]["containers"]
    return triton


def _kubelet_args(triton: dict, env: dict[str, str]) -> list[str]:
    """The container's command + args after the kubelet's ``$(VAR)`` expansion."""
    expand = lambda a: re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a)  # noqa: E731
    return [expand(a) for a in triton["command"] + triton["args"]]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda p: p.name)
def test_control_apis_need_the_key_from_a_secret_checked_at_start(layer):
    from triton_sam.server.admin_key import restriction_args
    from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

    objects = render(layer)
    triton = _triton_container(objects)
    (env,) = [e for e in triton["env"] if e["name"] == "TRITON_ADMIN_KEY"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "triton-sam-admin", "key": "key", "optional": False}
    key = "s" * 40
    args = _kubelet_args(triton, {"TRITON_ADMIN_KEY": key})
    assert set(restriction_args(key)) <= set(args)
    assert f"--http-header-forward-pattern={FORWARD_PATTERN}" in args
    assert f"--grpc-header-forward-pattern={FORWARD_PATTERN}" in args
    assert "--model-control-mode=none" in args
    # the entrypoint: the ConfigMap holding scripts/triton_entrypoint.sh, mounted where
    # the command runs it
    assert triton["command"] == ["/bin/bash", "/opt/triton-sam/entrypoint.sh"]
    mount = next(m for m in triton["volumeMounts"] if m["mountPath"] == "/opt/triton-sam")
    pod = _one(objects, "Deployment", "triton-sam")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = _one(objects, "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"]["entrypoint.sh"] == ENTRYPOINT.read_text()


@pytest.mark.parametrize(
    ("key", "code"), [("s" * 40, 0), ("change-me", 64), ("short", 64), (None, 64)]
)
def test_the_deployment_refuses_the_published_or_a_missing_key(key, code):
    """The entrypoint run with the Deployment's own args as the kubelet expands them (an
    unset variable stays ``$(TRITON_ADMIN_KEY)``), on a command that prints them."""
    triton = _triton_container(render(K8S / "base"))
    args = _kubelet_args(triton, {"TRITON_ADMIN_KEY": key} if key else {})
    script = K8S / "base" / "triton-entrypoint.sh"
    assert args[:2] == ["/bin/bash", "/opt/triton-sam/entrypoint.sh"]
    assert args[2] == "tritonserver"
    done = subprocess.run(
        ["bash", str(script), "echo", *args[3:]], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == code, done.stderr
    assert ("--model-repository=/models" in done.stdout) == (code == 0)


def test_compose_replicas_run_the_entrypoint_and_forward_the_tenant():
    from deploy_args import compose_services

    from triton_sam.server.admin_key import restriction_args
    from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

    key = "r" * 40
    services = compose_services("deploy/compose/docker-compose.yml", {"TRITON_ADMIN_KEY": key})
    for name in [s for s in services if s.startswith("triton-")]:
        service = services[name]
        assert service["entrypoint"] == ["/bin/bash", "/opt/triton-sam/entrypoint.sh"]
        assert (
            "../../scripts/triton_entrypoint.sh:/opt/triton-sam/entrypoint.sh:ro"
            in (service["volumes"])
        )
        assert set(restriction_args(key)) <= set(service["command"])
        assert f"--grpc-header-forward-pattern={FORWARD_PATTERN}" in service["command"]


def test_the_tenancy_overlay_checks_every_ingress_request_with_the_rendered_token_check():
    from triton_sam.scaleout.nginx import AUTH_PATH, AUTH_PORT, render_auth_conf
    from triton_sam.serving.protocol.tenancy import TENANT_HEADER

    layer = K8S / "overlays" / "tenancy"
    objects = render(layer)
    auth = _one(objects, "Deployment", "triton-sam-auth")
    service = _one(objects, "Service", "triton-sam-auth")
    container = auth["spec"]["template"]["spec"]["containers"][0]
    volumes = {v["name"]: v for v in auth["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config = _one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])
    tokens_file = mounts["tokens"] + "/tokens.map"
    assert config["data"]["nginx.conf"] == render_auth_conf(tokens_file)
    assert container["command"] == ["nginx", "-c", mounts["config"] + "/nginx.conf"]
    assert volumes["tokens"]["secret"]["secretName"] == "triton-sam-tokens"
    assert "optional" not in volumes["tokens"]["secret"]  # no secret, no check: closed
    assert service["spec"]["ports"][0]["port"] == AUTH_PORT
    assert service["spec"]["selector"] == auth["spec"]["selector"]["matchLabels"]
    url = (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}"
        f".svc.cluster.local:{AUTH_PORT}{AUTH_PATH}"
    )
    prefix = "nginx.ingress.kubernetes.io/"
    ingresses = [o for o in objects if o["kind"] == "Ingress"]
    assert len(ingresses) == 2
    for ingress in ingresses:
        annotations = ingress["metadata"]["annotations"]
        assert annotations[prefix + "auth-url"] == url
        assert annotations[prefix + "auth-response-headers"] == TENANT_HEADER
    # the base stays tokens-off
    assert not any(
        prefix + "auth-url" in o["metadata"]["annotations"]
        for o in render(K8S / "base")
        if o["kind"] == "Ingress"
    )
