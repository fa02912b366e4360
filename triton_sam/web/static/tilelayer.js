// A large image on screen: the tiles of the gateway's pyramid (pyramid.js) that the viewport
// shows, drawn through the view's transform, plus the ring around it fetched ahead. The page
// holds at most MAX_TILES decoded tiles (the least recently drawn go first), whatever the
// image's size; the browser's HTTP cache keeps the PNGs (the gateway marks them immutable).

import { PREFETCH, TILE_PX, levelCount, levelFor, tilesOver } from "./pyramid.js";

const MAX_TILES = 256; // 256 x 512 x 512 x 4 B = 256 MiB of decoded tiles at most
const MAX_FETCHES = 6; // tiles fetched at once (a browser's connections per origin)

export class TileLayer {
  /** @param image {model, handle, z, width, height}; @param onTile called when a tile lands */
  constructor(image, onTile, headers = () => ({})) {
    this.image = image;
    this.onTile = onTile;
    this.headers = headers;
    this.tiles = new Map(); // key -> ImageBitmap, in order of last use
    this.wanted = []; // tiles to fetch, nearest first
    this.inflight = new Set();
    this.coarsest = levelCount(image.width, image.height) - 1;
    this.fetched = 0; // tiles answered (read by the browser test)
    this.closed = false;
  }

  url({ level, row, col }) {
    const { model, handle, z } = this.image;
    const zq = z === null ? "" : `&z=${z}`;
    return `/web/large/${encodeURIComponent(model)}/${handle}/tile?level=${level}&row=${row}&col=${col}${zq}`;
  }

  /** Draws what is loaded of the view's tiles on `ctx` (the stage's canvas, stageW x stageH),
   * asks for what is missing and the ring around it. */
  draw(ctx, view, stageW, stageH) {
    const { width, height } = this.image;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, stageW, stageH);
    view.apply(ctx);
    // Each tile pixel is an area mean of the image's: drawn smoothly when it is shrunk, as
    // squares when it is magnified (the pixels SAM sees, one by one).
    ctx.imageSmoothingEnabled = view.scale < 1;
    const level = levelFor(view.scale, this.coarsest);
    const rect = view.visible(stageW, stageH);
    const shown = tilesOver(rect, level, width, height);
    for (const tile of shown) {
      const bitmap = this.#fallback(tile);
      if (bitmap) ctx.drawImage(bitmap.image, ...bitmap.source, tile.x, tile.y, tile.w, tile.h);
    }
    this.wanted = tilesOver(rect, level, width, height, PREFETCH).filter((t) => !this.tiles.has(key(t)));
    this.#pump();
  }

  // The tile itself once loaded, else the part of a loaded coarser tile that covers it (so
  // a zoom shows something at once): {image, source: [sx, sy, sw, sh]} or null.
  #fallback(tile) {
    for (let level = tile.level; level <= this.coarsest; level += 1) {
      const f = 2 ** (level - tile.level);
      const parent = { level, row: Math.floor(tile.row / f), col: Math.floor(tile.col / f) };
      const bitmap = this.tiles.get(key(parent));
      if (!bitmap) continue;
      this.tiles.delete(key(parent)); // most recently used last
      this.tiles.set(key(parent), bitmap);
      const scale = 2 ** level; // image pixels per parent tile pixel
      const span = TILE_PX * scale;
      const sx = (tile.x - parent.col * span) / scale;
      const sy = (tile.y - parent.row * span) / scale;
      return { image: bitmap, source: [sx, sy, tile.w / scale, tile.h / scale] };
    }
    return null;
  }

  #pump() {
    while (!this.closed && this.inflight.size < MAX_FETCHES && this.wanted.length) {
      const tile = this.wanted.shift();
      const k = key(tile);
      if (this.inflight.has(k) || this.tiles.has(k)) continue;
      this.inflight.add(k);
      this.#fetch(tile, k).finally(() => {
        this.inflight.delete(k);
        this.#pump();
      });
    }
  }

  async #fetch(tile, k) {
    try {
      const response = await fetch(this.url(tile), { headers: this.headers() });
      if (!response.ok) {
        // The coarsest level needs a source pyramid the image may not have (413): stay a level finer.
        if (response.status === 413 && tile.level > 0) this.coarsest = Math.min(this.coarsest, tile.level - 1);
        else console.warn(`tile ${k}: HTTP ${response.status}`);
        this.onTile();
        return;
      }
      const bitmap = await createImageBitmap(await response.blob());
      if (this.closed) return bitmap.close();
      this.tiles.set(k, bitmap);
      this.fetched += 1;
      while (this.tiles.size > MAX_TILES) {
        const [oldest, old] = this.tiles.entries().next().value;
        this.tiles.delete(oldest);
        old.close();
      }
      this.onTile();
    } catch (e) {
      console.warn(`tile ${k}: ${e.message}`);
    }
  }

  get idle() {
    return this.inflight.size === 0 && this.wanted.length === 0;
  }

  close() {
    this.closed = true;
    for (const bitmap of this.tiles.values()) bitmap.close();
    this.tiles.clear();
  }
}

const key = ({ level, row, col }) => `${level}/${row}/${col}`;
