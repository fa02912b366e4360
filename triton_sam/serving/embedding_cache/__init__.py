"""The parts of the session model (``<family>_session``, ``serving/embedding_cache_model.py``).

Standard library and numpy only, like the rest of this package: the parts that build Triton
tensors take ``triton_python_backend_utils`` from the model (``pb_utils`` arguments), so the
clients and the renderer import this package without Triton. Read in request order:

- :mod:`.settings`: the config parameters, one dataclass shared with the renderer;
- :mod:`.store`: the LRU of image features (tenant-scoped keys, kept logits, the crop area);
- :mod:`.requests`: one request's inputs, read and checked against the bounds;
- :mod:`.embedder`: embeds admitted, images received and hashed, the encoder's BLS call;
- :mod:`.predictor`: the decoder's BLS call on cached features, kept logits, finished masks;
- :mod:`.answers`: the error a refused request is answered with, and the metrics it counts;
- :mod:`.metrics`: the model's gauges and counters, and each click's stage clock.
"""
