"""Hostile clients against the session model (``sam2_session``), SAM2.1-tiny, embedded Triton.

Raw ``tritonclient`` requests bypass our client, as a hostile lab member's would. The server
forwards the tenant header (``triton-sam-tenant``, what the proxy sets from a bearer token);
a test acts as tenant X by sending that header itself, as the proxy does.

- kept logits: a client cannot name where logits are kept (``logits_key`` as an input is
  refused), a key the server did not issue is a miss, and nobody (another tenant, or a
  client of the same tenant) can read or overwrite a victim's kept logits: the victim's
  refinement by key is bit-identical to the same click sending the mask itself;
- prompts are never reinterpreted: ten boxes as corner points, two prompt sets in one
  request, each refused naming the field; a pixel click at 1e9 names ``points``;
- tenancy: another tenant's image is a miss for a probe and a predict, an embed of the same
  picture runs the encoder again (nothing tells that it was embedded), the same tenant
  shares its cache; a request naming its tenant twice (header + body parameter) is refused.

Each refusal answers 400 (InvalidInput) or 404 (EmbeddingNotFound) with the protocol's code,
and the server is ready afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from triton_sam.models import get_family
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SESSION = "sam2_session"
FAMILY = get_family("sam2")
LIMIT = FAMILY.preprocessing.low_res_logit_limit
IMAGE = sample_image(160, 120, seed=11)
OTHER = sample_image(160, 120, seed=12)
DECODED = ("masks", "iou_predictions")


@pytest.fixture(scope="module")
def raw(sam2_tiny_server):
    # The session's server: EmbeddedTriton forwards the tenant header by default (as serve,
    # compose and Kubernetes do), so a server of this module's own, started with the same
    # forward flags, was a second server of the same configuration. The images and tenants
    # used below are this module's alone.
    client = httpclient.InferenceServerClient(sam2_tiny_server.http_address)
    yield client
    client.close()


def infer(client, inputs, outputs=("encoded",), *, tenant=None, parameters=None):
    """One raw KServe v2 request (binary tensors) as ``tenant`` (None: no header)."""
    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
    headers = None if tenant is None else {TENANT_HEADER: tenant}
    result = client.infer(SESSION, tensors, outputs=wanted, headers=headers, parameters=parameters)
    return {n: result.as_numpy(n) for n in outputs}


def refused(client, inputs, outputs=DECODED, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        infer(client, inputs, outputs, **kwargs)
    assert client.is_server_ready() and client.is_model_ready(SESSION)
    return info.value


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=np.object_)


def string(out: np.ndarray) -> str:
    return bytes(out.reshape(-1)[0]).decode()


def embed(client, image, tenant=None) -> tuple[str, int]:
    out = infer(client, {"image_rgb": image[None]}, ("encoded", "image_id"), tenant=tenant)
    return string(out["image_id"]), int(out["encoded"].reshape(-1)[0])


def click(image_id: str, x: float = 60.0, y: float = 50.0) -> dict[str, np.ndarray]:
    """One foreground click in the model frame (plus SAM2's padding point)."""
    return {
        "image_id": text(image_id),
        "point_coords": np.array([[[x, y], [0.0, 0.0]]], np.float32),
        "point_labels": np.array([[1.0, -1.0]], np.float32),
    }


# -- kept logits: keys the server issues ---------------------------------------------------
def test_a_client_chosen_logits_key_is_refused(raw):
    image_id, _ = embed(raw, IMAGE)
    error = refused(raw, {**click(image_id), "logits_key": text("mine")})
    assert error.status() == "400"
    assert "InvalidInput: logits_key: " in error.message() and "server issues" in error.message()


def test_a_previous_key_the_server_did_not_issue_is_a_miss(raw):
    image_id, _ = embed(raw, IMAGE)
    for made_up in ("0" * 32, "victim-0", ""):
        inputs = {**click(image_id), "previous_key": text(made_up)}
        error = refused(raw, {**inputs, "previous_mask_index": np.zeros((1, 1), np.int32)})
        assert error.status() == "404" and "EmbeddingNotFound" in error.message()
        assert made_up not in error.message() or not made_up  # a key is never echoed


def test_an_issued_key_is_random_and_bound_to_its_image(raw):
    image_id, _ = embed(raw, IMAGE)
    other_id, _ = embed(raw, OTHER)
    keys = {string(infer(raw, click(image_id), (*DECODED, "logits_key"))["logits_key"])}
    keys.add(string(infer(raw, click(image_id), (*DECODED, "logits_key"))["logits_key"]))
    assert len(keys) == 2 and all(len(k) == 32 for k in keys)  # 128 random bits each
    key = keys.pop()
    refine = {"previous_key": text(key), "previous_mask_index": np.zeros((1, 1), np.int32)}
    infer(raw, {**click(image_id), **refine}, DECODED)  # found on its own image
    error = refused(raw, {**click(other_id), **refine})  # another image: not found
    assert error.status() == "404" and "EmbeddingNotFound" in error.message()


@pytest.mark.parametrize("attacker", ["other tenant", "same tenant"])
def test_nobody_can_overwrite_or_read_a_victims_kept_logits(raw, attacker):
    victim = "lab-a"
    hostile = "lab-b" if attacker == "other tenant" else victim
    image_id, _ = embed(raw, IMAGE, victim)
    embed(raw, IMAGE, hostile)
    first = infer(raw, click(image_id), (*DECODED, "logits_key"), tenant=victim)
    key = string(first["logits_key"])
    # The old attack: another click naming the victim's key as where to keep its logits.
    error = refused(raw, {**click(image_id, 10, 10), "logits_key": text(key)}, tenant=hostile)
    assert error.status() == "400" and "logits_key: " in error.message()
    # Its own clicks get keys of their own; the victim's key is not touched.
    for _ in range(3):
        out = infer(raw, click(image_id, 10, 10), (*DECODED, "logits_key"), tenant=hostile)
        assert string(out["logits_key"]) != key
    refine = {"previous_key": text(key), "previous_mask_index": np.zeros((1, 1), np.int32)}
    if attacker == "other tenant":  # another tenant cannot even read it
        error = refused(raw, {**click(image_id), **refine}, tenant=hostile)
        assert error.status() == "404" and "EmbeddingNotFound" in error.message()
    # The victim's refinement by key equals the same click sending the mask itself.
    by_key = infer(raw, {**click(image_id), **refine}, DECODED, tenant=victim)
    mask = np.clip(first["masks"][:, :1], -LIMIT, LIMIT).astype(np.float32)
    explicit = {"mask_input": mask, "has_mask_input": np.ones((1, 1), np.float32)}
    stateless = infer(raw, {**click(image_id), **explicit}, DECODED, tenant=victim)
    np.testing.assert_array_equal(by_key["masks"], stateless["masks"])
    np.testing.assert_array_equal(by_key["iou_predictions"], stateless["iou_predictions"])


def test_a_previous_key_with_a_mask_is_refused(raw):
    image_id, _ = embed(raw, IMAGE)
    key = string(infer(raw, click(image_id), (*DECODED, "logits_key"))["logits_key"])
    inputs = {
        **click(image_id),
        "previous_key": text(key),
        "mask_input": np.zeros((1, 1, 256, 256), np.float32),
        "has_mask_input": np.ones((1, 1), np.float32),
    }
    error = refused(raw, inputs)
    assert error.status() == "400" and "previous_key: sent with mask_input" in error.message()


# -- prompts are never reinterpreted ------------------------------------------------------
def test_ten_boxes_in_the_model_frame_are_refused(raw):
    image_id, _ = embed(raw, IMAGE)
    boxes = {
        "image_id": text(image_id),
        "point_coords": np.tile(np.array([[10, 10], [80, 60]], np.float32), (10, 1))[None],
        "point_labels": np.tile(np.array([2, 3], np.float32), 10)[None],
    }
    error = refused(raw, boxes)
    assert error.status() == "400"
    assert "InvalidInput: point_labels: got 10 boxes" in error.message()
    one = {k: v[:, :2] if k != "image_id" else v for k, v in boxes.items()}
    assert infer(raw, one, DECODED)["masks"].shape == (1, 1, 256, 256)  # one box is served


def test_two_prompt_sets_in_the_pixel_frame_are_refused(raw):
    image_id, _ = embed(raw, IMAGE)
    two = {
        "image_id": np.array([[image_id.encode()], [image_id.encode()]], dtype=np.object_),
        "points": np.array([[[30, 30]], [[90, 70]]], np.float32),
        "labels": np.array([[1], [1]], np.int32),
    }
    error = refused(raw, two, ("masks_rle", "mask_scores"))
    assert error.status() == "400"
    assert "InvalidInput: image_id: got 2 prompt sets" in error.message()
    assert "expected 1 per request" in error.message()
    # Triton refuses inputs whose batch sizes differ; without an image id, the image's
    # batch dimension is named (an embed of two images with one click each).
    two_images = {**two, "image_rgb": np.stack([IMAGE, OTHER])}
    del two_images["image_id"]
    error = refused(raw, two_images, ("masks_rle", "mask_scores"))
    assert "InvalidInput: image_rgb: got 2 prompt sets" in error.message()


def test_a_pixel_click_out_of_range_names_points(raw):
    image_id, _ = embed(raw, IMAGE)
    far = {
        "image_id": text(image_id),
        "points": np.array([[[1e9, 5.0]]], np.float32),
        "labels": np.array([[1]], np.int32),
    }
    error = refused(raw, far, ("masks_rle", "mask_scores"))
    assert error.status() == "400" and "InvalidInput: points: " in error.message()
    assert "point_coords" not in error.message()


# -- tenancy --------------------------------------------------------------------------------
def test_another_tenants_image_is_a_miss_and_membership_stays_hidden(raw):
    image = sample_image(160, 120, seed=21)  # embedded by nobody else in this module
    image_id, encoded = embed(raw, image, "team-y")
    assert encoded == 1
    probe = {"image_id": text(image_id)}
    error = refused(raw, probe, ("encoded",), tenant="team-x")
    assert error.status() == "404" and "EmbeddingNotFound" in error.message()
    error = refused(raw, click(image_id), tenant="team-x")
    assert error.status() == "404" and "EmbeddingNotFound" in error.message()
    error = refused(raw, probe, ("encoded",))  # the default tenant is a tenant too
    assert error.status() == "404"
    # An embed of the same picture runs the encoder again: nothing says Y embedded it.
    assert embed(raw, image, "team-x") == (image_id, 1)
    # Within one tenant the content-addressed cache is shared.
    assert int(infer(raw, probe, ("encoded",), tenant="team-y")["encoded"].reshape(-1)[0]) == 0
    assert embed(raw, image, "team-y") == (image_id, 0)


def test_a_request_naming_its_tenant_twice_is_refused(raw):
    image_id, _ = embed(raw, IMAGE, "team-y")
    probe = {"image_id": text(image_id)}
    error = refused(raw, probe, ("encoded",), tenant="team-x", parameters={TENANT_HEADER: "team-y"})
    assert error.status() == "400"
    assert f"InvalidInput: {TENANT_HEADER}: given 2 times" in error.message()
