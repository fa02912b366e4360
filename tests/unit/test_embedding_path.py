"""Server-side embeddings without a server: the session model's LRU, its config, the writer,
and the clients' pure request builders."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from triton_sam.client import embedding_path, wire
from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.client.transport import translate_error
from triton_sam.errors import EmbeddingNotFoundError, InputValidationError
from triton_sam.models import get_family
from triton_sam.repository import session_config
from triton_sam.repository.config import RepositoryOptions, model_config_pb2, parse_config
from triton_sam.repository.session_config import (
    SessionOptions,
    build_session_config,
    render_session_config,
    write_session,
)
from triton_sam.repository.writer import embedded_repository, list_models
from triton_sam.serving.embedding_cache import embedder, metrics, store
from triton_sam.serving.embedding_cache.requests import Inputs
from triton_sam.serving.embedding_cache.settings import SessionSettings
from triton_sam.serving.protocol import embedding_cache as protocol

SAM2 = get_family("sam2")
REPO = Path(__file__).resolve().parents[2] / "model_repository"


# -- the LRU -----------------------------------------------------------------------------------
def _ids(*names, tenant=""):
    return [(tenant, n) for n in names]


def test_lru_keeps_at_most_max_images_and_evicts_the_oldest():
    cache = store.EmbeddingCache(max_images=2)
    a, b, c = (store.Scoped("", n) for n in "abc")
    assert cache.put(a, {}, 10) == [] and cache.put(b, {}, 10) == []
    cache.get(a)  # a is now the most recent
    assert cache.put(c, {}, 10) == [b]
    assert cache.ids() == _ids("a", "c") and cache.nbytes == 20 and cache.evictions == 1
    with pytest.raises(store.EmbeddingMiss, match="'b'"):
        cache.get(b)


def test_lru_byte_bound_counts_kept_logits():
    cache = store.EmbeddingCache(max_images=10, max_bytes=100, logits_per_image=2)
    a, b = store.Scoped("", "a"), store.Scoped("", "b")
    cache.put(a, {}, 40)
    cache.put(b, {}, 40)
    logits = np.zeros(5, np.float32)  # 20 bytes
    k1, evicted = cache.keep_logits(b, logits)
    assert evicted == []
    k2, evicted = cache.keep_logits(b, logits)
    assert evicted == [a]  # 40 + 40 + 40 > 100
    k3, _ = cache.keep_logits(b, logits)  # only 2 kept per image: k1 dropped
    assert cache.nbytes == 80 and len(cache) == 1
    with pytest.raises(store.EmbeddingMiss):
        cache.get_logits(b, k1)
    assert cache.get_logits(b, k3) is logits and cache.get_logits(b, k2) is logits


def test_kept_logits_keys_are_issued_random_and_bound_to_image_and_tenant():
    cache = store.EmbeddingCache(max_images=10)
    mine, other_image = store.Scoped("x", "a"), store.Scoped("x", "b")
    other_tenant = store.Scoped("y", "a")
    for scoped in (mine, other_image, other_tenant):
        cache.put(scoped, {}, 10)
    logits = np.ones(4, np.float32)
    keys = {cache.keep_logits(mine, logits)[0] for _ in range(3)}
    assert len(keys) == 3 and all(len(k) == 32 and int(k, 16) >= 0 for k in keys)  # 128 bits
    key = keys.pop()
    assert cache.get_logits(mine, key) is logits
    for scoped in (other_image, other_tenant):  # the same key elsewhere: a miss
        with pytest.raises(store.EmbeddingMiss) as info:
            cache.get_logits(scoped, key)
        assert key not in str(info.value)  # a capability stays out of messages
    for made_up in ("", "0" * 32, "k1"):
        with pytest.raises(store.EmbeddingMiss):
            cache.get_logits(mine, made_up)
    assert store.EmbeddingCache(max_images=1, logits_per_image=0).keep_logits(mine, logits) == (
        "",
        [],
    )


def test_lru_keeps_one_image_larger_than_the_byte_bound():
    cache = store.EmbeddingCache(max_images=4, max_bytes=10)
    a, b = store.Scoped("", "a"), store.Scoped("", "b")
    cache.put(a, {}, 50)
    assert cache.put(b, {}, 50) == [a] and cache.ids() == _ids("b")


def test_reembedding_an_id_replaces_its_bytes():
    cache = store.EmbeddingCache(max_images=4)
    a = store.Scoped("", "a")
    cache.put(a, {}, 50)
    cache.put(a, {}, 30)
    assert cache.nbytes == 30 and len(cache) == 1


def test_the_same_image_in_two_tenants_is_two_entries():
    cache = store.EmbeddingCache(max_images=4)
    cache.put(store.Scoped("x", "a"), {"f": 1}, 10)
    assert store.Scoped("y", "a") not in cache
    with pytest.raises(store.EmbeddingMiss, match="'a'") as info:
        cache.get(store.Scoped("y", "a"))
    assert "x" not in str(info.value).replace("'a'", "")  # the other tenant is not named


def test_the_shipped_session_model_reads_the_one_protocol_without_triton_sam(tmp_path):
    """What Triton's stub does: model.py with the shipped package beside it, no triton_sam."""
    repo = tmp_path / "model_repository"
    write_session(repo, SAM2, RepositoryOptions())
    version = repo / "sam2_session" / "1"
    stub = tmp_path / "stub" / "triton_python_backend_utils.py"
    stub.parent.mkdir()
    stub.write_text("")
    code = (
        "import sys, importlib.util;"
        "spec = importlib.util.spec_from_file_location('model', sys.argv[1] + '/model.py');"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "assert not any(n == 'triton_sam' or n.startswith('triton_sam.') for n in sys.modules);"
        "print(m.protocol.__name__, m.envelope.ERR_EMBEDDING_NOT_FOUND)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(version)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(stub.parent)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "triton_sam_serving.protocol.embedding_cache",
        "EmbeddingNotFound",
    ]


def test_the_renderer_writes_every_parameter_the_protocol_names_and_its_kind():
    config = build_session_config(SAM2, RepositoryOptions())
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert set(params) == set(protocol.PARAM_KEYS)
    assert params[protocol.PARAM_KIND] == protocol.KIND_EMBEDDING_CACHE


def test_a_miss_is_known_by_its_code_and_status_not_by_prose():
    from tritonclient.utils import InferenceServerException

    header = "triton_sam.EmbeddingNotFound: image_id 'x' is not cached"
    for status, message, miss in [
        ("404", header, True),
        ("StatusCode.NOT_FOUND", header, True),
        ("400", header, False),  # the code is answered with NOT_FOUND, never 400
        ("404", "Request for unknown model: 'sam2_session' is not found", False),
        ("500", f"Internal: quoting {header}", False),
    ]:
        error = translate_error(
            InferenceServerException(msg=message, status=status), what="infer on sam2_session"
        )
        assert isinstance(error, EmbeddingNotFoundError) == miss, (status, message)


# -- the config --------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["sam1", "sam2"])
def test_session_config_follows_the_spec(family):
    spec = get_family(family)
    config = build_session_config(spec, RepositoryOptions(target="python"))
    inputs = {t.name: t for t in config.input}
    assert config.name == f"{family}_session" and config.backend == "python"
    # every input optional: an embed sends only an image, the server answers its id
    assert all(t.optional for t in inputs.values())
    assert inputs["image_bytes"].data_type == model_config_pb2.TYPE_STRING
    assert inputs["image_rgb"].data_type == model_config_pb2.TYPE_UINT8
    assert list(inputs["image_rgb"].dims) == [-1, -1, 3]
    for t in (*spec.encoder_inputs, *spec.decoder_inputs):
        assert (t.name in inputs) == (t.name not in spec.embedding_names)
    outputs = [t.name for t in config.output]
    finished = ["masks_rle", "masks_png", "masks_bits", "mask_boxes", "mask_scores", "image_size"]
    decoder = [t.name for t in spec.decoder_outputs]
    # point_list: SAM1, SAM2; logits_key: the key the server issues for kept logits
    features = list(spec.embedding_names)  # read back by the everything model
    assert outputs == decoder + ["encoded", "image_id", "logits_key", *finished, *features]
    for name in ("points", "labels", "box", "multimask_output"):
        assert inputs[name].optional
    (group,) = config.instance_group
    assert group.count == 1 and group.kind == group.KIND_CPU
    assert config.HasField("dynamic_batching")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert set(params) == set(protocol.PARAM_KEYS)
    assert params["embedding_names"] == ",".join(spec.embedding_names)
    assert params["max_points"] == "64" and params["max_boxes"] == "1"
    assert json.loads(params["preprocessing"])["image_size"] == spec.preprocessing.image_size


def test_gpu_target_pins_one_instance_to_gpu_0():
    config = build_session_config(SAM2, RepositoryOptions(instance_count=4))
    (group,) = config.instance_group
    assert group.kind == group.KIND_GPU and group.count == 1 and list(group.gpus) == [0]
    assert config.backend == "python"  # BLS to the onnxruntime-backend encoder/decoder


def test_committed_sam2_session_config_matches_the_renderer():
    committed = (REPO / "sam2_session" / "config.pbtxt").read_text()
    assert committed == render_session_config(SAM2, RepositoryOptions())


def test_session_options_are_validated():
    with pytest.raises(InputValidationError, match="max_images"):
        SessionOptions(max_images=0)
    with pytest.raises(InputValidationError, match="max_points: got 1025"):
        SessionOptions(max_points=1025)  # above what the decoder graphs themselves accept
    assert session_config.embedding_bytes(SAM2) == 16 * 2**20
    assert session_config.embedding_bytes(get_family("sam1")) == 4 * 2**20


def test_write_session_and_its_embedded_twin(tmp_path):
    repo = tmp_path / "model_repository"
    name = write_session(repo, SAM2, RepositoryOptions(), SessionOptions(max_images=3))
    assert name == "sam2_session" and list_models(repo) == ["sam2_session"]
    assert (repo / name / "1" / "model.py").read_text() == session_config.SESSION_SOURCE.read_text()
    shipped = repo / name / "1" / "triton_sam_serving"
    files = sorted(str(p.relative_to(shipped).with_suffix("")) for p in shipped.rglob("*.py"))
    assert files == sorted(session_config.SHIPPED_MODULES)
    twin = embedded_repository(repo)
    config = parse_config(twin / name / "config.pbtxt")
    (group,) = config.instance_group
    assert group.kind == group.KIND_CPU and list(group.gpus) == []
    assert config.parameters["max_images"].string_value == "3"
    assert (twin / name / "1" / "model.py").is_file()
    assert (twin / name / "1" / "triton_sam_serving" / "intake.py").is_file()


def test_cpu_features_is_validated_and_written():
    with pytest.raises(InputValidationError, match="cpu_features: got 'disk'"):
        SessionOptions(cpu_features="disk")
    for where in protocol.CPU_FEATURES:
        config = build_session_config(SAM2, RepositoryOptions(), SessionOptions(cpu_features=where))
        assert config.parameters[protocol.PARAM_CPU_FEATURES].string_value == where
    default = build_session_config(SAM2, RepositoryOptions())
    assert default.parameters[protocol.PARAM_CPU_FEATURES].string_value == "process"


def test_session_variant_sets_the_store_and_keeps_the_rest(tmp_path):
    from triton_sam.repository.writer import read_model

    repo = tmp_path / "model_repository"
    write_session(repo, SAM2, RepositoryOptions(), SessionOptions(max_images=3))
    model = read_model(repo, "sam2_session")
    variant = session_config.session_variant(model, cpu_features="process")
    config = parse_config(variant.config_text)
    assert config.parameters[protocol.PARAM_CPU_FEATURES].string_value == "process"
    assert config.parameters["max_images"].string_value == "3"
    assert variant.files["model.py"] == session_config.SESSION_SOURCE
    with pytest.raises(InputValidationError, match="cpu_features"):
        session_config.session_variant(model, cpu_features="disk")


def test_the_clock_partitions_a_click_into_its_stages():
    clock = metrics.Clock(time.perf_counter())
    for stage in ("schedule", "intake", "feeds", "bls", "intake"):
        clock.mark(stage)
    totals = clock.totals()
    assert set(totals) == {"schedule", "intake", "feeds", "bls", "total"}
    assert set(totals) <= set(protocol.STAGES)
    assert all(v >= 0 for v in totals.values())
    # the stages are consecutive intervals of [execute, last mark]: they add up to the total
    parts = sum(v for k, v in totals.items() if k != "total")
    assert parts == pytest.approx(totals["total"], rel=1e-9, abs=1e-12)


# -- client-side builders ----------------------------------------------------------------------
def test_image_id_is_a_content_hash():
    image = np.zeros((4, 5, 3), np.uint8)
    same = embedding_path.image_id(image.copy(), SAM2, "sam2_encoder")
    assert same == embedding_path.image_id(image, SAM2, "sam2_encoder") and len(same) == 32
    changed = image.copy()
    changed[0, 0, 0] = 1
    assert embedding_path.image_id(changed, SAM2, "sam2_encoder") != same
    assert embedding_path.image_id(image, SAM2, "other_encoder") != same
    assert embedding_path.image_id(image.reshape(5, 4, 3), SAM2, "sam2_encoder") != same


def _prompts(mask_input=None):
    return build_decoder_prompts(
        point_coords=[[10, 10]],
        point_labels=[1],
        box=None,
        mask_input=mask_input,
        orig_hw=(100, 100),
        family=SAM2,
    )


def test_a_click_carries_only_the_id_and_its_prompts_and_asks_for_an_issued_key():
    image = embedding_path.CachedImage("abc", (100, 100))
    inputs, fallback = image.click_inputs(_prompts(), None)
    assert set(inputs) == {"image_id", "point_coords", "point_labels"}  # no client-chosen key
    assert inputs is fallback
    outputs = embedding_path.click_outputs(("masks", "iou_predictions"), SAM2)
    assert outputs == ("masks", "iou_predictions", "logits_key")
    assert sum(a.nbytes for a in inputs.values() if a.dtype != object) < 64
    assert wire.request_bytes("grpc", "sam2_session", inputs, outputs) < 400
    assert wire.request_bytes("http", "sam2_session", inputs, outputs) < 800


def test_the_issued_key_is_read_from_the_answer():
    answer = {"logits_key": np.array([[b"ab" * 16]], dtype=np.object_)}
    assert embedding_path.issued_key(answer) == "ab" * 16
    assert embedding_path.issued_key({"logits_key": np.array([[b""]], dtype=np.object_)}) is None
    assert embedding_path.issued_key({"masks": np.zeros(1)}) is None


def test_a_recent_mask_is_sent_by_reference_and_in_full_after_a_miss():
    image = embedding_path.CachedImage("abc", (100, 100))
    logits = np.random.default_rng(0).normal(size=(1, 3, 256, 256)).astype(np.float32)
    issued = "0123456789abcdef" * 2  # what the server answered for the first click
    image.remember(issued, logits)
    mask = logits[0, 2]
    inputs, fallback = image.click_inputs(_prompts(mask), mask)
    assert inputs["previous_key"][0, 0] == issued.encode()
    assert inputs["previous_mask_index"].tolist() == [[2]] and "mask_input" not in inputs
    assert fallback["mask_input"].shape == (1, 1, 256, 256) and "previous_key" not in fallback
    edited = mask + 1
    inputs, _ = image.click_inputs(_prompts(edited), edited)
    assert "previous_key" not in inputs and inputs["has_mask_input"].tolist() == [[1.0]]


def test_an_image_without_pixels_cannot_be_reembedded():
    with pytest.raises(EmbeddingNotFoundError, match="set_image"):
        embedding_path.CachedImage("abc", (100, 100)).embed_inputs(SAM2)


def test_the_miss_error_is_typed():
    from tritonclient.utils import InferenceServerException

    e = InferenceServerException(
        msg="triton_sam.EmbeddingNotFound: image_id 'x' is not cached",
        status="StatusCode.NOT_FOUND",
    )
    assert isinstance(translate_error(e, what="infer on sam2_session"), EmbeddingNotFoundError)


def test_the_embed_admission_bounds_are_rendered_and_checked():
    session = SessionOptions(max_concurrent_embeds=2, max_waiting_embeds=5)
    config = build_session_config(SAM2, RepositoryOptions(), session)
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[protocol.PARAM_MAX_CONCURRENT_EMBEDS] == "2"
    assert params[protocol.PARAM_MAX_WAITING_EMBEDS] == "5"
    with pytest.raises(InputValidationError, match="max_concurrent_embeds"):
        SessionOptions(max_concurrent_embeds=0)  # 0 would mean no bound at all
    with pytest.raises(InputValidationError, match="max_waiting_embeds"):
        SessionOptions(max_waiting_embeds=-1)


# -- embed admission ---------------------------------------------------------------------------
class _Request:
    def __init__(self, image_id: str, cancelled: bool = False) -> None:
        self.image_id, self.cancelled = image_id, cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled


def _admission(slots: int, waiting: int):
    """An embedder with fakes for the image it receives and the encoder run (no Triton)."""
    import asyncio

    settings = SessionSettings(max_concurrent_embeds=slots, max_waiting_embeds=max(waiting, 0))
    quiet = types.SimpleNamespace(embeds=lambda queue: None)
    runner = embedder.Embedder(
        None,
        settings,
        store.EmbeddingCache(4),
        quiet,
        pre=None,
        namespaces={},
        on_gpu=False,
        device_id=0,
    )
    runner.decoded, runner.runs = [], []
    runner.release = asyncio.Event()

    def received(inputs):
        runner.decoded.append(inputs.request.image_id)
        return inputs.request.image_id, "rgb", np.zeros((2, 2, 3), np.uint8)

    async def encode(scoped, kind, value, *, crop=False):
        runner.runs.append(scoped.image_id)
        await runner.release.wait()
        return 1, None

    runner.received_image, runner.encode = received, encode
    return runner


def _embed(runner, image_id, tenant="", cancelled=False):
    return runner.admitted(Inputs(None, _Request(image_id, cancelled)), tenant)


def test_embeds_beyond_the_line_are_refused_and_a_cancelled_one_is_answered_unrun():
    import asyncio

    from triton_sam.serving.click_queue import QueueFull

    async def main():
        runner = _admission(slots=1, waiting=1)
        first = asyncio.create_task(_embed(runner, "a"))
        await asyncio.sleep(0.05)
        stale = _Request("b")
        waiting = asyncio.create_task(runner.admitted(Inputs(None, stale), ""))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="1 embeds wait for an encoder slot"):
            await _embed(runner, "c")  # refused at once
        stale.cancelled = True  # the client gave up while it waited
        runner.release.set()
        assert await first == ("a", store.Scoped("", "a"), 1, None)
        with pytest.raises(embedder.EmbedCancelledWhileWaiting):
            await waiting
        assert runner.decoded == ["a"] and runner.runs == ["a"]  # b never decoded nor encoded
        assert (runner.queue.at_decoder, runner.queue.waiting) == (0, 0)

    asyncio.run(main())


def test_a_second_embed_of_an_image_in_work_shares_its_run_and_frees_its_slot():
    import asyncio

    async def main():
        runner = _admission(slots=2, waiting=0)
        first = asyncio.create_task(_embed(runner, "a"))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(_embed(runner, "a"))
        await asyncio.sleep(0.05)
        assert runner.queue.at_decoder == 1  # the shared run holds one slot
        runner.release.set()
        expected = ("a", store.Scoped("", "a"), 1, None)
        assert await first == expected and await second == expected
        assert runner.runs == ["a"] and runner.queue.at_decoder == 0

    asyncio.run(main())


def test_the_same_image_from_two_tenants_is_encoded_for_each():
    """A shared run would tell tenant y that tenant x is embedding this picture."""
    import asyncio

    async def main():
        runner = _admission(slots=2, waiting=0)
        first = asyncio.create_task(_embed(runner, "a", "x"))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(_embed(runner, "a", "y"))
        await asyncio.sleep(0.05)
        assert runner.queue.at_decoder == 2  # two runs, one slot each
        runner.release.set()
        assert await first == ("a", store.Scoped("x", "a"), 1, None)
        assert await second == ("a", store.Scoped("y", "a"), 1, None)
        assert runner.runs == ["a", "a"]

    asyncio.run(main())
