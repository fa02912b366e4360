// COCO compressed RLE (the "counts" string pycocotools writes, as the server's masks_rle):
// column-major runs starting with background; each value in 5-bit groups, low bits first,
// offset 48, 0x20 = more groups follow, 0x10 in the last group = negative; from the third run
// on, a value is the difference to the run two before.

/** Run lengths of a counts string. */
export function runs(counts) {
  const out = [];
  let p = 0;
  while (p < counts.length) {
    let value = 0;
    let k = 0;
    let more = true;
    while (more) {
      if (p >= counts.length) throw new Error("RLE: truncated counts");
      const c = counts.charCodeAt(p) - 48;
      value |= (c & 0x1f) << (5 * k);
      more = (c & 0x20) !== 0;
      p += 1;
      k += 1;
      if (!more && c & 0x10) value |= -1 << (5 * k);
    }
    if (out.length > 2) value += out[out.length - 2];
    out.push(value);
  }
  return out;
}

/** The mask of a counts string: Uint8Array of height * width (row-major, 1 = mask). */
export function decode(counts, height, width) {
  const mask = new Uint8Array(height * width);
  let i = 0;
  let on = false;
  for (const run of runs(counts)) {
    if (run < 0 || i + run > height * width) throw new Error("RLE: runs do not fit the image");
    if (on) {
      for (let j = i; j < i + run; j += 1) {
        const x = Math.floor(j / height);
        mask[(j - x * height) * width + x] = 1;
      }
    }
    i += run;
    on = !on;
  }
  if (i !== height * width) throw new Error("RLE: runs do not cover the image");
  return mask;
}

/** [x, y, width, height] of a mask (COCO's bbox) and its area. */
export function boxAndArea(mask, height, width) {
  let x0 = width;
  let y0 = height;
  let x1 = -1;
  let y1 = -1;
  let area = 0;
  for (let y = 0; y < height; y += 1) {
    for (let x = 0; x < width; x += 1) {
      if (mask[y * width + x]) {
        area += 1;
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (area === 0) return { bbox: [0, 0, 0, 0], area: 0 };
  return { bbox: [x0, y0, x1 - x0 + 1, y1 - y0 + 1], area };
}
