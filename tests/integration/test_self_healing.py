"""A killed python stub is detected and recovered, against the embedded Triton.

Triton 2.51 on its own keeps the model READY with a dead stub and answers every request
``Stub process ... is not healthy`` (asserted here, so a Triton upgrade that changes it shows
up). The recovery under test: ``scripts/health_check.sh`` (curl) fails while the stub is dead,
so an orchestrator's liveness probe restarts the server; the
:class:`~triton_sam.server.health.Watchdog` reloads the model (poll mode: by touching its
folders; explicit mode: through the repository API, with the admin key) and the next click works.
The everything job model is decoupled: the watchdog probes it over a gRPC stream.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_sam.client import SAM2TritonClient
from triton_sam.client import everything as everything_client
from triton_sam.client.transport import resolve_endpoint
from triton_sam.errors import ServerError
from triton_sam.server.health import Watchdog, probe, probe_stream, watched_models
from triton_sam.serving.protocol import KIND_EVERYTHING, KIND_LAMBDA_JSON

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

SESSION = "sam2_session"
LAMBDA = "sam2"  # the Lambda seed's JSON contract, over SESSION
EVERYTHING = "sam2_everything"  # segment everything: decoupled, gRPC only
HEALTH_CHECK = Path(__file__).resolve().parents[2] / "scripts" / "health_check.sh"
IMAGE = np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8)
RECOVERY_BOUND_S = 60.0  # watchdog period + reload (0.5 s measured) + the re-embed, shared CPU
# Triton 2.51 never finishes unloading a model instance whose dead stub was sent a request
# (every test here sends one: that is how a death is seen), not even once the watchdog loaded a
# new instance beside it. A stopping server then waits out its whole exit timeout, logging
# "Found 1 live models" every second (measured: 10 s, the default, for each of this module's
# five servers; a server whose stub was killed but never asked stops in 3 s). Nothing is in
# flight when these servers stop, so one second of drain is room enough.
EXIT_TIMEOUT_S = 1


def stub_pid(server, model: str | bytes) -> int:
    """The python-backend stub process serving ``model`` (its argv names the model; bytes:
    a marker matched as is, e.g. ``b"/sam2/"`` for a name other models' names contain)."""
    marker = model if isinstance(model, bytes) else model.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == server.pid:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if os.getpgid(int(pid)) == server.pid and any(marker in a for a in argv):
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"no stub process for {model}")


def health_check(server, *args: str, env: dict[str, str] | None = None):
    """Run the script with real curl; no admin key reachable unless ``env`` gives one."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_ADMIN_KEY")}
    clean["XDG_CONFIG_HOME"] = "/nonexistent"
    return subprocess.run(
        ["bash", str(HEALTH_CHECK), *args, server.http_url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
    )


def click(server) -> np.ndarray:
    with SAM2TritonClient(server.http_url) as client:
        client.set_image(IMAGE)
        return client.predict_full(point_coords=[[30, 20]], point_labels=[1]).low_res_logits


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_a_killed_stub_is_detected_and_the_model_recovers(
    mode, embedded_triton, sam2_tiny_repository
):
    server = embedded_triton(
        sam2_tiny_repository, model_control=mode, exit_timeout_s=EXIT_TIMEOUT_S
    )
    before = click(server)
    assert health_check(server).returncode == 0
    raw = httpclient.InferenceServerClient(server.http_address)
    try:
        os.kill(stub_pid(server, SESSION), signal.SIGKILL)
        time.sleep(1.0)
        # What Triton 2.51 does: still READY, every request fails.
        assert raw.is_server_ready() and raw.is_model_ready(SESSION)
        with pytest.raises(ServerError, match="is not healthy"):
            click(server)
        assert probe(raw, SESSION) == "dead"
        failed = health_check(server)
        assert failed.returncode == 1 and "not alive" in failed.stderr
        # Recovery: the watchdog reloads the model; the next click re-embeds and works.
        killed_at = time.perf_counter()
        heals = (
            {"repository": sam2_tiny_repository}
            if mode == "poll"
            else {"admin_key": server.admin_key}
        )
        watchdog = Watchdog(server.http_address, [SESSION], interval_s=1.0, **heals).start()
        try:
            while True:
                try:
                    after = click(server)
                    break
                except ServerError:
                    assert time.perf_counter() - killed_at < RECOVERY_BOUND_S
                    time.sleep(0.5)
        finally:
            watchdog.stop()
        recovered_s = time.perf_counter() - killed_at
        reloads = watchdog.reloads
        print(f"recovered {recovered_s:.1f} s after the watchdog started; reloads {reloads}")
        assert [m for m, _ in reloads] == [SESSION]
        np.testing.assert_array_equal(after, before)  # same masks as before the kill
        assert probe(raw, SESSION) == "alive" and health_check(server).returncode == 0
    finally:
        raw.close()
    if mode == "poll":  # only the dead model was loaded again
        assert loads(server.log_path) == {**{m: 1 for m in loads(server.log_path)}, SESSION: 2}


def lambda_request(server) -> dict:
    """One request of the Lambda seed's JSON contract to the ``sam2`` model."""
    import base64
    import io
    import json

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(IMAGE).save(buf, format="PNG")
    inputs = []
    for name, text in (
        ("image_b64", base64.b64encode(buf.getvalue())),
        ("prompt_json", json.dumps({"points": [{"x": 30, "y": 20, "label": 1}]}).encode()),
    ):
        tensor = httpclient.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text]], dtype=np.object_))
        inputs.append(tensor)
    raw = httpclient.InferenceServerClient(server.http_address)
    try:
        out = raw.infer(LAMBDA, inputs).as_numpy("result_json")
    finally:
        raw.close()
    return json.loads(out.reshape(-1)[0])


def test_the_watchdog_also_heals_the_lambda_json_model(embedded_triton, sam2_tiny_repository):
    """The ``sam2`` model (the Lambda seed's contract) is a python stub too: found in the
    repository by its kind, probed with an empty ``image_b64`` (our typed refusal = alive)."""
    watched = watched_models(sam2_tiny_repository)
    assert watched.get(LAMBDA) == KIND_LAMBDA_JSON and SESSION in watched
    server = embedded_triton(
        sam2_tiny_repository, model_control="poll", exit_timeout_s=EXIT_TIMEOUT_S
    )
    before = lambda_request(server)["mask"]["data"]
    raw = httpclient.InferenceServerClient(server.http_address)
    try:
        assert probe(raw, LAMBDA, KIND_LAMBDA_JSON) == "alive"
        os.kill(stub_pid(server, f"/{LAMBDA}/".encode()), signal.SIGKILL)
        time.sleep(1.0)
        assert probe(raw, LAMBDA, KIND_LAMBDA_JSON) == "dead"
        watchdog = Watchdog(
            server.http_address,
            watched,
            repository=sam2_tiny_repository,
            grpc_address=server.grpc_address,  # the everything model too: alive, left alone
            interval_s=1.0,
        )
        killed_at = time.perf_counter()
        watchdog.start()
        try:
            while probe(raw, LAMBDA, KIND_LAMBDA_JSON) == "dead":
                assert time.perf_counter() - killed_at < RECOVERY_BOUND_S
                time.sleep(0.5)
        finally:
            watchdog.stop()
        assert [m for m, _ in watchdog.reloads] == [LAMBDA]
        assert lambda_request(server)["mask"]["data"] == before
    finally:
        raw.close()


def everything_job(server) -> list[dict]:
    """One small segment-everything job over the server's gRPC stream."""
    params = '{"points_per_side": 2}'
    inputs = everything_client.job_inputs(IMAGE, params_json=params)
    endpoint = resolve_endpoint(server.grpc_url, "grpc")
    return everything_client.generate(endpoint, EVERYTHING, inputs, timeout_s=120).instances


def test_the_watchdog_heals_the_everything_job_model(embedded_triton, sam2_tiny_repository):
    """``sam2_everything`` (decoupled: Triton's HTTP endpoint refuses it) is probed over a gRPC
    stream with a job that has no image (our typed refusal = alive) and reloaded like the
    others; the next job answers what it answered before the kill."""
    watched = watched_models(sam2_tiny_repository)
    if EVERYTHING not in watched:
        pytest.skip(f"{sam2_tiny_repository} has no {EVERYTHING} model")
    assert watched[EVERYTHING] == KIND_EVERYTHING
    server = embedded_triton(
        sam2_tiny_repository, model_control="poll", exit_timeout_s=EXIT_TIMEOUT_S
    )
    before = everything_job(server)
    raw = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        assert probe_stream(raw, EVERYTHING) == "alive"
        os.kill(stub_pid(server, f"/{EVERYTHING}/".encode()), signal.SIGKILL)
        time.sleep(1.0)
        assert probe_stream(raw, EVERYTHING) == "dead"
        watchdog = Watchdog(
            server.http_address,
            watched,
            repository=sam2_tiny_repository,
            grpc_address=server.grpc_address,
            interval_s=1.0,
        )
        killed_at = time.perf_counter()
        watchdog.start()
        try:
            while probe_stream(raw, EVERYTHING) != "alive":
                assert time.perf_counter() - killed_at < RECOVERY_BOUND_S
                time.sleep(0.5)
        finally:
            watchdog.stop()
        assert [m for m, _ in watchdog.reloads] == [EVERYTHING]
    finally:
        raw.close()
    assert everything_job(server) == before
    counts = loads(server.log_path)  # poll mode: only the dead model was loaded again
    assert counts[EVERYTHING] == 2 and set(counts.values()) == {1, 2}, counts


def loads(log: Path) -> dict[str, int]:
    """How many times the server log says each model was loaded."""
    names = re.findall(r"successfully loaded '([^']+)'", log.read_text())
    return {name: names.count(name) for name in names}


def test_health_check_heals_a_dead_stub_itself(embedded_triton, sam2_tiny_repository, tmp_path):
    server = embedded_triton(
        sam2_tiny_repository, model_control="explicit", exit_timeout_s=EXIT_TIMEOUT_S
    )
    click(server)
    os.kill(stub_pid(server, SESSION), signal.SIGKILL)
    time.sleep(1.0)
    keyless = health_check(server, "--heal")  # the repository API is restricted
    assert keyless.returncode == 1 and "no admin key" in keyless.stderr, keyless.stderr
    wrong = health_check(server, "--heal", env={"TRITON_ADMIN_KEY": "w" * 43})
    assert wrong.returncode == 1 and "restricted" in wrong.stderr, wrong.stderr
    key_file = tmp_path / "admin-key"
    key_file.write_text(server.admin_key)
    key_file.chmod(0o600)
    healed = health_check(server, "--heal", env={"TRITON_ADMIN_KEY_FILE": str(key_file)})
    assert healed.returncode == 0, healed.stderr
    assert "reloading" in healed.stderr
    click(server)


def test_triton_sam_serve_heals_a_killed_stub_by_itself(sam2_tiny_export, tmp_path):
    """`triton-sam serve` (self-heal on by default): kill the session model's stub, and a
    click works again without anyone calling anything but the client."""
    import shutil
    import sys

    exe = shutil.which("triton-sam") or str(Path(sys.executable).with_name("triton-sam"))
    cmd = [exe, "serve", "-r", str(sam2_tiny_export), "--http-port", "0", "--grpc-port", "0"]
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}  # its own admin key
    env.pop("TRITON_ADMIN_KEY", None)
    proc = subprocess.Popen(
        [*cmd, "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = []
        for line in proc.stdout:  # the command prints its endpoints, then "ready"
            lines.append(line)
            if line.startswith("ready"):
                break
        watching = next(x for x in lines if x.startswith("self-heal: watching "))
        # the everything job model too: serve gives the watchdog the gRPC address it probes over
        assert {SESSION, LAMBDA, EVERYTHING} <= set(
            watching.split(": watching ")[1].strip().split(", ")
        )
        url = next(x.split()[1] for x in lines if x.startswith("HTTP"))

        class Served:  # what click() and stub_pid() need
            http_url = url
            pid = _child_tritonserver(proc.pid)

        before = click(Served)
        os.kill(stub_pid(Served, SESSION), signal.SIGKILL)
        killed_at = time.perf_counter()
        while True:
            try:
                after = click(Served)
                break
            except ServerError:
                assert time.perf_counter() - killed_at < RECOVERY_BOUND_S
                time.sleep(0.5)
        print(f"serve recovered {time.perf_counter() - killed_at:.1f} s after the kill")
        np.testing.assert_array_equal(after, before)
        log = Path(next(x.split()[1] for x in lines if x.startswith("log")))
        counts = loads(log)  # poll mode: only the dead model was loaded again
        assert counts[SESSION] == 2 and set(counts.values()) == {1, 2}, counts
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def _child_tritonserver(parent: int) -> int:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if int(fields[1]) == parent and name == "tritonserver":
            return int(pid)
    raise AssertionError(f"no tritonserver child of {parent}")
