"""What runs inside Triton, and the dependency-free pieces it shares with the clients.

The modules here import only the standard library and numpy (``intake`` also PIL, lazily, to
decode image files and for SAM1's resize), and one another relatively, so
the repository writer can ship this package beside a server-side ``model.py`` under the name
``triton_sam_serving`` (a unique top-level name: nothing on the stub's ``sys.path`` can shadow
it), and the clients import the very same files as ``triton_sam.serving``:

- :mod:`.resample`: numpy twins of torch's resampling kernels;
- :mod:`.images`: content ids and SAM3 preprocessing of RGB images;
- :mod:`.masks`: instance post-processing (Sam3Processor's), COCO RLE and PNG encoding;
- :mod:`.bounds`: the request bounds every client-reachable input is checked against (the
  session model enforces them, the clients check them first);
- :mod:`.intake`: image files / pixels in: decoding, the official preprocessing, the ids the
  server computes;
- :mod:`.prompt_frame`: original-pixel prompts to the input frame and masks back (bbox,
  bit-packing);
- :mod:`.protocol`: tensor names, limits and error codes of the served models;
- :mod:`.tracking`: SAM2 video tracking orchestration (the tracker model's, and in-process);
- ``*_model.py``: the python-backend ``model.py`` files (``concept_model``,
  ``embedding_cache_model``, ``tracker_model``, ``runner_model``); they need Triton's
  ``triton_python_backend_utils`` and are never imported by the package itself.
"""
