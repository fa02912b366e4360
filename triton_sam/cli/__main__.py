"""``python -m triton_sam.cli``: the same app as the ``triton-sam`` command."""

from triton_sam.cli import main

main()
