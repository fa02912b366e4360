"""The tritonserver command lines of the shipped deployments, read statically (no Docker or
cluster here): compose files interpolated as ``docker compose`` does, the Kubernetes
Deployment's container args as written (``$(VAR)`` left for the kubelet)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "base" / "triton-deployment.yaml"
_VAR = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Substitute variables in one string as docker compose does.

    Raises:
        ValueError: a required variable (``${VAR:?message}``) is unset or empty.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        missing = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-") and missing:
            return arg
        if op in (":?", "?") and missing:
            raise ValueError(f"required variable {name}: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def walk(node: Any, env: Mapping[str, str]) -> Any:
    """``node`` (parsed YAML) with every string interpolated."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [walk(v, env) for v in node]
    if isinstance(node, dict):
        return {k: walk(v, env) for k, v in node.items()}
    return node


def compose_services(path: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The services of the compose file ``path`` (relative to the checkout), interpolated."""
    return walk(yaml.safe_load((ROOT / path).read_text()), env)["services"]


def compose_command(path: str, env: Mapping[str, str]) -> list[str]:
    """The tritonserver command of the compose file (its first Triton service)."""
    services = compose_services(path, env)
    name = next(n for n in services if n.startswith("triton"))
    return list(services[name]["command"])


def kubernetes_container() -> dict[str, Any]:
    """The Triton container of the Kubernetes Deployment."""
    (container,) = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]["containers"]
    return container


def kubernetes_args() -> list[str]:
    """The Triton container's args (the tritonserver command line)."""
    return list(kubernetes_container()["args"])
