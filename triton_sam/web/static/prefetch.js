// Embeddings ahead of the first click on a large image: once the view rests zoomed in far
// enough that a few of the model's tiles fill it, the page asks the large model to embed
// them (`embed`, a precompute), so a click there costs a decode, not an encode. A view of
// more tiles than MAX_TILES asks for nothing: looking over the whole image must not embed it.

import { op } from "./large.js";
import { tilesIn } from "./pyramid.js";

const REST_MS = 400; // the view unchanged this long: the user is looking, not moving
const MAX_TILES = 4; // the model's tiles one view may embed (a zoomed-in view holds 1-4)

export class EmbedPrefetch {
  /** @param image {model, handle, z, tile, grid}: the large image as the model answered it */
  constructor(image) {
    this.image = image;
    this.asked = new Set(); // tile ids asked for (each once)
    this.sent = 0; // embed requests sent (read by tests)
    this.timer = null;
  }

  /** The view now shows image rectangle `rect`: embed its tiles once it rests. */
  viewChanged(rect) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.#embed(rect), REST_MS);
  }

  #embed(rect) {
    const { model, handle, z, tile, grid } = this.image;
    const ids = tilesIn(rect, tile, grid);
    const fresh = ids.filter((id) => !this.asked.has(id));
    if (ids.length > MAX_TILES || !fresh.length) return;
    for (const id of fresh) this.asked.add(id);
    this.sent += 1;
    const request = { op: "embed", handle, tiles: fresh, ...(z === null ? {} : { z }) };
    // Refused (overloaded, evicted): forget them, so a later rest asks again.
    op(model, request).catch(() => fresh.forEach((id) => this.asked.delete(id)));
  }

  close() {
    clearTimeout(this.timer);
  }
}
