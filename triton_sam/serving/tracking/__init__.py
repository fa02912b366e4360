"""Video and volume tracking with SAM2, reproducing ``SAM2VideoPredictor`` on ONNX graphs.

Every module here imports only the standard library and numpy (Pillow to decode and resize
frames), and the rest of :mod:`triton_sam.serving` only by relative import: the repository
writer ships it beside the tracker model's ``model.py`` in Triton (as part of
``triton_sam_serving``), and the same code runs in-process on onnxruntime sessions (the
benchmark's baseline and the fast tests). The contracts are in
:mod:`triton_sam.serving.protocol.tracker`, the resampling kernels in
:mod:`triton_sam.serving.resample`.

- :mod:`.config`: the SAM2 hyperparameters the orchestration reproduces;
- :mod:`.frames`: SAM2's frame decoding and preprocessing;
- :mod:`.memory`: which memories and object pointers a frame attends to;
- :mod:`.prompts`: clicks and boxes as upstream lays them out;
- :mod:`.state` / :mod:`.sessions`: per-video state and the bounded store of sessions;
- :mod:`.tracker`: the orchestration (prompts, propagation) over an injected graph runner;
- :mod:`.service`: one tracker request (a command) against the store;
- :mod:`.runners`: onnxruntime in-process graph runner (the tracker model runs BLS instead).
"""
