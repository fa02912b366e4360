"""Shared by the concept-video tests: a synthetic world of moving boxes, a detector and a
tracker that read it (deterministic for a seed), and transformers' own ``Sam3VideoModel`` /
``Sam3VideoProcessor`` orchestration driven by them, so that ours and upstream's can be run
on the same inputs and compared decision by decision.

Upstream's orchestration is called for real (the methods of ``Sam3VideoModel`` and
``Sam3VideoProcessor`` bound to small stand-in objects that carry the settings); only the
networks are replaced: ``run_detection`` answers the world's detections, the tracker's
propagation answers the world's masklets, the memory encoder records what it is given.

The world is built so that every heuristic fires (the test counts them): objects appear
late, one is occluded for a while, a false positive flickers (removed by hot-start as
unmatched), one object is detected twice on its first frame (removed as a duplicate), a
masklet drifts onto another (suppressed as the more recently occluded), two prompts overlap
(never matched across prompts), confident detections recondition, and the object limit cuts
new detections.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.models.sam3_video import modeling_sam3_video as upstream
from transformers.models.sam3_video.processing_sam3_video import Sam3VideoProcessor

from triton_sam.serving.concept_video.detections import Detections
from triton_sam.serving.concept_video.settings import ConceptVideoSettings

MASK_HW = (32, 32)
VIDEO_HW = (45, 53)  # odd, not a multiple of the mask size: the resize is exercised
FRAMES = 36
# Small hot-start windows and a low object limit, so each heuristic fires within FRAMES.
SETTINGS = ConceptVideoSettings(
    hotstart_delay=6,
    hotstart_unmatch_thresh=3,
    hotstart_dup_thresh=3,
    init_trk_keep_alive=4,
    max_trk_keep_alive=4,
    max_num_objects=5,
    recondition_every_nth_frame=4,
)


def box_logits(box: tuple[float, float, float, float], rng: np.random.Generator) -> np.ndarray:
    """float32 [h, w] logits: about +4 inside the (x0, y0, x1, y1) box, -4 outside."""
    h, w = MASK_HW
    ys, xs = np.mgrid[0:h, 0:w]
    x0, y0, x1, y1 = box
    inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
    return (np.where(inside, 4.0, -4.0) + rng.normal(0, 1.0, MASK_HW)).astype(np.float32)


@dataclass
class Thing:
    """A world object: a box moving at constant speed, visible on some frames."""

    prompt: int
    box: tuple[float, float, float, float]
    speed: tuple[float, float]
    frames: range
    hidden: tuple[int, ...] = ()

    def at(self, frame: int) -> tuple[float, float, float, float] | None:
        if frame not in self.frames or frame in self.hidden:
            return None
        dx, dy = (s * (frame - self.frames.start) for s in self.speed)
        x0, y0, x1, y1 = self.box
        return (x0 + dx, y0 + dy, x1 + dx, y1 + dy)


@dataclass
class World:
    """The boxes, and what the detector and the tracker make of them."""

    seed: int
    things: list[Thing] = field(default_factory=list)

    @classmethod
    def build(cls, seed: int) -> World:
        rng = np.random.default_rng(seed)
        jitter = rng.uniform(-1, 1, (8, 2))
        things = [
            Thing(0, (2, 2, 10, 10), (0.3, 0.2), range(0, FRAMES), hidden=(3, 4)),
            Thing(0, (18, 3, 27, 12), (-0.2, 0.3), range(0, FRAMES), hidden=tuple(range(9, 14))),
            Thing(0, (4, 20, 12, 29), (0.25, -0.1), range(5, FRAMES)),  # appears later
            Thing(1, (3, 3, 11, 11), (0.3, 0.2), range(0, FRAMES)),  # other prompt, same place
            Thing(1, (20, 20, 29, 29), (-0.2, -0.2), range(12, FRAMES)),
            Thing(0, (13, 24, 20, 31), (0.0, 0.0), range(10, 12)),  # flickers: false positive
            Thing(1, (12, 12, 20, 20), (0.1, 0.1), range(20, FRAMES)),  # past the limit
        ]
        for thing, (jx, jy) in zip(things, jitter, strict=False):
            x0, y0, x1, y1 = thing.box
            thing.box = (x0 + jx, y0 + jy, x1 + jx, y1 + jy)
        return cls(seed, things)

    def rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def detections(self, frame: int) -> dict[int, Detections]:
        """Per prompt: a detection for each visible thing (score 0.55..0.99), plus on frame 7
        a second detection of thing 2 on its first frame (a duplicate)."""
        rng = self.rng(frame, 1)
        per_prompt: dict[int, list] = {0: [], 1: []}
        for index, thing in enumerate(self.things):
            box = thing.at(frame)
            if box is None:
                continue
            score = float(rng.uniform(0.55, 0.99))
            if (index, frame) in ((2, 5), (5, 10)):  # born at once: a duplicate, a false positive
                score = 0.9
            per_prompt[thing.prompt].append((box_logits(box, rng), score, box))
            if index == 2 and frame == 5:
                shifted = (box[0] + 1, box[1], box[2] + 1, box[3])
                per_prompt[0].append((box_logits(shifted, rng), 0.95, shifted))
        return {p: _as_detections(p, items) for p, items in per_prompt.items()}


def _as_detections(prompt: int, items: list) -> Detections:
    if not items:
        return Detections.empty(MASK_HW)
    h, w = MASK_HW
    scale = np.array([w, h, w, h], np.float32)
    return Detections(
        masks=np.stack([m for m, _, _ in items]),
        scores=np.asarray([s for _, s, _ in items], np.float32),
        boxes=np.asarray([b for _, _, b in items], np.float32) / scale,
        prompt_ids=np.full(len(items), prompt, np.int64),
    )


class WorldTracker:
    """A tracker over the world: each object follows the thing its first mask overlapped
    most (a false positive's mask stays where it was born); the object following thing 1
    drifts onto thing 0 from frame 18 on (an overlap for the occlusion rule; both things
    were hidden for a while before). Implements ``TrackerSteps``
    and records every call, so two runs can be compared."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.anchor: dict[int, int | None] = {}
        self.birth_box: dict[int, np.ndarray] = {}
        self.calls: list[tuple] = []

    def _mask(self, obj_id: int, frame: int) -> np.ndarray:
        rng = self.world.rng(frame, 2, obj_id)
        anchor = self.anchor[obj_id]
        if anchor == 1 and frame >= 18:
            anchor = 0
        if anchor is None:
            return self.birth_box[obj_id] + rng.normal(0, 0.5, MASK_HW).astype(np.float32)
        box = self.world.things[anchor].at(frame)
        if box is None:
            return np.full(MASK_HW, -6.0, np.float32) + rng.normal(0, 0.5, MASK_HW).astype(
                np.float32
            )
        return box_logits(box, rng)

    def propagate(self, frame_idx, obj_ids, reverse):
        masks = np.stack([self._mask(o, frame_idx) for o in obj_ids])
        scores = np.asarray(
            [self.world.rng(frame_idx, 3, o).uniform(-1.0, 3.0) for o in obj_ids], np.float32
        )
        self.calls.append(("propagate", frame_idx, list(obj_ids)))
        return masks, scores

    def encode_memories(self, frame_idx, obj_ids, masks, object_scores, conditioning_obj_ids):
        self.calls.append(
            ("memory", frame_idx, list(obj_ids), masks.copy(), object_scores.copy(),
             sorted(conditioning_obj_ids))
        )  # fmt: skip

    def add_objects(self, frame_idx, obj_ids, masks, reverse):
        for obj_id, mask in zip(obj_ids, masks, strict=True):
            best, best_iou = None, 0.3
            for index, thing in enumerate(self.world.things):
                box = thing.at(frame_idx)
                if box is None:
                    continue
                thing_mask = box_logits(box, np.random.default_rng(0)) > 0
                iou = (mask & thing_mask).sum() / max((mask | thing_mask).sum(), 1)
                if iou > best_iou:
                    best, best_iou = index, iou
            self.anchor[obj_id] = None if best in (5,) else best
            self.birth_box[obj_id] = np.where(mask, 4.0, -4.0).astype(np.float32)
        self.calls.append(("add", frame_idx, list(obj_ids), masks.copy()))

    def remove_objects(self, obj_ids):
        self.calls.append(("remove", list(obj_ids)))


# -- upstream, driven by the world ------------------------------------------------------------
def _bind(cls: type, names: list[str], **attrs) -> types.SimpleNamespace:
    """An object carrying ``attrs`` whose methods ``names`` are ``cls``'s own functions."""
    namespace = type("Stand" + cls.__name__, (), {n: cls.__dict__[n] for n in names})
    obj = namespace()
    obj.__dict__.update(attrs)
    return obj


MODEL_METHODS = [
    name
    for name, value in upstream.Sam3VideoModel.__dict__.items()
    if callable(value) and not name.startswith("__")
]
PROCESSOR_METHODS = [
    "_apply_non_overlapping_constraints",
    "_apply_object_wise_non_overlapping_constraints",
    "_apply_object_wise_non_overlapping_constraints_impl",
    "postprocess_outputs",
]


def upstream_model(settings: ConceptVideoSettings = SETTINGS, **overrides):
    """``Sam3VideoModel``'s methods with ``settings`` as its attributes (no networks)."""
    attrs = {k: v for k, v in vars(settings).items() if k != "use_nms"}
    attrs.update(low_res_mask_size=MASK_HW[0], fill_hole_area=0, device="cpu", **overrides)
    model = _bind(upstream.Sam3VideoModel, MODEL_METHODS, **attrs)
    type(model).__call__ = upstream.Sam3VideoModel.__dict__["forward"]
    return model


def upstream_processor():
    return _bind(Sam3VideoProcessor, PROCESSOR_METHODS)


class UpstreamRun:
    """Upstream's propagation over the world, with the networks answered by ``tracker``."""

    def __init__(
        self, world: World, tracker: WorldTracker, settings=SETTINGS, *, streamed: bool = False
    ) -> None:
        self.world, self.tracker = world, tracker
        self.model = upstream_model(settings)
        self.session = upstream.Sam3VideoInferenceSession(
            video=None if streamed else torch.zeros(FRAMES, 3, 2, 2),
            video_height=VIDEO_HW[0],
            video_width=VIDEO_HW[1],
            dtype=torch.float32,
        )
        self.session.add_prompt("cat")
        self.session.add_prompt("dog")
        self.plans: list[dict] = []
        model, session = self.model, self.session
        model.detector_model = types.SimpleNamespace(get_vision_features=lambda **_: None)
        model.get_vision_features_for_tracker = lambda vision_embeds: ([], [])
        model.run_detection = lambda inference_session, vision_embeds: {
            p: {"bbox": torch.from_numpy(d.boxes), "mask": torch.from_numpy(d.masks),
                "scores": torch.from_numpy(d.scores)}
            for p, d in world.detections(self._frame).items()
        }  # fmt: skip
        model.run_tracker_propagation = self._propagate
        model.tracker_model = self._add_objects
        model.run_memory_encoder = self._memory
        planning = upstream.Sam3VideoModel.run_tracker_update_planning_phase

        def record_plan(**kwargs):
            plan, metadata = planning(model, **kwargs)
            self.plans.append(plan)
            last = tracker.calls[-1] if tracker.calls else None
            if isinstance(last, list) and last[0] == "memory" and last[-1] is None:
                tracker.calls[-1] = tuple(last[:-1]) + (sorted(plan["reconditioned_obj_ids"]),)
            return plan, metadata

        model.run_tracker_update_planning_phase = record_plan
        remove = session.remove_object

        def remove_and_record(obj_id, strict=False):
            tracker.calls.append(("remove", [obj_id]))
            return remove(obj_id, strict)

        session.remove_object = remove_and_record

    def _propagate(self, inference_session, frame_idx, reverse):
        if not inference_session.obj_ids:
            return torch.zeros(0, *MASK_HW), torch.zeros(0)
        masks, scores = self.tracker.propagate(frame_idx, inference_session.obj_ids, reverse)
        return torch.from_numpy(masks), torch.from_numpy(scores)

    def _add_objects(self, inference_session, frame_idx, reverse, run_mem_encoder):
        ids = list(inference_session.obj_with_new_inputs)
        masks = np.stack(
            [
                inference_session.mask_inputs_per_obj[inference_session.obj_id_to_idx(o)][
                    frame_idx
                ][0, 0].numpy()
                for o in ids
            ]
        ).astype(bool)
        self.tracker.add_objects(frame_idx, ids, masks, reverse)

    def _memory(self, inference_session, frame_idx, high_res_masks, object_score_logits):
        # the reconditioned ids are known once the planning phase returns (record_plan)
        self.tracker.calls.append(
            ["memory", frame_idx, list(inference_session.obj_ids),
             high_res_masks.numpy().copy(), object_score_logits.numpy().copy(), None]
        )  # fmt: skip
        n = high_res_masks.shape[0]
        return torch.zeros(1, n, 1), torch.zeros(1, n, 1)

    def _hook_frames(self) -> None:
        original = upstream.Sam3VideoModel.__dict__["_det_track_one_frame"]

        def det_track(inference_session, frame_idx, reverse, streaming=False):
            self._frame = frame_idx  # the world answers the frame being processed
            return original(self.model, inference_session, frame_idx, reverse, streaming)

        self.model._det_track_one_frame = det_track

    def stream(self):
        """Frames given one by one (``forward(frame=...)``: no hot-start removal, no delay);
        yields (raw output, processed answer) per frame. Needs ``streamed=True``."""
        processor = upstream_processor()
        self._hook_frames()
        for _ in range(FRAMES):
            out = self.model(inference_session=self.session, frame=torch.zeros(3, 2, 2))
            yield out, processor.postprocess_outputs(self.session, out)

    def run(self, reverse: bool = False, start: int = 0):
        """Yield (raw output, processed answer) per frame, as a user of upstream gets them."""
        processor = upstream_processor()
        self._hook_frames()
        for out in self.model.propagate_in_video_iterator(
            self.session, start_frame_idx=start, reverse=reverse
        ):
            yield out, processor.postprocess_outputs(self.session, out)
