"""Shared by the video tests: a synthetic clip, a tracking-friendly random checkpoint, and the
parity scenario run through any predictor with SAM2VideoPredictor's API.

Random-init SAM2.1 weights give mask logits of about +-0.4 and object scores of about -0.03
whatever the prompt: every prompted frame then reads "no object", every mask is -1024 and both
objects track the same nothing. :func:`tracking_checkpoint` scales two output layers of the
official checkpoint (nothing else changes): the mask hypernetworks' last layers (logits of a
few units, foreground fractions of 20-40 %) and the object-score head's last layer, whose
bias is set so that the scenario meets both sides of the object-score gate (present: masks
and pointers from the decoder; absent: masks = -1024, pointer = no_obj_ptr, memory with
no_obj_embed_spatial). The parity test asserts both sides occur.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

# clip: odd size, two objects moving in opposite directions
CLIP_HW = (61, 83)
CLIP_FRAMES = 8
CLICK = (20.0, 25.0)  # object 1 (the disc) on frame 0
BOX = (53.0, 31.0, 67.0, 45.0)  # object 2 (the square) on frame 0
CORRECTION_FRAME = 4
LOGIT_SCALE = 20.0
SCORE_SCALE = 50.0
SCORE_SHIFT = 1.5


def write_clip(folder: Path, frames: int = CLIP_FRAMES, hw: tuple[int, int] = CLIP_HW) -> Path:
    """JPEG frames ``00000.jpg``... (what SAM2VideoPredictor.init_state reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    height, width = hw
    yy, xx = np.mgrid[0:height, 0:width]
    for t in range(frames):
        image = np.full((height, width, 3), 30, np.uint8)
        image[(xx - 20 - 3 * t) ** 2 + (yy - 25 - 2 * t) ** 2 < 64] = (220, 60, 60)
        x, y = 60 - 3 * t, 38
        image[y - 7 : y + 7, x - 7 : x + 7] = (50, 200, 90)
        Image.fromarray(image).save(folder / f"{t:05d}.jpg", quality=95)
    return folder


def correction_click(t: int = CORRECTION_FRAME) -> tuple[float, float]:
    """Where the disc is on frame ``t`` (the correction click, labelled foreground)."""
    return (20.0 + 3 * t, 25.0 + 2 * t)


def tracking_checkpoint(source: Path, dest: Path) -> Path:
    """``source`` (an official-format checkpoint) with the two output layers scaled."""
    import torch

    state = torch.load(source, weights_only=True)
    model = dict(state["model"])
    for key in list(model):
        if key.startswith("sam_mask_decoder.output_hypernetworks_mlps.") and ".layers.2." in key:
            model[key] = model[key] * LOGIT_SCALE
    weight = "sam_mask_decoder.pred_obj_score_head.layers.2.weight"
    bias = "sam_mask_decoder.pred_obj_score_head.layers.2.bias"
    model[weight] = model[weight] * SCORE_SCALE
    model[bias] = model[bias] * SCORE_SCALE + SCORE_SHIFT
    torch.save({"model": model}, dest)
    return dest


def run_scenario(
    predictor, state, scores
) -> list[tuple[str, int, list[int], np.ndarray, np.ndarray]]:
    """Clicks on frame 0 (object 1), a box (object 2), propagate forward, a correction click
    on a middle frame, propagate in reverse from the last frame.

    ``scores(state, frame_idx)`` reads the object score logits [K] the predictor holds for a
    frame. Returns one (step, frame, obj_ids, logits [K, 1, H, W], scores [K]) per output.
    """
    out = []

    def record(step, frame, ids, masks):
        out.append((step, frame, list(ids), np.asarray(masks, np.float32), scores(state, frame)))

    record("click", *predictor.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1]))
    record("box", *predictor.add_new_points_or_box(state, 0, 2, box=BOX))
    for frame, ids, masks in predictor.propagate_in_video(state):
        record("forward", frame, ids, masks)
    record(
        "correction",
        *predictor.add_new_points_or_box(
            state, CORRECTION_FRAME, 1, points=[correction_click()], labels=[1]
        ),
    )
    # In reverse from the last frame through the corrected one (4 frames keep CI short).
    last = CLIP_FRAMES - 1
    reverse = predictor.propagate_in_video(
        state, start_frame_idx=last, max_frame_num_to_track=last - CORRECTION_FRAME, reverse=True
    )
    for frame, ids, masks in reverse:
        record("reverse", frame, ids, masks)
    return out


# -- running the scenario through upstream and through ours --------------------------------
def upstream_predictor(spec, checkpoint: Path):
    """``SAM2VideoPredictor`` (fill_hole_area = 0) with one shim, and its score reader.

    The shim: upstream keeps memories in bfloat16 and relies on the float32 object pointers
    concatenated after them to promote the attention's memory to float32. A frame with no
    pointer to attend to (tracking in reverse from the last frame: the only conditioning frame
    lies ahead, and nothing was tracked after it) leaves the memory in bfloat16 and upstream
    fails in fp32 ("mat1 and mat2 must have the same dtype"; it works under CUDA autocast
    only). The shim does the promotion the pointers would have done: exact, and a no-op
    whenever a pointer is present.
    """
    from triton_sam.export.sam2_video import build_video_model

    model = build_video_model(spec, checkpoint)
    attend = model.memory_attention.forward

    def promoted(curr, memory, curr_pos=None, memory_pos=None, num_obj_ptr_tokens=0):
        return attend(curr, memory.float(), curr_pos, memory_pos, num_obj_ptr_tokens)

    model.memory_attention.forward = promoted
    return _NumpyOutputs(model)


class _NumpyOutputs:
    """Upstream's predictor with numpy masks, and its object scores per frame."""

    def __init__(self, model) -> None:
        self.model = model

    def init_state(self, video):
        return self.model.init_state(str(video))

    def add_new_points_or_box(self, *args, **kwargs):
        frame, ids, masks = self.model.add_new_points_or_box(*args, **kwargs)
        return frame, ids, masks.numpy()

    def propagate_in_video(self, *args, **kwargs):
        for frame, ids, masks in self.model.propagate_in_video(*args, **kwargs):
            yield frame, ids, masks.numpy()

    @staticmethod
    def scores(state, frame: int) -> np.ndarray:
        values = []
        for i in range(len(state["obj_ids"])):
            temp, outs = state["temp_output_dict_per_obj"][i], state["output_dict_per_obj"][i]
            out = None
            for store in (temp, outs):
                for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
                    out = out or store[key].get(frame)
            values.append(
                np.nan if out is None else float(out["object_score_logits"].reshape(-1)[0])
            )
        return np.array(values, np.float32)


def local_scores(state, frame: int) -> np.ndarray:
    """Object scores an :class:`OnnxVideoPredictor` state holds for a frame."""
    values = []
    for obj in state.session.objects.values():
        out = None
        for store in (obj.temp_outputs, obj.outputs):
            for key in ("cond_frame_outputs", "non_cond_frame_outputs"):
                out = out or store[key].get(frame)
        values.append(np.nan if out is None else float(out.object_score_logits.reshape(-1)[0]))
    return np.array(values, np.float32)


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two binary masks (1.0 when both are empty: they agree)."""
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


# -- comparing two runs ---------------------------------------------------------------------
# Tolerances, per frame and object (the reasons are in tests/parity/test_sam2_video_parity.py)
IOU_MIN = 0.99
LOGIT_ATOL = LOGIT_RTOL = 1e-3
SCORE_ATOL = 1e-3


def assert_same_as_upstream(ours, upstream) -> None:
    """Every step of two scenario runs agrees within the stated tolerances (all listed)."""
    assert [(s, f, ids) for s, f, ids, _, _ in ours] == [
        (s, f, ids) for s, f, ids, _, _ in upstream
    ]
    problems = []
    for (step, frame, ids, masks, scores), (_, _, _, ref_masks, ref_scores) in zip(
        ours, upstream, strict=True
    ):
        assert masks.shape == ref_masks.shape
        for k, obj in enumerate(ids):
            where = f"{step} frame {frame} object {obj}"
            iou = mask_iou(masks[k, 0] > 0, ref_masks[k, 0] > 0)
            if iou < IOU_MIN:
                problems.append(f"{where}: IoU {iou:.4f} < {IOU_MIN}")
            err = np.abs(masks[k] - ref_masks[k]) - LOGIT_RTOL * np.abs(ref_masks[k])
            if err.max() > LOGIT_ATOL:
                problems.append(f"{where}: logits off by {err.max() + LOGIT_ATOL:.3g}")
            if not abs(scores[k] - ref_scores[k]) <= SCORE_ATOL or (scores[k] > 0) != (
                ref_scores[k] > 0
            ):
                problems.append(f"{where}: object score {scores[k]:.5f} vs {ref_scores[k]:.5f}")
    assert not problems, "\n".join(problems)


# numpy dtype name -> Triton datatype of a raw tracker request's tensors
_DTYPES = {"object": "BYTES", "int32": "INT32", "float32": "FP32", "bool": "BOOL"}


def raw_tracker_request(
    server,
    model: str,
    command: str,
    session: str | None = None,
    tenant: str | None = None,
    outputs: tuple[str, ...] = ("status", "out_session_id"),
    **tensors,
) -> dict:
    """One request straight to a tracker model (``sam2_tracker``, ``sam3_tracker``) over gRPC,
    bypassing the client, as ``tenant`` (None: no tenant header); its ``outputs``' first items.

    Raises:
        tritonclient.utils.InferenceServerException: the server's refusal, as it sent it.
    """
    import tritonclient.grpc as grpcclient

    from triton_sam.serving.protocol.tenancy import TENANT_HEADER

    items = {"command": np.array([command.encode()], object)}
    if session is not None:
        items["session_id"] = np.array([session.encode()], object)
    items |= {k: np.asarray(v) for k, v in tensors.items()}
    inputs = []
    for name, value in items.items():
        tensor = grpcclient.InferInput(name, [1, *value.shape], _DTYPES[value.dtype.name])
        tensor.set_data_from_numpy(value[None])
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc_url.split("://")[-1])
    try:
        result = client.infer(
            model,
            inputs,
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
            headers=None if tenant is None else {TENANT_HEADER: tenant},
        )
        return {n: result.as_numpy(n)[0] for n in outputs}
    finally:
        client.close()
