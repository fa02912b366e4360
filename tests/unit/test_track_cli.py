"""``triton-sam track`` / ``setup-video`` / ``bench video``: prompt parsing and user errors
(no server: every case fails before one would start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

from triton_sam.client.track import Prompt, _labels, parse_box, parse_click, track_video
from triton_sam.errors import InputValidationError

ROOT = Path(__file__).resolve().parents[2]


def test_clicks_and_boxes_parse_with_defaults():
    assert parse_click("10,20") == Prompt(0, 1, point=(10.0, 20.0))
    assert parse_click("10.5,20,7,3") == Prompt(7, 3, point=(10.5, 20.0))
    assert parse_box("1,2,30,40,5") == Prompt(5, 1, box=(1.0, 2.0, 30.0, 40.0))


@pytest.mark.parametrize("text", ["10", "a,b", "1,2,3,4,5", "1,2,-1", "1,2,0.5", "1,nan"])
def test_bad_clicks_name_the_field(text):
    with pytest.raises(InputValidationError) as info:
        parse_click(text)
    assert info.value.field == "click"


def test_labels_let_later_objects_win_and_widen_for_large_ids():
    masks = np.full((2, 1, 2, 2), -1.0, np.float32)
    masks[0, 0, 0] = 1.0
    masks[1, 0, :, 0] = 1.0
    assert _labels([3, 9], masks).tolist() == [[9, 3], [9, 0]]
    assert _labels([300], masks[:1]).dtype == np.uint16


def test_tracking_without_a_prompt_is_refused():
    with pytest.raises(InputValidationError, match="click"):
        track_video(object(), np.zeros((2, 4, 4), np.uint8), [], "unused")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from triton_sam.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize("cmd", [("track",), ("setup-video",), ("bench", "video")])
def test_video_commands_explain_themselves(cmd):
    out = run_cli(*cmd, "--help")
    assert out.returncode == 0 and "Usage" in out.stdout


def test_a_bad_click_is_one_line_and_exit_1(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros((2, 4, 4), np.uint8))
    out = run_cli("track", str(tmp_path / "v.npy"), "--click", "oops", "--url", "localhost:1")
    assert out.returncode == 1 and "click:" in out.stderr and "Traceback" not in out.stderr


def test_a_volume_of_the_wrong_rank_is_one_line_and_exit_1(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros((4, 4), np.uint8))
    out = run_cli("track", str(tmp_path / "v.npy"), "--click", "1,1", "--url", "localhost:1")
    assert out.returncode == 1 and "video:" in out.stderr and "Traceback" not in out.stderr


def test_pixi_has_the_video_tasks():
    tasks = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pixi"]["tasks"]
    assert {"setup-video", "track", "benchmark-video", "test-video"} <= set(tasks)
    assert "tests/integration/test_video_tracker.py" in tasks["test-video"]
