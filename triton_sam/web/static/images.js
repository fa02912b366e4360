// Opening an image and changing model: a file embedded by the session model (kept in the
// page when only a concept model is served), or, larger than the session model takes, a file
// uploaded in pieces, a dataset by name or a handle, held by the <family>_large model and
// shown from its tile pyramid (large.js, tilelayer.js); a volume's slices; the session model
// switched with the image kept. A new image replaces the objects of the one before.

import { authHeaders, embed } from "./kserve.js";
import { TileLayer } from "./tilelayer.js";
import { EmbedPrefetch } from "./prefetch.js";
import {
  MAX_DECODE_PIXELS, SESSION_MAX_PIXELS, close as closeLarge, fileSize, op, openDataset, upload,
} from "./large.js";
import { clearError, showError, showStats, state, stats, ui } from "./page.js";
import { drawAll, exemplars, redrawLarge, viewport } from "./drawing.js";
import { newObject, promptsOf } from "./prediction.js";
import { clearHover, forgetPreviews } from "./hover.js";
import { showEverything } from "./segment.js";

export async function openFile(file) {
  if (!file || !state.models.length) return;
  const large = largeModel();
  if (large) {
    // Only a large model changes anything: without one, the file goes as it always went.
    const size = await fileSize(file).catch(() => null); // null: the server may read it
    if (size && size[0] * size[1] > SESSION_MAX_PIXELS) return openLargeFile(file, size, large);
  }
  const bytes = await file.arrayBuffer();
  const model = state.model; // null on a server with a concept model only: nothing to embed
  const t0 = performance.now();
  const [served, shown] = await Promise.allSettled([
    model ? embed(model, bytes) : Promise.resolve({ imageId: null, encoded: 0, sent: 0, received: 0 }),
    createImageBitmap(new Blob([bytes])),
  ]);
  if (served.status === "rejected") {
    showError(served.reason, `Could not open ${file.name}`);
    return; // the image before stays, with its objects
  }
  if (shown.status === "rejected") {
    showError(new Error(`this browser cannot display ${file.name} (${file.type || "unknown type"}); the server could: convert it to PNG`));
    return;
  }
  const ms = performance.now() - t0;
  stats.embeds.push(ms);
  const bitmap = shown.value;
  adopt({
    name: file.name, bytes, bitmap, width: bitmap.width, height: bitmap.height,
    imageId: served.value.imageId, model,
  });
  const what = !model ? "kept in the page" : served.value.encoded ? "encoded" : "already cached";
  showStats(`image ${bitmap.width}×${bitmap.height}: ${ms.toFixed(0)} ms (${what}) · sent ${served.value.sent} B · received ${served.value.received} B`);
}

// The page's image becomes `image`: the objects of the one before go, and it is shown whole.
function adopt(image) {
  for (const object of state.objects) object.lane.cancel();
  clearHover();
  const before = state.image;
  if (before?.tiles) before.tiles.close();
  before?.prefetch?.close();
  if (before?.large?.uploaded) closeLarge(before.large.model, before.large.handle); // its pixels go
  state.image = image;
  exemplars.imageChanged(image);
  state.objects = [newObject()];
  state.current = 0;
  state.history = [];
  if (!image.large) {
    for (const canvas of [ui.image, ui.masks, ui.hover, ui.marks]) {
      canvas.width = image.width;
      canvas.height = image.height;
    }
    ui.image.getContext("2d").drawImage(image.bitmap, 0, 0);
  }
  ui.stage.classList.add("loaded");
  ui.sliceLabel.hidden = !(image.large && image.large.z !== null);
  clearError();
  showEverything();
  viewport.show(image);
  drawAll();
}

// The served <family>_large beside the current session model, else any (null: none).
function largeModel() {
  const family = state.model?.replace(/_session$/, "");
  const large = state.models.filter((m) => m.kind === "large");
  return (large.find((m) => m.name === `${family}_large`) ?? large[0])?.name ?? null;
}

// A file too large for the session model: decoded here if it fits, sent in pieces.
async function openLargeFile(file, [width, height], model) {
  if (width * height > MAX_DECODE_PIXELS) {
    const most = (MAX_DECODE_PIXELS / 2 ** 20).toFixed(0);
    showError(new Error(`${file.name} is ${width}×${height}: too large to decode in the browser (${most} Mpx at most); put it under one of the server's data roots and open it as a dataset`));
    return;
  }
  try {
    const t0 = performance.now();
    const bitmap = await createImageBitmap(file, { colorSpaceConversion: "none", premultiplyAlpha: "none" });
    const answer = await upload(model, bitmap, (done, total) => showStats(`uploading ${file.name}: ${done}/${total} pieces`));
    bitmap.close(); // the server has the pixels now; the page shows its tiles
    showLarge(file.name, answer, model, true, t0);
  } catch (e) {
    showError(e, `Could not open ${file.name}`);
  }
}

export async function openDatasetNamed(dataset, key) {
  const model = largeModel();
  if (!model || !dataset) return;
  try {
    const t0 = performance.now();
    showLarge(dataset, await openDataset(model, dataset, key), model, false, t0);
  } catch (e) {
    showError(e, `Could not open ${dataset}`);
  }
}

// An image the large model already holds for this tenant (a Python client uploaded it, say).
export async function openHandle(model, handle) {
  try {
    const t0 = performance.now();
    showLarge(handle, await op(model, { op: "status", handle }), model, false, t0);
  } catch (e) {
    showError(e, `Could not open ${handle}`);
  }
}

function showLarge(name, answer, model, uploaded, t0) {
  const volume = answer.axes.startsWith("z");
  const [height, width] = volume ? answer.shape.slice(1, 3) : answer.shape.slice(0, 2);
  const large = { model, handle: answer.handle, z: volume ? 0 : null, uploaded, shape: answer.shape };
  const image = { name, width, height, model: state.model, imageId: null, large };
  image.tiles = new TileLayer({ ...large, width, height }, () => redrawLarge(), authHeaders);
  image.prefetch = new EmbedPrefetch({ ...large, tile: answer.tile, grid: answer.grid });
  adopt(image);
  const depth = volume ? ` × ${answer.shape[0]} slices` : "";
  showStats(`image ${width}×${height}${depth} on ${model}: ${(performance.now() - t0).toFixed(0)} ms · tiles ${answer.tile.join("×")} · nothing embedded yet`);
}

// A volume's slice: its own objects (a click is on one slice).
export function showSlice(z) {
  const image = state.image;
  if (!image?.large || image.large.z === null || !(z >= 0 && z < image.large.shape[0])) return;
  const large = { ...image.large, z };
  const next = { ...image, large };
  next.tiles = new TileLayer({ ...large, width: image.width, height: image.height }, () => redrawLarge(), authHeaders);
  next.prefetch = new EmbedPrefetch({ ...image.prefetch.image, z });
  image.large = { ...image.large, uploaded: false }; // the same handle: not closed
  adopt(next);
}

export async function switchModel(name) {
  state.model = name;
  showEverything();
  const image = state.image;
  if (!image || image.large || image.model === name) return; // a large image stays on its model
  try {
    const served = await embed(name, image.bytes);
    clearHover();
    forgetPreviews(); // another model's answers are not this one's
    image.model = name;
    image.imageId = served.imageId;
    for (const object of state.objects) {
      object.mask = null;
      if (object.points.length || object.box) object.lane.submit({ kind: "click", prompts: promptsOf(object), t0: performance.now(), image });
    }
    drawAll();
  } catch (e) {
    showError(e, `Could not use ${name}`);
  }
}
