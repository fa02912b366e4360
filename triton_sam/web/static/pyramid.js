// The tile pyramid the gateway serves for a large image (triton_sam/web/tiles.py): tile
// (row, col) of level L covers TILE_PX * 2**L image pixels a side from the origin, cut at the
// image's edge, reduced 2**L times. Which level a view needs, and which tiles it shows.

export const TILE_PX = 512; // tiles.py TILE_PX
const PREFETCH = 1; // tiles around the viewport fetched ahead, each way: a pan shows them at once

/** Levels of an image of width x height: the last fits in one tile. */
export function levelCount(width, height) {
  return 1 + Math.max(0, Math.ceil(Math.log2(Math.max(width, height, 1) / TILE_PX)));
}

/** The level to show at `scale` screen pixels per image pixel: the coarsest whose pixels are
 * no larger than a screen pixel (capped at `coarsest`, the coarsest the server can give). */
export function levelFor(scale, coarsest) {
  const level = Math.floor(Math.log2(1 / scale) + 1e-9);
  return Math.min(Math.max(level, 0), coarsest);
}

/** Tiles of `level` over image rectangle [x0, y0, x1, y1], with `margin` tiles more on each
 * side (clipped to the image): [{level, row, col, x, y, w, h}] in image pixels, the ones
 * nearest the rectangle's centre first (fetched first). */
export function tilesOver(rect, level, width, height, margin = 0) {
  const span = TILE_PX * 2 ** level;
  const [x0, y0, x1, y1] = rect;
  const col0 = Math.max(0, Math.floor(x0 / span) - margin);
  const row0 = Math.max(0, Math.floor(y0 / span) - margin);
  const col1 = Math.min(Math.ceil(width / span), Math.ceil(x1 / span) + margin);
  const row1 = Math.min(Math.ceil(height / span), Math.ceil(y1 / span) + margin);
  const tiles = [];
  for (let row = row0; row < row1; row += 1) {
    for (let col = col0; col < col1; col += 1) {
      const x = col * span;
      const y = row * span;
      tiles.push({ level, row, col, x, y, w: Math.min(span, width - x), h: Math.min(span, height - y) });
    }
  }
  const cx = (x0 + x1) / 2;
  const cy = (y0 + y1) / 2;
  const distance = (t) => Math.hypot(t.x + t.w / 2 - cx, t.y + t.h / 2 - cy);
  return tiles.sort((a, b) => distance(a) - distance(b));
}

export { PREFETCH };

/** The large model's own tiles (what it embeds), not the pyramid's: the ids (row-major, as
 * triton_sam/serving/tiles.py numbers them) of the tiles of `tile` [rows, cols] pixels,
 * `grid` [rows, cols] of them, whose core overlaps image rectangle [x0, y0, x1, y1]. */
export function tilesIn(rect, tile, grid) {
  const [x0, y0, x1, y1] = rect;
  const first = (v, side, count) => Math.min(Math.max(Math.floor(v / side), 0), count);
  const last = (v, side, count) => Math.min(Math.max(Math.ceil(v / side), 0), count);
  const ids = [];
  for (let r = first(y0, tile[0], grid[0]); r < last(y1, tile[0], grid[0]); r += 1) {
    for (let c = first(x0, tile[1], grid[1]); c < last(x1, tile[1], grid[1]); c += 1) ids.push(r * grid[1] + c);
  }
  return ids;
}
