"""``bench concept-video``'s figures without a server: the gaps between answers are timed, each
path's frames/s is answers over its median propagation, and the table compares each path to
transformers in the same run."""

from __future__ import annotations

import json

from triton_sam.bench.concept_video import (
    ConceptVideoPath,
    ConceptVideoReport,
    _timed,
    write_concept_video_report,
)


def test_timed_counts_every_answer_and_one_gap_each() -> None:
    path = ConceptVideoPath("served")
    answers = _timed(iter(range(5)), path)
    assert answers == list(range(5))
    assert len(path.frame_ms) == 5 and len(path.seconds) == 1
    assert sum(path.frame_ms) <= path.seconds[0] * 1e3


def test_report_compares_to_transformers_in_the_same_run(tmp_path) -> None:
    served = ConceptVideoPath("served", [2.0, 4.0, 3.0], [100.0] * 24, 8, 2, 8)
    upstream = ConceptVideoPath("transformers", [4.0], [500.0] * 8, 8, 2)
    report = ConceptVideoReport(8, (240, 320), "cat", 3, "seeded", [served, upstream])
    assert served.fps == 8 / 3.0 and upstream.fps == 2.0
    rows = {line.split("|")[1].strip(): line for line in report.markdown().splitlines()[4:]}
    assert "| 1.33 |" in rows["served"] and "| 8 | 8 | 2 |" in rows["served"]
    assert "| 1.00 |" in rows["transformers"]
    paths = write_concept_video_report(report, tmp_path)
    assert json.loads(paths["json"].read_text())["fps"] == {"served": 2.667, "transformers": 2.0}
