// The one transform between the stage and the image, and nothing else: every click, hover,
// box, drawn mask and tile goes through it, so what is under the cursor is what is sent.
//
// Stage pixels are CSS pixels from the stage's top-left corner; image pixels are the
// full-resolution image's, x = column, continuous (pixel (i, j) covers [i, i + 1)).
//   stage = image * scale + (x, y)
// A small image is drawn at its own resolution and placed by this transform as a CSS
// transform; a large one is drawn tile by tile with it as the canvas's transform.

const MAX_SCALE = 32; // screen pixels per image pixel at most: single pixels are squares enough
const MIN_SIDE = 64; // the image is never shown smaller than this many screen pixels a side

export class View {
  constructor() {
    this.scale = 1;
    this.x = 0;
    this.y = 0;
    this.width = 1; // the image's size, pixels
    this.height = 1;
  }

  /** Image pixel under stage point [sx, sy] (not clamped). */
  toImage([sx, sy]) {
    return [(sx - this.x) / this.scale, (sy - this.y) / this.scale];
  }

  /** Stage point of image pixel [ix, iy]. */
  toStage([ix, iy]) {
    return [ix * this.scale + this.x, iy * this.scale + this.y];
  }

  /** Image pixel under [sx, sy], kept inside the image (a press just past its edge). */
  clampedImage(stagePoint) {
    const [x, y] = this.toImage(stagePoint);
    return [Math.min(Math.max(x, 0), this.width - 1), Math.min(Math.max(y, 0), this.height - 1)];
  }

  /** Shows an image of width x height whole, centred in a stage of stageW x stageH; a small
   * image stays at 1:1 (what the page did before it zoomed: never blurred by default). */
  fit(width, height, stageW, stageH) {
    this.width = width;
    this.height = height;
    this.scale = Math.min(1, stageW / width, stageH / height);
    this.x = Math.round((stageW - width * this.scale) / 2);
    this.y = Math.round((stageH - height * this.scale) / 2);
  }

  /** Zooms by `factor` around stage point [sx, sy]: the image pixel under it stays under it. */
  zoomAt([sx, sy], factor) {
    const [ix, iy] = this.toImage([sx, sy]);
    const least = MIN_SIDE / Math.max(this.width, this.height);
    this.scale = Math.min(MAX_SCALE, Math.max(least, this.scale * factor));
    this.x = sx - ix * this.scale;
    this.y = sy - iy * this.scale;
  }

  /** Moves the image by [dx, dy] stage pixels. */
  panBy(dx, dy) {
    this.x += dx;
    this.y += dy;
  }

  /** The image rectangle [x0, y0, x1, y1] a stage of stageW x stageH shows (may go past the
   * image: the caller clips). */
  visible(stageW, stageH) {
    const [x0, y0] = this.toImage([0, 0]);
    const [x1, y1] = this.toImage([stageW, stageH]);
    return [x0, y0, x1, y1];
  }

  /** The CSS transform placing an image-sized element (transform-origin 0 0). */
  css() {
    return `matrix(${this.scale}, 0, 0, ${this.scale}, ${this.x}, ${this.y})`;
  }

  /** Sets a 2D context to draw in image pixels. */
  apply(ctx) {
    ctx.setTransform(this.scale, 0, 0, this.scale, this.x, this.y);
  }
}

/** The wheel's zoom factor: one notch (100 px of deltaY) zooms 1.25x; trackpads send less. */
export function wheelFactor(deltaY, deltaMode) {
  const pixels = deltaMode === 1 ? deltaY * 33 : deltaMode === 2 ? deltaY * 800 : deltaY;
  return Math.pow(1.25, -pixels / 100);
}
