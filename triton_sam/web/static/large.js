// A large image on the <family>_large model (contract: triton_sam/serving/protocol/large.py):
// one JSON request per op in the BYTES input "request", the JSON answer in "answer".
//
// The page opens a dataset the server reads by name (`open`), or uploads a file it can decode
// (`create`, then `put` piece by piece: the browser holds the decoded bitmap and one piece
// at a time, never the file's pixels twice). A click is `predict` with the prompts in
// full-image pixels; each mask comes back as the RLE of its bounding box and that box's
// offset, so a click's bytes do not grow with the image.

import { ServerError, infer } from "./kserve.js";
import { decode } from "./rle.js";

const encoder = new TextEncoder();
const PIECE_PX = 2048; // a put's side: 12 MiB of RGB, under the contract's max_piece_pixels
// Pixels the page decodes at most: Chromium's canvases stop at 2**28 pixels, and a decoded
// bitmap costs 4 bytes a pixel (1 GiB at this bound). Larger files are the server's to read.
export const MAX_DECODE_PIXELS = 2 ** 28;
// What the session model takes whole (docs/security.md: 4096 x 4096 decoded pixels): an
// image within it keeps the session path; a larger one goes to the large model.
export const SESSION_MAX_PIXELS = 4096 * 4096;

function requestInput(request) {
  return { name: "request", shape: [1], datatype: "BYTES", data: [JSON.stringify(request)] };
}

/** One op; resolves its JSON answer (with the request's byte counts as `sent`, `received`). */
export async function op(model, request, signal) {
  const body = JSON.stringify({ inputs: [requestInput(request)], outputs: [{ name: "answer" }] });
  const { outputs, sent, received } = await infer(model, body, { "Content-Type": "application/json" }, signal);
  return { ...JSON.parse(outputs.answer.data[0]), sent, received };
}

const PUT_RETRY_MS = [250, 500, 1000, 2000, 4000, 8000, 8000, 8000]; // ~30 s in all

/** A put: `rgb` (Uint8Array of h * w * 3) at [row, col]; pixels as binary data. The server
 * admits a few puts at a time (each holds its piece in memory): refused Overloaded while
 * others upload, the same piece is sent again after a pause, as the Python client does. */
async function put(model, handle, offset, rgb, h, w) {
  const pixels = { name: "pixels", shape: [h, w, 3], datatype: "UINT8", parameters: { binary_data_size: rgb.byteLength } };
  const header = encoder.encode(JSON.stringify({
    inputs: [requestInput({ op: "put", handle, offset }), pixels],
    outputs: [{ name: "answer" }],
  }));
  const headers = { "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": String(header.length) };
  for (let attempt = 0; ; attempt += 1) {
    try {
      const { outputs } = await infer(model, new Blob([header, rgb]), headers);
      return JSON.parse(outputs.answer.data[0]);
    } catch (error) {
      if (error?.code !== "Overloaded" || attempt >= PUT_RETRY_MS.length) throw error;
      await new Promise((resolve) => setTimeout(resolve, PUT_RETRY_MS[attempt]));
    }
  }
}

/** Width and height of an image file, decoding as little as the browser allows (an <img>
 * reads the header; its pixels are decoded only when painted, which this never does). */
export function fileSize(blob) {
  const url = URL.createObjectURL(blob);
  const img = new Image();
  return new Promise((resolve, reject) => {
    img.onload = () => resolve([img.naturalWidth, img.naturalHeight]);
    img.onerror = () => reject(new Error("this browser cannot read the file as an image"));
    img.src = url;
  }).finally(() => URL.revokeObjectURL(url));
}

/** Uploads `bitmap` (an ImageBitmap) as a new image, piece by piece; onProgress(done, total)
 * per piece. Resolves the image's fields (handle, shape...). */
export async function upload(model, bitmap, onProgress) {
  const { width, height } = bitmap;
  const image = await op(model, { op: "create", shape: [height, width, 3], dtype: "uint8", mapping: { kind: "none" } });
  const canvas = new OffscreenCanvas(PIECE_PX, PIECE_PX);
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const total = Math.ceil(height / PIECE_PX) * Math.ceil(width / PIECE_PX);
  let done = 0;
  let last = image;
  for (let row = 0; row < height; row += PIECE_PX) {
    for (let col = 0; col < width; col += PIECE_PX) {
      const h = Math.min(PIECE_PX, height - row);
      const w = Math.min(PIECE_PX, width - col);
      ctx.clearRect(0, 0, w, h);
      ctx.drawImage(bitmap, col, row, w, h, 0, 0, w, h);
      const rgba = ctx.getImageData(0, 0, w, h).data;
      const rgb = new Uint8Array(w * h * 3);
      for (let i = 0, j = 0; i < rgba.length; i += 4, j += 3) rgb.set(rgba.subarray(i, i + 3), j);
      last = await put(model, image.handle, [row, col], rgb, h, w);
      done += 1;
      onProgress?.(done, total);
    }
  }
  if (!last.complete) throw new ServerError(0, "Incomplete", "the server did not take every piece");
  return { ...image, complete: true };
}

/** Opens a dataset the server reads ("<root>/<path>", optional key). */
export function openDataset(model, dataset, key) {
  return op(model, { op: "open", dataset, ...(key ? { key } : {}) });
}

/** Masks for prompts in full-image pixels (the session path's shape of prompts), as crops:
 * resolves {masks: [{offset, size, mask (Uint8Array, row-major), box}], scores, sent,
 * received}. */
export async function predictLarge(model, image, prompts, multimask, signal) {
  const request = { op: "predict", handle: image.handle, multimask_output: multimask };
  if (image.z !== null) request.z = image.z;
  if (prompts.points.length) {
    request.points = prompts.points.map((p) => [p[0], p[1]]);
    request.labels = prompts.points.map((p) => p[2]);
  }
  if (prompts.box) request.box = prompts.box;
  const answer = await op(model, request, signal);
  const masks = answer.masks.map((m) => ({ ...m, mask: decode(m.counts, m.size[0], m.size[1]) }));
  return { masks, scores: answer.masks.map((m) => m.score), sent: answer.sent, received: answer.received, large: answer };
}

/** Forgets an image on the server (its uploaded pixels are deleted). */
export function close(model, handle) {
  return op(model, { op: "close", handle }).catch(() => null); // gone already: nothing to do
}
