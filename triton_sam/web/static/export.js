// Exports: an 8-bit grayscale PNG label image (0 = background, object k = k, later objects
// drawn over earlier ones, as on screen) and COCO JSON whose segmentations are the server's
// compressed RLE, one annotation per object (overlaps kept, as COCO allows).

import { boxAndArea } from "./rle.js";

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n += 1) {
    let c = n;
    for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type, data) {
  const out = new Uint8Array(12 + data.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, data.length);
  out.set(new TextEncoder().encode(type), 4);
  out.set(data, 8);
  view.setUint32(8 + data.length, crc32(out.subarray(4, 8 + data.length)));
  return out;
}

/** An 8-bit grayscale PNG of `pixels` (Uint8Array height * width, row-major). */
export async function grayPng(pixels, height, width) {
  const raw = new Uint8Array((width + 1) * height); // each row: filter type 0, then the row
  for (let y = 0; y < height; y += 1) raw.set(pixels.subarray(y * width, (y + 1) * width), y * (width + 1) + 1);
  // CompressionStream("deflate") is zlib-wrapped deflate: what PNG's IDAT holds.
  const stream = new Blob([raw]).stream().pipeThrough(new CompressionStream("deflate"));
  const idat = new Uint8Array(await new Response(stream).arrayBuffer());
  const header = new Uint8Array(13);
  const view = new DataView(header.buffer);
  view.setUint32(0, width);
  view.setUint32(4, height);
  header.set([8, 0, 0, 0, 0], 8); // bit depth 8, grayscale, deflate, no filter, no interlace
  const signature = new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10]);
  return new Blob([signature, chunk("IHDR", header), chunk("IDAT", idat), chunk("IEND", new Uint8Array())], {
    type: "image/png",
  });
}

/** Label image of objects with masks (at most 255). */
export function labels(objects, height, width) {
  const out = new Uint8Array(height * width);
  objects.forEach((object, k) => {
    if (!object.mask) return;
    for (let i = 0; i < out.length; i += 1) if (object.mask[i]) out[i] = k + 1;
  });
  return out;
}

/** COCO JSON (text) of one image and its objects' masks. */
export function coco(fileName, objects, height, width, model) {
  const annotations = [];
  objects.forEach((object, k) => {
    if (!object.mask) return;
    const { bbox, area } = boxAndArea(object.mask, height, width);
    annotations.push({
      id: k + 1,
      image_id: 1,
      category_id: 1,
      segmentation: { size: [height, width], counts: object.rle },
      area,
      bbox,
      iscrowd: 0,
      score: object.score,
      label_value: k + 1,
    });
  });
  return JSON.stringify(
    {
      info: { description: `triton-sam annotator (${model})`, date_created: new Date().toISOString() },
      images: [{ id: 1, file_name: fileName, width, height }],
      categories: [{ id: 1, name: "object" }],
      annotations,
    },
    null,
    1,
  );
}
