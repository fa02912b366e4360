"""The protocol of triton_sam's server-side models: one submodule per served model.

Standard library only: the repository writer ships this package beside the server-side
``model.py`` files (as part of ``triton_sam_serving``) and the clients import the same files.

- :mod:`.concept`: ``sam3_concept``, text prompts to instances;
- :mod:`.tracker`: ``sam2_tracker`` and the five video graphs it calls.
"""
