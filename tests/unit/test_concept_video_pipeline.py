"""ConceptVideo's refusals, before any graph runs (the pipeline itself is checked end to end
in tests/parity/test_sam3_concept_video_e2e.py)."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.serving.concept_video.pipeline import ConceptVideo
from triton_sam.serving.concept_video.settings import ConceptVideoSettings
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.protocol.tracker import TrackingError


class _NoGraphs:
    def run(self, graph, inputs, outputs):
        raise AssertionError(f"{graph} ran before the request was checked")


def test_no_prompt_is_refused_naming_prompts():
    frames = [np.zeros((8, 8, 3), np.uint8)]
    with pytest.raises(TrackingError) as error:
        ConceptVideo(_NoGraphs(), _NoGraphs(), None, frames, {}, ConceptVideoSettings())
    assert (error.value.code, error.value.field) == (protocol.ERR_NO_PROMPTS, "prompts")
    assert "expected at least one phrase" in str(error.value)
