"""Concept tracking in video: ``Sam3VideoModel``'s orchestration in numpy.

``Sam3VideoModel`` (transformers) runs, per frame, SAM3's detector on every prompt, propagates
the tracked masklets one frame with SAM3's tracker, and reconciles the two in Python: which
detections are new objects (and their ids), which masklets are unmatched, duplicated or
occluded, which are re-conditioned, which memories are encoded from which masks, and what
the frame's answer is. These modules make the same decisions on numpy arrays, in upstream's
order, so the serving model can call the detector and tracker graphs and decide here.

Modules, in data order:

- :mod:`.settings`: the thresholds and counters (``Sam3VideoConfig``'s fields).
- :mod:`.mask_ops`: mask IoU, mask NMS, the non-overlap and shrinkage constraints.
- :mod:`.detections`: a frame's detections (per prompt, then merged).
- :mod:`.association`: detections against tracked masklets.
- :mod:`.state`: what a session remembers about its objects between frames.
- :mod:`.hotstart`: the hot-start removal and keep-alive bookkeeping, and the output delay.
- :mod:`.planning`: one frame's update plan (new ids, removals, reconditioning, the masks the
  memory encoder reads) and the frame's low-resolution masks per object.
- :mod:`.results`: ``Sam3VideoProcessor.postprocess_outputs`` and COCO RLE per frame.

Masks are low-resolution logits, float32 [N, H, W] (288 x 288 for SAM3), ``> 0`` meaning
foreground, as upstream thresholds them. Object ids are ints issued in increasing order.
"""
