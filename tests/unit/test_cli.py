"""CLI: help texts, user errors as one line + exit 1, pixi task names of the reference."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from triton_sam.cli import RENAMED

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from triton_sam.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_help_lists_every_command():
    out = run_cli("--help")
    assert out.returncode == 0
    for cmd in (
        "models",
        "config",
        "download",
        "export",
        "setup",
        "serve",
        "check",
        "demo",
        "precompute",
        "segment-large",
        "bench",
        "proxy",
    ):
        assert cmd in out.stdout


@pytest.mark.parametrize("cmd", ["export", "setup", "serve", "demo", "bench", "download"])
def test_each_command_explains_itself(cmd):
    out = run_cli(cmd, "--help")
    assert out.returncode == 0 and "Usage" in out.stdout


def test_models_lists_the_sam2_variants():
    out = run_cli("models")
    assert out.returncode == 0
    assert all(f"sam2.1_hiera_{s}" in out.stdout for s in ("tiny", "small", "base_plus", "large"))


def test_models_lists_the_sam1_variants():
    out = run_cli("models")
    assert all(f"sam1_vit_{s}" in out.stdout for s in ("b", "l", "h"))


def test_sam1_pixi_tasks_follow_the_reference():
    tasks = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pixi"]["tasks"]
    for size in ("h", "l", "b"):
        assert tasks[f"download-sam1-{size}"] == f"triton-sam download sam1_vit_{size}"
    assert tasks["setup-sam1"] == "triton-sam setup sam1_vit_h"  # ViT-H, as the reference
    assert tasks["export-sam1"] == "triton-sam export sam1_vit_h"
    assert {"setup-sam1", "setup-sam2"} <= set(tasks["setup-all"]["depends-on"])


def test_sam3_pixi_tasks_follow_the_reference():
    tasks = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pixi"]["tasks"]
    assert "setup-sam3" in tasks["setup-all"]["depends-on"]
    assert tasks["setup-sam3"]["depends-on"] == ["download-sam3-onnx"]
    assert tasks["setup-sam3"]["cmd"].startswith("triton-sam import-onnx ")
    assert tasks["download-sam3-onnx"].startswith("triton-sam download-onnx")
    assert tasks["test-sam3"] == "triton-sam check --model-type sam3"
    assert tasks["benchmark-sam3"].startswith("triton-sam bench users")


def test_config_applies_overrides():
    out = run_cli("config", "sam2.1_hiera_tiny", "export.fp16=true")
    assert out.returncode == 0
    assert "fp16: true" in out.stdout and "name: sam2.1_hiera_tiny" in out.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (("export", "ghost_model"), "expected one of"),
        (("export", "sam2.1_hiera_tiny", "export.nope=1"), "overrides"),
        (("export", "sam2.1_hiera_tiny", "--checkpoint", "/nonexistent.pt"), "/nonexistent.pt"),
        (("check", "--url", "127.0.0.1:9"), "triton-sam serve"),
        (("setup-video", "sam3_concept_video", "--random-init"), "--random-init"),
        (("setup-video", "sam3_concept_video", "--checkpoint", "/nonexistent"), "/nonexistent"),
    ],
)
def test_user_errors_print_one_message_and_exit_1(args, needle):
    out = run_cli(*args)
    assert out.returncode == 1
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_pixi_tasks_keep_the_reference_names():
    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tasks = manifest["tool"]["pixi"]["tasks"]
    required = {
        "setup",
        "setup-sam2",
        "setup-all",
        "download-tiny",
        "download-small",
        "download-base",
        "download-large",
        "export-sam2",
        "export-onnx",
        "test-sam2",
        "serve",
        "demo",
        "test",
        "benchmark-sam2",
    }
    assert required <= set(tasks)
    assert "sam2.1_hiera_base_plus" in tasks["download-base"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make demo" in readme
    assert "make test" in ci and "make demo" in ci


def test_demo_prints_sizes_in_a_readable_unit():
    from triton_sam.cli.options import size

    assert [size(n) for n in (367, 4096, 12 * 2**20)] == ["367 B", "4.00 KiB", "12.00 MiB"]


def test_demo_runs_with_no_arguments():
    """`make demo` calls `triton-sam demo` bare: it must take options only (a helper once
    took the decorator and made demo ask for an argument)."""
    out = run_cli("demo", "--help")
    assert out.returncode == 0
    assert "--model" in out.stdout and "--protocol" in out.stdout
    assert "Arguments" not in out.stdout


def test_serve_without_the_onnxruntime_backend_says_what_to_do(tmp_path):
    """An onnxruntime model and no backend: one message naming the variable and the make
    target, exit 1, no server started (never a silent fallback to the python runner)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
    )
    onnx.save_model(helper.make_model(graph), str(model / "1" / "model.onnx"))
    (model / "config.pbtxt").write_text(
        'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 2\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [2] }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [2] }\n'
        "instance_group { kind: KIND_CPU count: 1 }\n"
    )
    out = run_cli(
        "serve", "--repository", str(tmp_path / "repo"), "--http-port", "0",
        "--grpc-port", "0", "--metrics-port", "0",
        "--onnxruntime-backend", str(tmp_path / "no_backend"),
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    for needle in ("libtriton_onnxruntime.so", "TRITON_SAM_ONNXRUNTIME_BACKEND",
                   "make onnxruntime-backend", str(tmp_path / "no_backend")):  # fmt: skip
        assert needle in out.stderr


def test_serve_takes_the_configurations_serve_section_and_its_options_override_it(
    tmp_path, serve_arguments
):
    """The serve: section of conf/config.yaml is what `triton-sam serve` runs with (the
    start-up timeout included); a command-line option overrides its key."""
    from triton_sam.setup.settings import load_config, section

    seen = serve_arguments(repository=tmp_path, http_port=0, target="onnxruntime")
    expected = section(load_config(), "serve") | {"http_port": 0}
    assert {k: seen[k] for k in expected} == expected
    assert seen["startup_timeout_s"] == load_config().serve.startup_timeout_s


def test_session_options_come_from_the_configuration():
    from triton_sam.cli.setup import session_options
    from triton_sam.repository.session_config import SessionOptions
    from triton_sam.setup.settings import load_config, section

    values = section(load_config(), "session")
    assert session_options(values, SessionOptions) == SessionOptions()  # same defaults
    assert session_options(values | {"enabled": False}, SessionOptions) is None
    assert session_options(values | {"max_images": 3}, SessionOptions).max_images == 3


def test_measuring_commands_use_the_url_or_an_embedded_production_server(monkeypatch, tmp_path):
    """bench.harness.served: --url as given; else the production repository of --model, built
    with the configured checkpoints directory and served embedded for the block."""
    from triton_sam import server
    from triton_sam.bench import harness
    from triton_sam.models import get_model
    from triton_sam.setup.settings import load_config
    from triton_sam.tools import demo

    with harness.served("h:1", protocol="grpc", model="x", model_type="sam1", work=tmp_path) as s:
        assert (s.url, s.family, s.pid) == ("h:1", "sam1", None)
    built = {}

    def build(model, checkpoints_dir, work_dir):
        built.update(model=model, checkpoints=checkpoints_dir, work=work_dir)
        return get_model(model), tmp_path / "embedded", None

    class FakeServer:
        grpc_url, http_url, metrics_url, pid = "g:1", "http://h:2", "http://h:3", 42

        def __init__(self, repo, **ports):
            assert repo == tmp_path / "embedded" and set(ports.values()) == {0}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            built["stopped"] = True

    monkeypatch.setattr(demo, "build_local_repository", build)
    monkeypatch.setattr(server, "EmbeddedTriton", FakeServer)
    with harness.served(
        None, protocol="grpc", model="sam2.1_hiera_tiny", model_type="sam1", work=tmp_path
    ) as s:
        assert (s.url, s.http_url, s.metrics_url, s.pid) == ("g:1", "http://h:2", "http://h:3", 42)
        assert (s.family, s.name) == ("sam2", "sam2.1_hiera_tiny")
    assert built["checkpoints"] == Path(load_config().paths.checkpoints) and built["stopped"]


# -- grouping: the top level fits a screen; measurements under `bench`, the proxy under `proxy`


def test_the_top_level_help_fits_one_screen():
    out = subprocess.run(
        [sys.executable, "-c", "from triton_sam.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80", "TERM": "dumb"},
    )
    lines = out.stdout.rstrip().splitlines()
    assert out.returncode == 0 and len(lines) <= 40, out.stdout
    assert max(len(line) for line in lines) <= 80
    for group in ("bench", "proxy"):
        assert re.search(rf"^\W*{group}\s", out.stdout, re.M), group


def _invoke(*args: str):
    from typer.testing import CliRunner

    from triton_sam.cli import app

    return CliRunner().invoke(app, list(args))


def _listed_commands(*args: str) -> set[str]:
    """The command names of a group's --help (rich's table: first word of each row)."""
    out = _invoke(*args, "--help").stdout
    return {m.group(1) for m in re.finditer(r"^\W*([a-z][a-z0-9-]*)\s{2,}\S", out, re.M)}


def test_the_measurements_are_under_bench():
    listed = _listed_commands("bench")
    assert {
        "users",
        "click",
        "backends",
        "video",
        "concepts",
        "replicas",
        "storm",
        "perf-analyzer",
        "stress",
        "soak",
        "large",
        "everything-large",
    } <= listed
    assert {"config", "token"} <= _listed_commands("proxy")


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_old_name_still_works_with_a_note_and_is_hidden(old, new):
    result = _invoke(old, "--help")
    assert result.exit_code == 0 and "Usage" in result.stdout
    note = f"`triton-sam {old}` is now `triton-sam {new}`; the old name goes in the next release"
    assert note in result.stderr
    assert old not in _listed_commands()
    # the same options as the new name
    new_options = set(re.findall(r"--[a-z][a-z0-9-]*", _invoke(*new.split(), "--help").stdout))
    assert set(re.findall(r"--[a-z][a-z0-9-]*", result.stdout)) == new_options


def test_an_old_name_runs_the_command():
    old = _invoke("proxy-config", "--replicas", "2")
    new = _invoke("proxy", "config", "--replicas", "2")
    assert old.exit_code == new.exit_code == 0
    assert old.stdout == new.stdout and "upstream" in new.stdout
    assert "now `triton-sam proxy config`" in old.stderr and not new.stderr


def test_bench_with_options_is_the_old_bench_users():
    """`triton-sam bench --opt` (the old spelling) runs `bench users`, with the note;
    `triton-sam bench` alone lists the measurements."""
    result = _invoke("bench", "--n-encode", "0")
    assert result.exit_code == 2  # users' own validation, before anything runs
    assert "now `triton-sam bench users`" in result.stderr
    assert "--n-encode" in result.stderr and "bench users" in result.stderr
    alone = _invoke("bench")
    assert "users" in alone.stdout and "stress" in alone.stdout


# -- options declared once: comma lists, protocols; experiments outside the callbacks


@pytest.mark.parametrize(
    "text, kwargs, expected",
    [
        ("1, 4,,16", {"item": int}, [1, 4, 16]),
        ("grpc,http,grpc", {"choices": ("grpc", "http")}, ["grpc", "http"]),
        ("default,2x1", {}, [None, (2, 1)]),
    ],
)
def test_comma_lists_parse_in_one_place(text, kwargs, expected):
    from triton_sam.cli.bench import parse_sizing
    from triton_sam.cli.options import csv

    if expected[0] is None:
        kwargs = {"item": parse_sizing}
    assert csv(text, option="--x", **kwargs) == expected


@pytest.mark.parametrize(
    "text, kwargs",
    [(",", {}), ("1,x", {"item": int}), ("grpc,udp", {"choices": ("grpc", "http")})],
)
def test_a_bad_comma_list_names_the_option_and_the_value(text, kwargs):
    from triton_sam.cli.options import csv
    from triton_sam.errors import InputValidationError

    with pytest.raises(InputValidationError) as info:
        csv(text, option="--levels", **kwargs)
    assert info.value.field == "--levels" and repr(text) in str(info.value)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("bench", "perf-analyzer", "--concurrency", "1,0"), "--concurrency: got '1,0'"),
        (("bench", "click", "--decoder-sizing", "2y1"), "--decoder-sizing: got '2y1'"),
        (("bench", "users", "--protocols", "grpc,udp"), "--protocols: got 'grpc,udp'"),
        (("bench", "storm", "--embeds", "64,x"), "--embeds: got '64,x'"),
    ],
)
def test_a_bad_comma_list_is_one_line_and_exit_1_before_any_work(args, needle):
    out = run_cli(*args)
    assert out.returncode == 1 and needle in out.stderr and "Traceback" not in out.stderr


def test_the_protocol_is_a_choice_everywhere():
    for args in (("check",), ("demo",), ("track",), ("bench", "click"), ("bench", "soak")):
        assert "<grpc|http>" in _invoke(*args, "--help").stdout, args
    result = _invoke("bench", "click", "--protocol", "udp")
    assert result.exit_code == 2 and "'udp' is not one of" in result.stderr


def test_bench_click_only_parses_and_calls_the_grid(monkeypatch, tmp_path):
    from triton_sam.bench import click_grid

    calls = []

    def grid(model, **kwargs):
        calls.append((model, kwargs))
        return tmp_path / "grid.json"

    monkeypatch.setattr(click_grid, "run_click_grid", grid)
    result = _invoke(
        "bench", "click", "--protocol", "http", "--cpu-features", "process",
        "--decoder-sizing", "default,1x2", "--n", "3", "--output", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ((model, kwargs),) = calls
    assert model == "sam2.1_hiera_tiny" and kwargs["protocol"] == "http"
    assert kwargs["stores"] == ["process"] and kwargs["sizings"] == [None, (1, 2)]
    assert kwargs["n"] == 3 and f"wrote {tmp_path / 'grid.json'}" in result.stdout


def test_the_click_grid_serves_each_cell_and_writes_one_json(monkeypatch, tmp_path):
    """run_click_grid, importable without the CLI: one repository copy and one embedded
    server per (store, sizing), the load average beside each cell's figures."""
    import json
    from contextlib import contextmanager
    from types import SimpleNamespace

    from triton_sam.bench import breakdown, click_grid

    family = SimpleNamespace(family="sam2")
    built = SimpleNamespace(spec=SimpleNamespace(family=family), repository=tmp_path / "repo")
    monkeypatch.setattr(click_grid, "prepare_model", lambda *a, **k: built)
    monkeypatch.setattr(click_grid, "ort_sessions", lambda *a: ("dec", "post"))
    monkeypatch.setattr(click_grid, "sample_image", lambda: "image")
    copies, served = [], []

    def variant(repo, out, fam, *, cpu_features, decoder_sizing):
        copies.append((cpu_features, decoder_sizing))
        return out

    @contextmanager
    def embedded(repo):
        served.append(repo.name)
        yield SimpleNamespace(grpc_url="g", http_url="h", metrics_url="m")

    def run(fam, urls, sessions, image, *, protocol, n):
        report = breakdown.ClickBreakdown()
        report.add("click", 1.0)
        return report

    monkeypatch.setattr(breakdown, "variant_repository", variant)
    monkeypatch.setattr(breakdown, "run_breakdown", run)
    monkeypatch.setattr(click_grid, "embedded", embedded)
    seen = []
    path = click_grid.run_click_grid(
        "m", work_dir=tmp_path, output=tmp_path / "out", n=2,
        stores=("process", "shared_memory"), sizings=(None, (2, 1)),
        progress=lambda label, report: seen.append(label),
    )  # fmt: skip
    labels = ["process", "process-2x1", "shared_memory", "shared_memory-2x1"]
    assert seen == labels and served == [f"click-{label}" for label in labels]
    assert copies == [("process", None), ("process", (2, 1)),
                      ("shared_memory", None), ("shared_memory", (2, 1))]  # fmt: skip
    cells = json.loads(path.read_text())
    assert list(cells) == labels and path == tmp_path / "out" / "m.json"
    assert cells["process-2x1"]["settings"]["decoder_sizing"] == "2x1"
    assert len(cells["process"]["settings"]["load_average"]) == 3


def test_every_model_option_defaults_to_the_one_default_variant():
    import typer

    from triton_sam.cli import app
    from triton_sam.cli.options import DEFAULT_MODEL

    def commands(group, path=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from commands(command, (*path, name))
            else:
                yield (*path, name), command

    seen = {
        path: param.default
        for path, command in commands(typer.main.get_command(app))
        for param in command.params
        if "--model" in param.opts
    }
    assert len(seen) >= 10 and set(seen.values()) == {DEFAULT_MODEL}, seen


def test_the_cli_loads_no_heavy_library_before_a_command_runs():
    """`triton-sam --help` stays fast: the exporters, the server, the gateway and the
    benchmarks are imported by the commands that use them."""
    heavy = ("torch", "onnx", "onnxruntime", "grpc", "uvicorn", "starlette", "hydra")
    code = "import sys, triton_sam.cli; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    ).stdout.split()
    assert not {m.split(".")[0] for m in loaded} & set(heavy)
    assert not [m for m in loaded if m.startswith(("triton_sam.server", "triton_sam.bench."))
                and m != "triton_sam.bench.harness"]  # fmt: skip


def test_the_replica_benchmark_runs_the_reference_once_then_each_protocol(monkeypatch, tmp_path):
    from contextlib import contextmanager
    from types import SimpleNamespace

    from triton_sam.bench import replicas_served
    from triton_sam.bench.replicas import ReplicaBenchOptions
    from triton_sam.models import get_model
    from triton_sam.repository import writer

    calls = []

    @contextmanager
    def embedded(repo):
        calls.append(("serve", repo))
        yield SimpleNamespace(http_address="h:1")

    monkeypatch.setattr(writer, "embedded_repository", lambda repo: tmp_path / "twin")
    monkeypatch.setattr(replicas_served, "embedded", embedded)
    monkeypatch.setattr(replicas_served, "bench_images", lambda options: ["img"])
    monkeypatch.setattr(
        replicas_served, "run_sessions", lambda *a, **k: calls.append(("reference", a[1])) or []
    )

    def replicas(repo, protocol, options, *, reference, **names):
        calls.append((protocol, names["session_model"]))
        return protocol

    monkeypatch.setattr(replicas_served, "run_replicas", replicas)
    reports = replicas_served.serve_and_bench_replicas(
        "sam2.1_hiera_tiny", ["http", "grpc"], ReplicaBenchOptions(), repository=tmp_path,
        progress=lambda line: None,
    )  # fmt: skip
    session = get_model("sam2.1_hiera_tiny").family.session_model
    assert reports == ["http", "grpc"]
    assert calls == [("serve", tmp_path / "twin"), ("reference", "http"),
                     ("http", session), ("grpc", session)]  # fmt: skip


def test_an_optional_model_refused_by_its_gate_is_printed_and_the_export_exits_1(
    monkeypatch, tmp_path
):
    """The rest of the repository is written (and listed), but a refused everything decoder
    makes `export` fail loudly, naming the model and the gate's message."""
    from triton_sam.export import ExportResult
    from triton_sam.setup import pipeline

    def build(spec, repo, **_):
        return pipeline.RepositoryBuild(
            export=ExportResult(graphs={}),
            models=("sam2_encoder", "sam2_decoder", "sam2_session"),
            onnx_bytes={},
            checkpoint=None,
            not_written={
                "sam2_everything_decoder": "stability_scores: max diff 0.3 > 4/area",
                "sam2_everything": "its decoder was not written",
            },
        )

    monkeypatch.setattr(pipeline, "build_repository", build)
    result = _invoke(
        "export", "sam2.1_hiera_tiny", "--random-init", "--repository", str(tmp_path / "repo")
    )
    assert result.exit_code == 1, result.output
    assert f"wrote {tmp_path / 'repo' / 'sam2_session'}" in result.output
    assert "NOT written: sam2_everything_decoder: stability_scores" in result.output
    assert "NOT written: sam2_everything: its decoder" in result.output


def test_soak_and_storm_hand_the_served_server_to_their_runner(monkeypatch, tmp_path):
    """`bench soak` / `bench storm` pass --url's server as one Served (the storm clicks
    through its family's session model) and exit 1 on what the run failed."""
    from types import SimpleNamespace

    from triton_sam.bench import soak, storm

    calls = {}

    def runner(name, failed):
        def run(server, settings, **kwargs):
            calls[name] = (server, settings, kwargs)
            return SimpleNamespace(failures=failed, transport_errors=0)

        return run

    def written(report, output):
        (tmp_path / "r.md").write_text("report")
        return {"md": tmp_path / "r.md"}

    for module in (soak, storm):
        monkeypatch.setattr(module, "write_report", written)
    monkeypatch.setattr(soak, "run_soak_on_server", runner("soak", 1))
    monkeypatch.setattr(storm, "run_storm_on_server", runner("storm", 0))
    result = _invoke("bench", "soak", "--url", "h:1", "--model-type", "sam1", "--sessions", "3")
    assert result.exit_code == 1, result.output
    server, settings, kwargs = calls["soak"]
    assert (server.url, server.family, server.name, settings.sessions) == ("h:1", "sam1", "sam1", 3)
    assert kwargs["protocol"] == "grpc"
    result = _invoke("bench", "storm", "--url", "h:2", "--embeds", "4,8")
    assert result.exit_code == 0, result.output
    server, settings, _ = calls["storm"]
    assert (server.url, server.session_model, settings.embeds) == ("h:2", "sam2_session", (4, 8))
