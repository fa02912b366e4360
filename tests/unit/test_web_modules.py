"""The annotator's ES modules (triton_sam/web/static) run under Node, against the Python side.

- ``rle.js`` decodes the server's compressed RLE (``triton_sam.serving.masks.encode_rle``) to
  the same masks, and refuses counts that do not fit the image;
- ``export.js`` writes an 8-bit grayscale PNG that PIL reads back as the same labels, and COCO
  annotations with the object's RLE, area and bbox;
- ``lane.js``: a storm of jobs while one is in flight sends only the first and the newest, the
  newest answer is the one delivered last, and a cancelled job's answer is never delivered.

The same modules run in Chromium in tests/integration/test_web_page.py; Node (>= 18: Blob,
CompressionStream) runs them here in a second, without a browser or a server.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from triton_sam.serving import masks

STATIC = Path(__file__).resolve().parents[2] / "triton_sam" / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (the browser test covers it)")


def run_node(script: str, stdin: str = "") -> str:
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def module(name: str) -> str:
    return (STATIC / name).as_uri()


def random_masks(rng: np.random.Generator) -> list[np.ndarray]:
    shapes = [(1, 1), (3, 5), (17, 9), (64, 48), (240, 320)]
    out = [np.zeros((4, 6), bool), np.ones((4, 6), bool)]
    for h, w in shapes:
        blobs = rng.random((h, w)) < rng.uniform(0.05, 0.95)
        out.append(blobs)
    # long runs (multi-group counts, negative deltas)
    big = np.zeros((300, 400), bool)
    big[20:280, 50:60] = True
    big[:, 390:] = True
    out.append(big)
    return out


def test_rle_decodes_the_servers_counts_to_the_same_masks():
    cases = [
        {"h": m.shape[0], "w": m.shape[1], "counts": masks.encode_rle(m).decode()}
        for m in random_masks(np.random.default_rng(7))
    ]
    script = f"""
import {{ decode, boxAndArea }} from "{module("rle.js")}";
import {{ readFileSync }} from "fs";
const cases = JSON.parse(readFileSync(0, "utf8"));
const out = cases.map((c) => {{
  const m = decode(c.counts, c.h, c.w);
  return {{ ones: Array.from(m.keys()).filter((i) => m[i]), ...boxAndArea(m, c.h, c.w) }};
}});
let refused = 0;
for (const [counts, h, w] of [["5", 2, 2], ["0", 2, 2], ["\\x7f", 2, 2]]) {{
  try {{ decode(counts, h, w); }} catch {{ refused += 1; }}
}}
console.log(JSON.stringify({{ out, refused }}));
"""
    result = json.loads(run_node(script, json.dumps(cases)))
    assert result["refused"] == 3
    originals = random_masks(np.random.default_rng(7))
    for case, mask, got in zip(cases, originals, result["out"], strict=True):
        assert got["ones"] == np.flatnonzero(mask.reshape(-1)).tolist(), (case["h"], case["w"])
        ys, xs = np.nonzero(mask)
        box = (
            [0, 0, 0, 0]
            if not len(xs)
            else [
                int(xs.min()),
                int(ys.min()),
                int(xs.max() - xs.min() + 1),
                int(ys.max() - ys.min() + 1),
            ]
        )
        assert got["bbox"] == box and got["area"] == int(mask.sum())


def test_label_png_and_coco_export():
    rng = np.random.default_rng(3)
    h, w = 37, 53
    a, b = rng.random((h, w)) < 0.3, rng.random((h, w)) < 0.2
    objects = [
        {
            "mask": a.reshape(-1).astype(int).tolist(),
            "rle": masks.encode_rle(a).decode(),
            "score": 0.5,
        },
        {"mask": None, "rle": None, "score": None},  # prompts only, no mask yet
        {
            "mask": b.reshape(-1).astype(int).tolist(),
            "rle": masks.encode_rle(b).decode(),
            "score": 0.25,
        },
    ]
    script = f"""
import {{ grayPng, labels, coco }} from "{module("export.js")}";
import {{ readFileSync }} from "fs";
const objects = JSON.parse(readFileSync(0, "utf8")).map((o) => ({{
  ...o, mask: o.mask && Uint8Array.from(o.mask) }}));
const png = await grayPng(labels(objects, {h}, {w}), {h}, {w});
const bytes = Buffer.from(await png.arrayBuffer()).toString("base64");
const document = JSON.parse(coco("x.png", objects, {h}, {w}, "m"));
console.log(JSON.stringify({{ png: bytes, coco: document }}));
"""
    result = json.loads(run_node(script, json.dumps(objects)))
    import base64

    label = np.asarray(Image.open(io.BytesIO(base64.b64decode(result["png"]))))
    assert label.dtype == np.uint8 and label.shape == (h, w)
    expected = np.zeros((h, w), np.uint8)
    expected[a] = 1
    expected[b] = 3  # later objects over earlier ones; label = position in the list
    np.testing.assert_array_equal(label, expected)
    document = result["coco"]
    assert document["images"] == [{"id": 1, "file_name": "x.png", "width": w, "height": h}]
    got = [(x["id"], x["label_value"], x["area"]) for x in document["annotations"]]
    assert got == [(1, 1, int(a.sum())), (3, 3, int(b.sum()))]
    for annotation, mask in zip(document["annotations"], (a, b), strict=True):
        assert annotation["segmentation"]["size"] == [h, w]
        decoded = masks.decode_rle(annotation["segmentation"]["counts"], (h, w))
        np.testing.assert_array_equal(decoded, mask)


def test_lane_is_latest_wins():
    script = f"""
import {{ Lane }} from "{module("lane.js")}";
const started = [];
const delivered = [];
const pending = [];
const run = (job, signal) => new Promise((resolve, reject) => {{
  started.push(job);
  pending.push(() => resolve(job));
  const abort = Object.assign(new Error("aborted"), {{ name: "AbortError" }});
  signal.addEventListener("abort", () => reject(abort));
}});
const lane = new Lane(run, (result) => delivered.push(result), (e) => delivered.push("error " + e));
const tick = () => new Promise((r) => setTimeout(r, 0));
for (let i = 1; i <= 50; i += 1) lane.submit(i);      // a storm while 1 is in flight
await tick();
pending.shift()();                                      // 1 answers: 50 starts, 2..49 never
await tick();
pending.shift()();                                      // 50 answers
await tick();
const storm = {{ started: started.slice(), delivered: delivered.slice(), idle: lane.idle }};
lane.submit(51);
await tick();
lane.cancel();                                          // 51's answer must not show
pending.shift()();
await tick();
lane.submit(52);
await tick();
pending.shift()();
await tick();
lane.submit(53);                                        // in flight
lane.submit(54);                                        // waiting
lane.dropWaiting();                                     // a click took over: 54 never sent
await tick();
pending.shift()();
await tick();
console.log(JSON.stringify({{ storm, started, delivered, sent: lane.sent, idle: lane.idle }}));
"""
    result = json.loads(run_node(script))
    assert result["storm"] == {"started": [1, 50], "delivered": [1, 50], "idle": True}
    assert result["started"] == [1, 50, 51, 52, 53]
    assert result["delivered"] == [1, 50, 52, 53]
    assert result["sent"] == 5 and result["idle"] is True


def test_video_concepts_take_frames_in_name_order_and_colour_by_object_id() -> None:
    """``videoconcepts.js``: the frame files in name order with runs of digits compared as
    numbers (a z-stack's z2 before z10, as a person reads them), and an object's colour
    from its id alone (the same on every frame)."""
    script = f"""
globalThis.sessionStorage = {{ getItem: () => null }};  // kserve.js keeps its token there
const {{ inNameOrder, colourOf }} = await import({json.dumps(module("videoconcepts.js"))});
const names = ["z10.png", "z2.png", "z1.png", "a.png", "z02b.png"].map((name) => ({{ name }}));
console.log(JSON.stringify({{
  order: inNameOrder(names).map((f) => f.name),
  same: JSON.stringify(colourOf(3)) === JSON.stringify(colourOf(13)),
  differ: JSON.stringify(colourOf(3)) !== JSON.stringify(colourOf(4)),
}}));
"""
    result = json.loads(run_node(script))
    assert result["order"] == ["a.png", "z1.png", "z2.png", "z02b.png", "z10.png"]
    assert result["same"] is True and result["differ"] is True
