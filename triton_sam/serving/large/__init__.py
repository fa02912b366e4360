"""The parts of the ``<family>_large`` model (``serving/large_model.py``), Triton-free.

- :mod:`.requests`: the JSON request read and checked, every refusal naming its field;
- :mod:`.handles`: the images each tenant holds, under server-issued handles (LRU);
- :mod:`.spool`: created images' pixels on disk, bounded per tenant, read as a source;
- :mod:`.planning`: which pixels a prompt is answered on (tile, window, auto);
- :mod:`.crop`: a block's mask cut to its bounding box, as COCO RLE in full-image pixels;
- :mod:`.service`: the ops over a session (the BLS calls, or a stand-in in the tests).

Standard library and numpy only: shipped beside the model's ``model.py``.
"""
