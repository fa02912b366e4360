"""Session fixtures shared by the slow tiers: random-init models, each exported once.

``sam2_tiny_checkpoint`` is an official-format checkpoint of the official config's random
initialisation. ``sam2_tiny_export`` is its export into a production repository (target
``onnxruntime``: the configs ``docker compose`` serves on GPU); ``sam2_tiny_repository`` is
what the embedded server serves of it: the same configs with only what a CPU host cannot do
changed (``embedded_repository``), on Triton's onnxruntime backend; ``sam2_tiny_server``
serves it on free ports. ``sam1_vit_b_*`` is the same for SAM1 ViT-B, exported with external
data forced on, so the ``.onnx_data`` sidecar path is what the embedded Triton loads.
Every export goes through ``obtain_checkpoint`` as ``--checkpoint FILE`` does: these seeded
checkpoints are not the published files, so they stand for a user's fine-tuned checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The shared servers below are session-scoped (one export, one server, many test files), but
# each is stopped right after the last collected test that uses it, not at the end of the
# session: a tritonserver holding a model stays resident, and with every family's server alive
# at once the full suite outgrew the 24 GB CI machine (the OOM killer took a server mid-run).
_SHARED_SERVERS: dict[str, object] = {}  # fixture name -> running EmbeddedTriton
_LAST_USERS: dict[str, list[str]] = {}  # test node id -> shared-server fixtures it is last for


def _shared_server(name: str, repository: Path, **options: object):
    from triton_sam.server import EmbeddedTriton

    with EmbeddedTriton(repository, http_port=0, grpc_port=0, metrics_port=0, **options) as server:
        _SHARED_SERVERS[name] = server
        yield server
        _SHARED_SERVERS.pop(name, None)


def pytest_collection_finish(session: pytest.Session) -> None:
    last: dict[str, str] = {}
    for item in session.items:  # after deselection: the tests that will really run
        names = [n for n in getattr(item, "fixturenames", ()) if n.endswith("_server")]
        for marker in item.iter_markers("uses_servers"):  # fetched with getfixturevalue
            names += marker.args
        for name in names:
            last[name] = item.nodeid
    _LAST_USERS.clear()
    for name, nodeid in last.items():
        _LAST_USERS.setdefault(nodeid, []).append(name)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Tests marked ``alone`` run after every other test, in their own order. By then each
    shared server has been stopped after its last user, so a test that starts large servers
    of its own has the machine's memory to itself (the Paintera replay's three-family
    server, 6 GB resident, beside the shared ones ran the 24 GB CI machine out of memory)."""
    alone = [item for item in items if item.get_closest_marker("alone")]
    items[:] = [item for item in items if not item.get_closest_marker("alone")] + alone


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield  # module fixtures holding clients of the server are finalised first
    for name in _LAST_USERS.get(item.nodeid, ()):
        server = _SHARED_SERVERS.pop(name, None)
        if server is not None:
            server.stop()  # idempotent: the fixture's own exit at session end is a no-op


# -- time per tier ----------------------------------------------------------------------------
# One pytest run covers several tiers (tests/<tier>/...): the session fixtures above are shared
# across them (one export serves export, integration and parity tests), so splitting the tiers
# into separate runs would build each export again. The time of each test (setup, call,
# teardown: a session fixture's build counts in the first test that needs it) is summed by
# tier and printed at the end; TRITON_SAM_TIER_TIMES=FILE also writes it there (.ci/run).
_TIER_SECONDS: dict[str, float] = {}
_TIER_TESTS: dict[str, int] = {}


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _tier(report.nodeid)
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _TIER_TESTS[tier] = _TIER_TESTS.get(tier, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _TIER_SECONDS:
        return
    lines = [
        f"{tier:<12} {seconds:8.0f} s  {_TIER_TESTS.get(tier, 0):5d} tests"
        for tier, seconds in sorted(_TIER_SECONDS.items())
    ]
    terminalreporter.write_sep("-", "time per tier (setup + call + teardown)")
    for line in lines:
        terminalreporter.write_line(line)
    path = os.environ.get("TRITON_SAM_TIER_TIMES")
    if path:
        with open(path, "a") as out:
            out.writelines(f"{line}\n" for line in lines)


@pytest.fixture(scope="session")
def sam2_tiny_spec():
    from triton_sam.models import get_model

    return get_model("sam2.1_hiera_tiny")


@pytest.fixture(scope="session")
def sam2_tiny_checkpoint(sam2_tiny_spec, tmp_path_factory) -> Path:
    from triton_sam.export import save_random_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "sam2.1_hiera_tiny.pt"
    return save_random_checkpoint(sam2_tiny_spec, path, seed=1)


def user_checkpoint(spec, path: Path, tmp_path_factory) -> Path:
    """``path`` as the CLI's ``--checkpoint FILE`` resolves it (an empty checkpoints dir)."""
    from triton_sam.setup.pipeline import obtain_checkpoint

    empty = tmp_path_factory.mktemp("no_checkpoints")
    return obtain_checkpoint(spec, checkpoint=path, checkpoints_dir=empty, download=False)


@pytest.fixture(scope="session")
def sam2_tiny_build(sam2_tiny_spec, sam2_tiny_checkpoint, tmp_path_factory):
    """(production repository, RepositoryBuild) of the one SAM2.1-tiny export of the session:
    GPU configs, as compose serves them."""
    from triton_sam.setup.pipeline import build_repository

    repo = tmp_path_factory.mktemp("sam2_tiny") / "model_repository"
    build = build_repository(
        sam2_tiny_spec,
        repo,
        checkpoint=user_checkpoint(sam2_tiny_spec, sam2_tiny_checkpoint, tmp_path_factory),
        everything=True,  # as `setup` writes it: segment everything too
    )
    return repo, build


@pytest.fixture(scope="session")
def sam2_tiny_export(sam2_tiny_build) -> Path:
    """The production repository (GPU configs, as compose serves them) of SAM2.1-tiny."""
    return sam2_tiny_build[0]


@pytest.fixture(scope="session")
def sam2_tiny_repository(sam2_tiny_export) -> Path:
    """``sam2_tiny_export`` as the embedded server serves it (CPU twins, onnxruntime backend)."""
    from triton_sam.repository.writer import embedded_repository

    return embedded_repository(sam2_tiny_export)


@pytest.fixture(scope="session")
def sam2_tiny_server(sam2_tiny_repository):
    yield from _shared_server("sam2_tiny_server", sam2_tiny_repository)


@pytest.fixture(scope="session")
def sam1_vit_b_spec():
    from triton_sam.models import get_model

    return get_model("sam1_vit_b")


@pytest.fixture(scope="session")
def sam1_vit_b_checkpoint(sam1_vit_b_spec, tmp_path_factory) -> Path:
    from triton_sam.export import save_random_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / sam1_vit_b_spec.checkpoint.filename
    return save_random_checkpoint(sam1_vit_b_spec, path, seed=1)


@pytest.fixture(scope="session")
def sam1_vit_b_build(sam1_vit_b_spec, sam1_vit_b_checkpoint, tmp_path_factory):
    """(served repository, RepositoryBuild) of the one ViT-B export of the session (~1-3 min):
    production configs, served as their CPU twins on the onnxruntime backend."""
    from triton_sam.export import ExportOptions
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import build_repository

    repo = tmp_path_factory.mktemp("sam1_vit_b") / "model_repository"
    build = build_repository(
        sam1_vit_b_spec,
        repo,
        checkpoint=user_checkpoint(sam1_vit_b_spec, sam1_vit_b_checkpoint, tmp_path_factory),
        export_options=ExportOptions(external_data=True),
        everything=True,  # as `setup` writes it: segment everything too
    )
    return embedded_repository(repo), build


@pytest.fixture(scope="session")
def sam1_vit_b_server(sam1_vit_b_build):
    yield from _shared_server("sam1_vit_b_server", sam1_vit_b_build[0])


@pytest.fixture(scope="session")
def sam3_spec():
    from triton_sam.models import get_model

    return get_model("sam3_tracker")


@pytest.fixture(scope="session")
def sam3_small_checkpoint(sam3_spec, tmp_path_factory) -> Path:
    """A small random-init Sam3TrackerModel directory with the real tensor contract."""
    from triton_sam.export import sam3

    path = tmp_path_factory.mktemp("ckpt") / "sam3_small"
    return sam3.save_random_checkpoint(sam3_spec, path, seed=1, config=sam3.small_config())


@pytest.fixture(scope="session")
def sam3_video_checkpoint(tmp_path_factory) -> Path:
    """A seeded small ``Sam3TrackerVideoModel`` directory with facebook/sam3's tensor contract."""
    from triton_sam.export.sam3_video import save_random_video_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "sam3_video_small"
    return save_random_video_checkpoint(path, seed=0)


@pytest.fixture(scope="session")
def sam3_video_build(sam3_spec, sam3_video_checkpoint, tmp_path_factory):
    """(production repository, VideoRepositoryBuild): the small model's five tracking graphs,
    verified against transformers, with ``sam3_tracker``, as ``triton-sam setup-video
    sam3_tracker --checkpoint DIR`` writes them (~40 s)."""
    from triton_sam.repository.video_config import TrackerOptions
    from triton_sam.setup.pipeline import build_video_repository

    repo = tmp_path_factory.mktemp("sam3_video") / "model_repository"
    options = TrackerOptions(max_sessions=3, max_tenant_sessions=2, evict_idle_s=0)
    build = build_video_repository(
        sam3_spec, repo, checkpoint=sam3_video_checkpoint, tracker_options=options
    )
    return repo, build


@pytest.fixture(scope="session")
def sam3_onnx_community_pair(sam3_spec, sam3_small_checkpoint, tmp_path_factory) -> Path:
    """The small model exported in the onnx-community layout: ``<dir>/onnx/*.onnx(_data)``."""
    from triton_sam.export import sam3

    out = tmp_path_factory.mktemp("sam3-tracker-ONNX")
    sam3.export_onnx_community_pair(sam3_spec, sam3_small_checkpoint, out / "onnx")
    return out


@pytest.fixture(scope="session")
def sam3_build(sam3_spec, sam3_small_checkpoint, sam3_onnx_community_pair, tmp_path_factory):
    """(served repository, RepositoryBuild): our export as sam3_encoder/sam3_decoder and the
    imported onnx-community pair as sam3c_encoder/sam3c_decoder, production configs in one
    repository, served as their CPU twins on the onnxruntime backend."""
    from triton_sam.models.sam3 import (
        ONNX_COMMUNITY_DECODER,
        ONNX_COMMUNITY_ENCODER,
        SAM3_ONNX_COMMUNITY_FAMILY,
    )
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.importer import find_pair, import_onnx_pair
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import build_repository

    repo = tmp_path_factory.mktemp("sam3") / "model_repository"
    options = RepositoryOptions()
    checkpoint = user_checkpoint(sam3_spec, sam3_small_checkpoint, tmp_path_factory)
    build = build_repository(sam3_spec, repo, checkpoint=checkpoint, repository_options=options)
    encoder, decoder = find_pair(
        sam3_onnx_community_pair, ONNX_COMMUNITY_ENCODER, ONNX_COMMUNITY_DECODER
    )
    import_onnx_pair(
        repo,
        SAM3_ONNX_COMMUNITY_FAMILY,
        encoder_onnx=encoder,
        decoder_onnx=decoder,
        options=options,
        encoder_name="sam3c_encoder",
        decoder_name="sam3c_decoder",
    )
    return embedded_repository(repo), build


@pytest.fixture(scope="session")
def sam3_server(sam3_build):
    yield from _shared_server("sam3_server", sam3_build[0])


@pytest.fixture(scope="session")
def concept_spec():
    """The small SAM3 concept variant (width 64, the real 1008/288/32-token/200-query shapes)."""
    from triton_sam.export.sam3_concept import small_spec

    return small_spec()


@pytest.fixture(scope="session")
def concept_checkpoint(concept_spec, tmp_path_factory) -> Path:
    """A random-init Sam3Model directory (re-scaled weights) with the toy CLIP tokenizer."""
    from triton_sam.export import sam3_concept

    path = tmp_path_factory.mktemp("ckpt") / "sam3_concept_small"
    return sam3_concept.save_random_checkpoint(concept_spec, path, seed=0)


# Bounds of the test repository's serving model: a pixel limit low enough for a refused image
# to be small on the wire, and two images kept (a third evicts the first).
CONCEPT_MAX_IMAGE_PIXELS = 1_000_000
CONCEPT_MAX_IMAGES = 2


@pytest.fixture(scope="session")
def concept_build(concept_spec, concept_checkpoint, tmp_path_factory):
    """(served repository, RepositoryBuild): the three verified graphs + ``sam3_concept``,
    production configs served as their CPU twins on the onnxruntime backend (~1-2 min:
    export, ORT-vs-torch verification, write)."""
    from triton_sam.repository.concept import ConceptOptions
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import build_repository

    repo = tmp_path_factory.mktemp("sam3_concept") / "model_repository"
    build = build_repository(
        concept_spec,
        repo,
        checkpoint=concept_checkpoint,
        concept=ConceptOptions(
            max_image_pixels=CONCEPT_MAX_IMAGE_PIXELS, max_images=CONCEPT_MAX_IMAGES
        ),
    )
    return embedded_repository(repo), build


@pytest.fixture(scope="session")
def concept_server(concept_build):
    yield from _shared_server("concept_server", concept_build[0])


@pytest.fixture(scope="session")
def sam2_tracking_checkpoint(sam2_tiny_checkpoint, tmp_path_factory) -> Path:
    """``sam2_tiny_checkpoint`` with its mask and object-score output layers scaled so that
    tracking is not degenerate (see tests/video_support.py)."""
    from video_support import tracking_checkpoint

    return tracking_checkpoint(
        sam2_tiny_checkpoint, tmp_path_factory.mktemp("ckpt") / "sam2.1_tiny_tracking.pt"
    )


@pytest.fixture(scope="session")
def sam2_video_export(sam2_tiny_spec, sam2_tracking_checkpoint, tmp_path_factory):
    """The five tracking graphs of the tracking checkpoint, verified against torch (~3 min)."""
    from triton_sam.export.sam2_video import export_video

    out = tmp_path_factory.mktemp("sam2_video") / "graphs"
    return export_video(sam2_tiny_spec, sam2_tracking_checkpoint, out)


@pytest.fixture(scope="session")
def video_clip(tmp_path_factory) -> Path:
    """The synthetic clip of tests/video_support.py as a folder of JPEG frames."""
    from video_support import write_clip

    return write_clip(tmp_path_factory.mktemp("clip") / "frames")


@pytest.fixture(scope="session")
def upstream_video_run(sam2_tiny_spec, sam2_tracking_checkpoint, video_clip):
    """The parity scenario through SAM2VideoPredictor (CPU, fp32; ~2 min on 2 free cores)."""
    from video_support import run_scenario, upstream_predictor

    predictor = upstream_predictor(sam2_tiny_spec, sam2_tracking_checkpoint)
    state = predictor.init_state(video_clip)
    return run_scenario(predictor, state, predictor.scores)


@pytest.fixture(scope="session")
def concept_video_export(tmp_path_factory):
    """The seeded small Sam3VideoModel of tests/concept_video_e2e_support.py exported (the
    detector's, the tracker's and the shared vision graph; ~23 s), shared by the in-process
    parity tests of the pipeline and of the served model's request handling."""
    from concept_video_e2e_support import export_graphs

    return export_graphs(tmp_path_factory.mktemp("concept_video"))


@pytest.fixture(scope="session")
def concept_video_build(tmp_path_factory):
    """(repository, export): what ``setup-video sam3_concept_video`` writes, from the seeded
    small model of ``tests/concept_video_e2e_support.py`` (unverified here, as
    ``export_graphs``: the parity tests check the graphs)."""
    from concept_video_e2e_support import random_video_model

    from triton_sam.export import ExportOptions
    from triton_sam.export.sam3_concept import toy_tokenizer
    from triton_sam.setup.concept_video import build_concept_video_repository

    tmp = tmp_path_factory.mktemp("concept_video_served")
    repo = tmp / "model_repository"
    build = build_concept_video_repository(
        repo, random_video_model(), toy_tokenizer(),
        export_options=ExportOptions(verify=False), work_dir=tmp / "export",
    )  # fmt: skip
    assert build.models[-1] == "sam3_concept_video"
    return repo, build.export


@pytest.fixture(scope="session")
def concept_video_server(concept_video_build):
    """``concept_video_build`` served (the model's service and the page's tests share it)."""
    from triton_sam.repository.writer import embedded_repository

    repository = embedded_repository(concept_video_build[0])
    yield from _shared_server("concept_video_server", repository, startup_timeout_s=180.0)
