"""Video and volume tracking with SAM2, reproducing ``SAM2VideoPredictor`` on ONNX graphs.

Every module here imports only the standard library and numpy (PIL optionally, to decode
encoded frames), and only each other by relative import: the repository writer ships this
package next to the tracker model's ``model.py`` in Triton, and the same code runs in-process
on onnxruntime sessions (the benchmark's baseline and the fast tests).

- :mod:`.protocol`: graph contracts, the tracker's tensors, limits and error codes;
- :mod:`.config`: the SAM2 hyperparameters the orchestration reproduces;
- :mod:`.memory`: which memories and object pointers a frame attends to;
- :mod:`.resample`: torch-exact resampling kernels and SAM2's frame preprocessing;
- :mod:`.tracker`: the orchestration (per-session state, prompts, propagation) over an
  injected graph runner.
"""
