"""Static checks of the SAM_service gateway's deployment: compose service, image, Kubernetes.

(The manifests are also validated against the Kubernetes schemas with every other layer in
tests/unit/test_deploy.py.)
"""

from __future__ import annotations

from pathlib import Path

import yaml
from deploy_args import walk
from test_deploy import K8S, _one, render

ROOT = Path(__file__).resolve().parents[2]


def _gateway_service() -> dict:
    data = walk(
        yaml.safe_load((ROOT / "docker-compose.yml").read_text()), {"TRITON_ADMIN_KEY": "k"}
    )
    return data["services"]["gateway"]


def test_compose_gateway_is_opt_in_local_and_waits_for_a_healthy_triton():
    service = _gateway_service()
    assert service["profiles"] == ["gateway"]  # `docker compose up` alone is unchanged
    assert service["ports"] == ["127.0.0.1:8080:8080"]
    assert service["depends_on"] == {"triton": {"condition": "service_healthy"}}
    assert service["command"][:2] == ["--triton-url", "triton:8001"]  # gRPC: cancels reach Triton
    # the annotator, and its /v2 pass-through to Triton's HTTP port
    assert service["command"][2:] == ["--web", "--triton-http-url", "triton:8000"]
    assert "/health" in " ".join(service["healthcheck"]["test"])
    assert service["build"]["dockerfile"] == "deploy/gateway/Dockerfile"


def test_gateway_image_runs_the_cli_without_root_on_the_locked_versions():
    text = (ROOT / service_dockerfile()).read_text()
    assert '-c requirements/lock.txt ".[gateway]"' in text
    assert 'ENTRYPOINT ["triton-sam", "gateway"' in text
    assert "USER 65534" in text


def service_dockerfile() -> str:
    return _gateway_service()["build"]["dockerfile"]


def test_kubernetes_overlay_serves_the_gateway_next_to_the_base():
    objects = render(K8S / "overlays" / "sam-service-gateway")
    deployment = _one(objects, "Deployment", "sam-service-gateway")
    service = _one(objects, "Service", "sam-service-gateway")
    triton = _one(objects, "Service", "triton-sam")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] == 1  # sessions live in the gateway's memory
    container = pod["spec"]["containers"][0]
    host, port = container["args"][1].split(":")
    assert host == triton["metadata"]["name"]
    assert int(port) in {p["port"] for p in triton["spec"]["ports"] if p["name"] == "grpc"}
    assert container["args"][2:4] == ["--web", "--triton-http-url"]  # the annotator
    host, port = container["args"][4].split(":")
    assert host == triton["metadata"]["name"]
    assert int(port) in {p["port"] for p in triton["spec"]["ports"] if p["name"] == "http"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_kubernetes_ingress_serves_the_annotator_beside_triton_on_one_host():
    objects = render(K8S / "overlays" / "sam-service-gateway")
    web = _one(objects, "Ingress", "sam-service-gateway-web")
    http = _one(objects, "Ingress", "triton-sam-http")
    (rule,) = web["spec"]["rules"]
    # same origin: the page (/web) and Triton's API (/v2) on one host
    assert rule["host"] == http["spec"]["rules"][0]["host"]
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/web"
    assert path["backend"]["service"]["name"] == "sam-service-gateway"
    assert {p["path"] for p in http["spec"]["rules"][0]["http"]["paths"]} == {"/v2"}
