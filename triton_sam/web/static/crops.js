// Masks of a large image on screen: each is the crop of its bounding box (the large model's
// answer: offset + size + mask), drawn at its offset through the view's transform, so a
// mask costs its box's pixels in the page, never the image's.

const painted = new WeakMap(); // crop -> {canvas, colour}: a crop is painted once per colour

function cropCanvas(crop, colour) {
  const known = painted.get(crop);
  if (known && known.colour === colour) return known.canvas;
  const [h, w] = crop.size;
  const canvas = new OffscreenCanvas(Math.max(w, 1), Math.max(h, 1));
  const ctx = canvas.getContext("2d");
  const out = ctx.createImageData(Math.max(w, 1), Math.max(h, 1));
  for (let i = 0; i < crop.mask.length; i += 1) {
    if (!crop.mask[i]) continue;
    out.data.set([colour[0], colour[1], colour[2], 255], 4 * i);
  }
  ctx.putImageData(out, 0, 0);
  painted.set(crop, { canvas, colour });
  return canvas;
}

/** Draws layers [{crop, colour}] on `canvas` (the stage's size) through `view`. Opaque, as
 * the small image's masks: the layer's translucency is CSS. */
export function paintCrops(canvas, view, layers) {
  const ctx = canvas.getContext("2d");
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  view.apply(ctx);
  ctx.imageSmoothingEnabled = false; // a mask's pixels stay squares when magnified
  for (const { crop, colour } of layers) {
    if (!crop || !crop.size[0] || !crop.size[1]) continue;
    const [row, col] = crop.offset;
    ctx.drawImage(cropCanvas(crop, colour), col, row, crop.size[1], crop.size[0]);
  }
}
