"""The page's one transform (``view.js``) and its tile pyramid's maths (``pyramid.js``), run
under Node against numbers computed here.

- a zoom keeps the image pixel under the cursor under it (to float precision), a pan moves the
  image by exactly the drag, and stage -> image -> stage is the identity;
- fit shows the whole image centred, and never magnifies a small one (the page before zoom
  showed it at 1:1, and the browser test relies on it);
- the level a scale needs, and the tiles that cover a view, match ``triton_sam.web.tiles``
  (the gateway's side of the same pyramid): the same blocks for the same (level, row, col).

The browser test (tests/integration/test_web_page.py) checks the same transform with real
wheel and pointer events.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from triton_sam.web import tiles

STATIC = Path(__file__).resolve().parents[2] / "triton_sam" / "web" / "static"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (the browser test covers it)")


def node(script: str) -> object:
    """The JSON a module script prints."""
    view, pyramid = (STATIC / "view.js").as_uri(), (STATIC / "pyramid.js").as_uri()
    prelude = f'import {{ View, wheelFactor }} from "{view}";\nimport * as P from "{pyramid}";\n'
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", prelude + script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_zoom_keeps_the_pixel_under_the_cursor_and_pan_moves_by_the_drag():
    out = node(
        """
        const v = new View();
        v.fit(20000, 20000, 1000, 800);
        const fitted = [v.scale, v.x, v.y];
        const cursor = [613.25, 287.5];
        const before = v.toImage(cursor);
        v.zoomAt(cursor, 40);
        const after = v.toImage(cursor);
        const scale = v.scale;
        v.panBy(-120, 35);
        const panned = v.toImage([cursor[0] - 120, cursor[1] + 35]);
        const round = v.toStage(v.toImage([17.5, 900.25]));
        v.zoomAt([0, 0], 1e9);
        const most = v.scale;
        v.zoomAt([0, 0], 1e-12);
        console.log(JSON.stringify({fitted, before, after, scale, panned, round, most,
          least: v.scale, notch: wheelFactor(100, 0), lines: wheelFactor(-3, 1)}));
        """
    )
    assert out["fitted"] == [0.04, 100, 0]  # 800 / 20000, centred across
    for a, b in zip(out["before"], out["after"], strict=True):
        assert abs(a - b) < 1e-9
    assert out["scale"] == pytest.approx(1.6)
    assert out["panned"] == pytest.approx(out["after"], abs=1e-9)
    assert out["round"] == pytest.approx([17.5, 900.25], abs=1e-9)
    assert out["most"] == 32 and out["least"] == pytest.approx(64 / 20000)
    assert out["notch"] == pytest.approx(0.8) and out["lines"] == pytest.approx(1.25**0.99)


def test_fit_never_magnifies_a_small_image():
    out = node(
        """
        const v = new View();
        v.fit(320, 240, 960, 672);
        const small = [v.scale, v.x, v.y];
        v.fit(4000, 1000, 1000, 500);
        console.log(JSON.stringify({small, wide: [v.scale, v.x, v.y],
          clamped: v.clampedImage([-50, 10000])}));
        """
    )
    assert out["small"] == [1, 320, 216]
    assert out["wide"] == [0.25, 0, 125]
    assert out["clamped"] == [0, 999]  # a press past the edge is the edge pixel


@pytest.mark.parametrize(("width", "height"), [(20000, 20000), (1700, 1100), (512, 512), (513, 40)])
def test_the_pages_pyramid_is_the_gateways(width, height):
    out = node(
        f"""
        const w = {width}, h = {height};
        const count = P.levelCount(w, h);
        const levels = [];
        for (let level = 0; level < count; level += 1)
          levels.push(P.tilesOver([0, 0, w, h], level, w, h));
        console.log(JSON.stringify({{count, levels,
          chosen: [1, 0.6, 0.5, 0.26, 0.25, 0.01].map((s) => P.levelFor(s, count - 1))}}));
        """
    )
    assert out["count"] == tiles.levels((height, width))
    for level, shown in enumerate(out["levels"]):
        for t in shown:
            block = tiles.plan((height, width), level, t["row"], t["col"], 2048).block
            assert block == (t["y"], t["x"], t["y"] + t["h"], t["x"] + t["w"])
        rows, cols = {t["row"] for t in shown}, {t["col"] for t in shown}
        for name, index in (("row", max(rows) + 1), ("col", max(cols) + 1)):
            where = {"row": 0, "col": 0, name: index}
            with pytest.raises(tiles.GatewayError):  # the page asks for every tile there is
                tiles.plan((height, width), level, where["row"], where["col"], 2048)
    # a tile pixel is never smaller than a screen pixel's share: 2**L <= 1 / scale
    expected = [0, 0, 1, 1, 2, 6]
    assert out["chosen"] == [min(e, out["count"] - 1) for e in expected]


def test_tiles_around_a_view_are_clipped_and_nearest_first():
    out = node(
        """
        const tiles = P.tilesOver([1000, 1000, 1600, 1400], 0, 20000, 3000, 1);
        console.log(JSON.stringify(tiles.map((t) => [t.row, t.col])));
        """
    )
    # the view covers tile rows 1-2 and columns 1-3; one more each way
    assert sorted(map(tuple, out)) == [(r, c) for r in range(0, 4) for c in range(0, 5)]
    assert tuple(out[0]) == (2, 2)  # the centre (1300, 1200) lies in tile (2, 2)


def test_the_tiles_a_view_embeds_are_the_models_ids():
    from triton_sam.serving.tiles import Block, TileGrid

    grid = TileGrid((20000, 9000), (768, 768), (128, 128))
    rects = [
        [1000, 2000, 1700, 2500],
        [0, 0, 300, 200],
        [8800, 19900, 9100, 20100],
        [-50, -50, 10, 10],
    ]
    out = node(
        f"console.log(JSON.stringify({rects}.map((r) => P.tilesIn(r, [768, 768], "
        f"{list(grid.blocks_per_axis)}))))"
    )
    for (x0, y0, x1, y1), ids in zip(rects, out, strict=True):
        block = Block((max(0, y0), max(0, x0)), (min(20000, y1), min(9000, x1)))
        assert ids == grid.tiles_touching(block)
