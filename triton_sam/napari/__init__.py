"""The napari plugin: Segment Anything on a triton-sam server, inside the viewer.

Installed with ``pip install triton-sam[napari]``; napari finds it through the npe2 manifest
``napari.yaml`` (entry point ``napari.manifest``) and offers the dock widget "Segment Anything
(Triton)" under Plugins. The widget (:mod:`.widget`) is Qt; what it computes (prompts from
layers, masks into labels, the requests, latest-wins) lives in Qt-free modules beside it.
Only the public API of :mod:`triton_sam` is used.
"""
