// The annotator: one image, several objects, each with its own prompts, mask and colour.
//
// The image file's bytes go to the session model once (embed); every click, box or hover
// sends the image id and the object's prompts and gets RLE masks back (kserve.js). Each
// object's requests and the hover preview run in their own latest-wins lane (lane.js).
// An image larger than the session model takes goes to the <family>_large model instead
// (large.js: a dataset by name, or a file in pieces), is shown from the gateway's tile
// pyramid (tilelayer.js) and its masks come back as crops (crops.js). Zoom and pan are
// viewport.js's; every position between the screen and the image goes through its View.
// window.annotator exposes the state and timings (read by the browser test).

import { ServerError, authHeaders, concepts, embed, everything, exemplarGone, predict, setToken } from "./kserve.js";
import { Lane } from "./lane.js";
import { Exemplars } from "./exemplars.js";
import { VideoConcepts } from "./videoconcepts.js";
import { decode } from "./rle.js";
import { coco, grayPng, labels } from "./export.js";
import { Viewport } from "./viewport.js";
import { paintCrops } from "./crops.js";
import { TileLayer } from "./tilelayer.js";
import { EmbedPrefetch } from "./prefetch.js";
import {
  MAX_DECODE_PIXELS, SESSION_MAX_PIXELS, close as closeLarge, fileSize, op, openDataset, predictLarge, upload,
} from "./large.js";

const PALETTE = [
  [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
  [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212], [0, 128, 128],
];
const DRAG_PX = 4; // screen pixels a press must move to be a box rather than a click
const MAX_OBJECTS = 255; // the label image is 8-bit

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), file: $("file"), stage: $("stage"), image: $("image"), masks: $("masks"),
  hover: $("hover"), marks: $("marks"), objects: $("objects"), stats: $("stats"),
  error: $("error"), errorText: $("error-text"), refine: $("refine"), concept: $("concept"),
  phrase: $("phrase"), threshold: $("threshold"), everything: $("everything"), tokenForm: $("token-form"), token: $("token"),
  datasetForm: $("dataset-form"), dataset: $("dataset"), datasetKey: $("dataset-key"),
  sliceLabel: $("slice-label"), slice: $("slice"),
};
// Concept mode's "more like this" / "less like this" boxes and the exemplar ids kept.
const exemplars = new Exemplars(
  { mode: $("exemplar-mode"), status: $("exemplars"), clear: $("exemplars-clear") },
  () => drawMarks(),
);

// The "Video concepts" panel (a phrase tracked through frames), shown when the server has it.
const videoConcepts = new VideoConcepts(
  {
    form: $("video-concepts"), files: $("vc-files"), count: $("vc-count"), phrase: $("vc-phrase"),
    settings: $("vc-settings"), propagate: $("vc-propagate"), cancel: $("vc-cancel"),
    progress: $("vc-progress"), slider: $("vc-slider"), frameLabel: $("vc-frame"),
    canvas: $("vc-canvas"), download: $("vc-download"),
  },
  (error, context) => showError(error, context),
  (text) => showStats(text),
);

const state = {
  models: [],
  model: null, // session model name
  image: null, // {name, bytes, bitmap, width, height, imageId, model}, or a large image:
  // {name, width, height, model, large: {model, handle, z, uploaded, shape}, tiles}
  objects: [],
  current: 0,
  history: [],
  nextColour: 0,
};

// Large images redraw everything through the view (and embed the tiles a resting view
// shows); small ones redraw only their marks (line widths).
const viewport = new Viewport(ui.stage, [ui.image, ui.masks, ui.hover, ui.marks], (marksOnly) => {
  if (marksOnly) return drawMarks();
  redrawLarge();
  state.image?.prefetch?.viewChanged(viewport.view.visible(ui.image.width, ui.image.height));
});

const stats = {
  clickMs: [], // click (pointerup) to its mask drawn, ms
  clickParts: [], // where each click's time went: {queued, request, draw, paint} ms, adopted
  hoverMs: [], // hover round trips (request sent to answer drawn), ms
  hoverEvents: 0,
  hoverFirst: null,
  hoverLast: null,
  embeds: [],
  concepts: [], // {phrase, instances, sent} per phrase answered
  errors: [],
};

// -- objects and history ----------------------------------------------------------------
function newObject() {
  const colour = PALETTE[state.nextColour % PALETTE.length];
  state.nextColour += 1;
  const object = {
    colour, points: [], box: null, mask: null, rle: null, score: null,
    logitsKey: null, maskIndex: 0,
  };
  object.lane = new Lane(runPrediction, (result, job) => showPrediction(object, result, job), showError);
  return object;
}

function snapshot() {
  return {
    current: state.current,
    objects: state.objects.map((o) => ({ ...o, points: o.points.slice() })),
  };
}

function remember() {
  state.history.push(snapshot());
  if (state.history.length > 200) state.history.shift();
}

function undo() {
  const last = state.history.pop();
  if (!last) return;
  for (const object of state.objects) object.lane.cancel();
  state.objects = last.objects.map((o) => {
    const copy = { ...o };
    copy.lane = new Lane(runPrediction, (result, job) => showPrediction(copy, result, job), showError);
    return copy;
  });
  state.current = Math.min(last.current, state.objects.length - 1);
  drawAll();
}

function current() {
  return state.objects[state.current];
}

function addObject() {
  if (!state.image || state.objects.length >= MAX_OBJECTS) return;
  remember();
  state.objects.push(newObject());
  state.current = state.objects.length - 1;
  drawAll();
}

function removeObject() {
  if (!state.image || state.objects.length === 0) return;
  remember();
  current().lane.cancel();
  state.objects.splice(state.current, 1);
  if (state.objects.length === 0) state.objects.push(newObject());
  state.current = Math.min(state.current, state.objects.length - 1);
  drawAll();
}

function select(index) {
  if (index < 0 || index >= state.objects.length) return;
  state.current = index;
  clearHover();
  drawAll();
}

// -- requests ------------------------------------------------------------------------------
function promptsOf(object, extra) {
  const points = object.points.concat(extra ? [extra] : []);
  return { points, box: object.box };
}

// One point and no box is ambiguous: ask for three masks and keep the best scored (what
// SamPredictor recommends); more prompts: one mask.
function multimaskFor(prompts) {
  return prompts.points.length === 1 && !prompts.box;
}

async function withImage(run) {
  const image = state.image;
  try {
    return await run(image.imageId);
  } catch (e) {
    if (!(e instanceof ServerError) || e.code !== "EmbeddingNotFound" || /previous_key/.test(e.message)) throw e;
    // Evicted or the server restarted: send the file again once.
    const again = await embed(image.model, image.bytes);
    image.imageId = again.imageId;
    return run(image.imageId);
  }
}

// A large image's prompts go to its large model, and its masks come back as crops.
async function predictOnLarge(job, signal) {
  const started = performance.now();
  const result = await predictLarge(job.image.large.model, job.image.large, job.prompts, multimaskFor(job.prompts), signal);
  return { ...result, started, answered: performance.now() };
}

async function runPrediction(job, signal) {
  if (job.adopt) {
    // The preview under the cursor asked for exactly these prompts: its answer is this
    // click's (no second request for the server to run first).
    const started = performance.now();
    try {
      const result = await job.adopt;
      return { ...result, started, answered: performance.now(), adopted: true };
    } catch (e) {
      if (e.name !== "AbortError") throw e; // the preview was cancelled: ask ourselves
    }
  }
  if (job.image.large) return predictOnLarge(job, signal);
  const multimask = multimaskFor(job.prompts);
  const options = { multimask, keepLogits: job.kind === "click" };
  if (job.kind === "click" && job.refineFrom) {
    options.previousKey = job.refineFrom.key;
    options.previousIndex = job.refineFrom.index;
  }
  const started = performance.now();
  let result;
  try {
    result = await withImage((id) => predict(state.image.model, id, job.prompts, options, signal));
  } catch (e) {
    if (options.previousKey && e instanceof ServerError && e.code === "EmbeddingNotFound") {
      // The kept logits are gone (evicted, restarted): the click without them.
      delete options.previousKey;
      result = await withImage((id) => predict(state.image.model, id, job.prompts, options, signal));
    } else {
      throw e;
    }
  }
  result.started = started;
  result.answered = performance.now();
  return result;
}

function best(result) {
  let index = 0;
  result.scores.forEach((s, i) => {
    if (s > result.scores[index]) index = i;
  });
  return index;
}

function showPrediction(object, result, job) {
  if (!state.objects.includes(object) || job.image !== state.image) return;
  const index = best(result);
  if (result.large) {
    object.crop = result.masks[index];
    object.rle = object.crop.counts;
  } else {
    const [height, width] = result.size;
    object.rle = result.masks[index];
    object.mask = decode(object.rle, height, width);
  }
  object.score = result.scores[index];
  object.logitsKey = result.logitsKey;
  object.maskIndex = index;
  clearError();
  drawMasks();
  drawObjectsList();
  const drawn = performance.now();
  afterPaint(() => {
    const ms = performance.now() - job.t0;
    stats.clickMs.push(ms);
    stats.clickParts.push({
      queued: result.started - job.t0,
      request: result.answered - result.started,
      draw: drawn - result.answered,
      paint: performance.now() - drawn,
      adopted: Boolean(result.adopted),
    });
    const how = result.adopted ? " (the preview's request)" : "";
    showStats(`click: ${ms.toFixed(0)} ms to the mask on screen · sent ${result.sent} B · received ${result.received} B${how} · score ${object.score.toFixed(3)}`);
  });
}

function submitClick(t0) {
  const object = current();
  const prompts = promptsOf(object);
  const refineFrom = ui.refine.checked && object.logitsKey ? { key: object.logitsKey, index: object.maskIndex } : null;
  const key = promptKey(prompts);
  let adopt = null;
  if (!refineFrom && hoverDone?.key === key && hoverDone.image === state.image) {
    adopt = Promise.resolve(hoverDone.result);
  } else if (!refineFrom && hoverInflight?.key === key && hoverInflight.image === state.image) {
    adopt = hoverInflight.promise;
  }
  if (!adopt) hoverLane.cancel(); // a click does not wait for a preview it cannot use
  hideHover();
  object.lane.submit({ kind: "click", prompts, t0, image: state.image, refineFrom, adopt });
}

// Hover preview: the current object's prompts plus a point under the cursor (negative while
// Shift is held), asked for exactly as a click there would ask (kept logits included), so
// a click where the cursor rests takes the preview's answer, or waits for the one in flight.
const promptKey = (prompts) => JSON.stringify([prompts.points, prompts.box]);
let hoverInflight = null; // {key, image, promise}
let hoverDone = null; // {key, image, result}: the last preview answered

const hoverLane = new Lane(
  async (job, signal) => {
    const options = { multimask: multimaskFor(job.prompts), keepLogits: true };
    const promise = job.image.large
      ? predictOnLarge(job, signal)
      : withImage((id) => predict(job.image.model, id, job.prompts, options, signal));
    const mine = { key: job.key, image: job.image, promise };
    hoverInflight = mine;
    try {
      const result = await promise;
      hoverDone = { key: job.key, image: job.image, result };
      return result;
    } finally {
      if (hoverInflight === mine) hoverInflight = null;
    }
  },
  (result, job) => {
    if (job.image !== state.image || !hovering) return;
    if (result.large) {
      hoverCrop = { crop: result.masks[best(result)], colour: current().colour };
      paintCrops(ui.hover, viewport.view, [hoverCrop]);
    } else {
      const [height, width] = result.size;
      const mask = decode(result.masks[best(result)], height, width);
      paint(ui.hover, [{ mask, colour: current().colour }]);
    }
    afterPaint(() => stats.hoverMs.push(performance.now() - job.t0));
  },
  (error) => showError(error),
);

let hovering = false;
let hoverCrop = null; // a large image's preview, redrawn as the view moves

// An image the server holds: prompts can go.
const onServer = () => Boolean(state.image?.imageId || state.image?.large);

function hover(point, negative, t0) {
  if (!onServer()) return;
  hovering = true;
  stats.hoverEvents += 1;
  stats.hoverFirst ??= t0;
  stats.hoverLast = t0;
  const prompts = promptsOf(current(), [point[0], point[1], negative ? 0 : 1]);
  hoverLane.submit({ prompts, key: promptKey(prompts), t0: performance.now(), image: state.image });
}

// Hide the preview and drop the waiting one; the request in flight goes on (a click may be
// waiting for its answer).
function hideHover() {
  hovering = false;
  hoverCrop = null;
  hoverLane.dropWaiting();
  const ctx = ui.hover.getContext("2d");
  ctx.setTransform(1, 0, 0, 1, 0, 0); // a large image's canvases draw through the view
  ctx.clearRect(0, 0, ui.hover.width, ui.hover.height);
}

function clearHover() {
  hideHover();
  hoverLane.cancel();
}

// -- opening images ------------------------------------------------------------------------
async function openFile(file) {
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

async function openDatasetNamed(dataset, key) {
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
async function openHandle(model, handle) {
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
function showSlice(z) {
  const image = state.image;
  if (!image?.large || image.large.z === null || !(z >= 0 && z < image.large.shape[0])) return;
  const large = { ...image.large, z };
  const next = { ...image, large };
  next.tiles = new TileLayer({ ...large, width: image.width, height: image.height }, () => redrawLarge(), authHeaders);
  next.prefetch = new EmbedPrefetch({ ...image.prefetch.image, z });
  image.large = { ...image.large, uploaded: false }; // the same handle: not closed
  adopt(next);
}

function redrawLarge() {
  const image = state.image;
  if (!image?.large) return;
  image.tiles.draw(ui.image.getContext("2d"), viewport.view, ui.image.width, ui.image.height);
  drawMasks();
  if (hoverCrop) paintCrops(ui.hover, viewport.view, [hoverCrop]);
}

async function switchModel(name) {
  state.model = name;
  showEverything();
  const image = state.image;
  if (!image || image.large || image.model === name) return; // a large image stays on its model
  try {
    const served = await embed(name, image.bytes);
    clearHover();
    hoverDone = null; // another model's answers are not this one's
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

async function segmentConcept(phrase) {
  const model = state.models.find((m) => m.kind === "concept");
  if (!model || !state.image || !(phrase || exemplars.any(state.image))) return;
  if (state.image.large) {
    showError(new Error("concepts on a large image: not on this page yet (the concept model takes the whole image)"));
    return;
  }
  const { width, height } = state.image;
  const pixels = ui.image.getContext("2d").getImageData(0, 0, width, height).data;
  const rgb = new Uint8Array(width * height * 3);
  for (let i = 0, j = 0; i < pixels.length; i += 4, j += 3) rgb.set(pixels.subarray(i, i + 3), j);
  const image = state.image;
  const prompt = { phrase, threshold: ui.threshold.valueAsNumber, ...exemplars.request(image) };
  const what = [phrase && `"${phrase}"`, prompt.boxes.length + prompt.ids.length && "exemplars"].filter(Boolean).join(" + ");
  try {
    const result = await concepts(model.name, image, rgb, prompt);
    exemplars.keep(result.exemplarId, prompt, image);
    if (state.image !== image) return; // another image meanwhile: not its objects
    remember();
    const room = MAX_OBJECTS - state.objects.length;
    result.masks.slice(0, room).forEach((rle, k) => {
      const object = newObject();
      object.rle = rle;
      object.mask = decode(rle, height, width);
      object.score = result.scores[k];
      state.objects.push(object);
    });
    drawAll();
    stats.concepts.push({
      phrase, instances: result.masks.length, sent: result.sent, exemplarId: result.exemplarId,
      boxes: prompt.boxes, labels: prompt.labels, ids: prompt.ids,
    });
    const kept = result.masks.length > room ? ` (${room} kept: ${MAX_OBJECTS} objects at most)` : "";
    showStats(`${what}: ${result.masks.length} instances${kept} · sent ${result.sent} B · received ${result.received} B`);
  } catch (e) {
    // A kept exemplar the server no longer holds (evicted, restarted): the message says so
    // and names it; the page stops sending it.
    const gone = exemplarGone(e);
    if (gone !== null) exemplars.forget(gone);
    showError(e, `Could not segment ${what}`);
  }
}

// The served <family>_everything beside the current session model (null: none listed).
function everythingModel() {
  if (state.image?.large) return null; // the everything model takes a session's image
  const name = state.model?.replace(/_session$/, "_everything");
  return state.models.find((m) => m.kind === "everything" && m.name === name) ?? null;
}

function showEverything() {
  ui.everything.hidden = !everythingModel();
}

// Small by default: the page is for checking the model, a full 32x32 grid takes long on a CPU.
// window.annotator.everythingParams can be replaced (a test does).
let everythingJob = null; // its AbortController while one runs

async function segmentEverything() {
  if (everythingJob) {
    everythingJob.abort();
    return;
  }
  const model = everythingModel();
  if (!model || !state.image?.imageId) return;
  const { width, height, imageId } = state.image;
  const image = state.image;
  everythingJob = new AbortController();
  ui.everything.textContent = "Cancel";
  ui.everything.title = "Cancel segment everything (Esc)";
  try {
    const result = await everything(model.name, imageId, window.annotator.everythingParams,
      (done, total) => showStats(`Segment everything: ${done}/${total} batches`), everythingJob.signal);
    if (state.image !== image) return; // another image meanwhile
    remember();
    const room = MAX_OBJECTS - state.objects.length;
    for (const record of result.instances.slice(0, room)) {
      const object = newObject();
      object.rle = record.segmentation.counts;
      object.mask = decode(object.rle, height, width);
      object.score = record.predicted_iou;
      state.objects.push(object);
    }
    drawAll();
    const n = result.instances.length;
    const kept = n > room ? ` (${room} kept: ${MAX_OBJECTS} objects at most)` : "";
    showStats(`Segment everything: ${n} instances${kept}`);
  } catch (e) {
    if (e.name === "AbortError") showStats("Segment everything: cancelled");
    else showError(e, "Could not segment everything");
  } finally {
    everythingJob = null;
    ui.everything.textContent = "Segment everything";
    ui.everything.title = "Segment everything (E; Esc cancels)";
  }
}

// -- drawing ---------------------------------------------------------------------------------
// Masks are drawn opaque (alpha 255) and the layer is made translucent by CSS, so the canvas
// holds each object's exact colour: what is on screen can be read back pixel for pixel.
function paint(canvas, layers) {
  const { width, height } = canvas;
  const ctx = canvas.getContext("2d");
  const out = ctx.createImageData(width, height);
  for (const { mask, colour } of layers) {
    if (!mask || mask.length !== width * height) continue;
    for (let i = 0; i < mask.length; i += 1) {
      if (mask[i]) {
        out.data[4 * i] = colour[0];
        out.data[4 * i + 1] = colour[1];
        out.data[4 * i + 2] = colour[2];
        out.data[4 * i + 3] = 255;
      }
    }
  }
  ctx.putImageData(out, 0, 0);
}

function drawMasks() {
  if (state.image?.large) paintCrops(ui.masks, viewport.view, state.objects);
  else paint(ui.masks, state.objects);
  drawMarks();
}

function drawMarks(drag) {
  const ctx = ui.marks.getContext("2d");
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.clearRect(0, 0, ui.marks.width, ui.marks.height);
  // Marks are in image pixels: on a large image's stage-sized canvas through the view; on a
  // small image's canvas as they are (the view places that canvas). Lines keep their width.
  if (state.image?.large) viewport.view.apply(ctx);
  const scale = 1 / viewport.view.scale;
  state.objects.forEach((object, k) => {
    const [r, g, b] = object.colour;
    ctx.lineWidth = (k === state.current ? 2.5 : 1.5) * scale;
    ctx.strokeStyle = `rgb(${r},${g},${b})`;
    if (object.box) {
      const [x0, y0, x1, y1] = object.box;
      ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
    }
    for (const [x, y, label] of object.points) {
      ctx.beginPath();
      ctx.arc(x, y, 4 * scale, 0, 2 * Math.PI);
      ctx.fillStyle = label ? "#1b5e20" : "#b71c1c";
      ctx.fill();
      ctx.strokeStyle = "#fff";
      ctx.stroke();
    }
  });
  exemplars.draw(ctx, state.image, scale);
  if (drag) {
    ctx.setLineDash([4 * scale, 3 * scale]);
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(drag[0], drag[1], drag[2] - drag[0], drag[3] - drag[1]);
    ctx.setLineDash([]);
  }
}

function drawObjectsList() {
  ui.objects.replaceChildren(
    ...state.objects.map((object, k) => {
      const item = document.createElement("li");
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", String(k === state.current));
      item.tabIndex = 0;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = `rgb(${object.colour.join(",")})`;
      const prompts = `${object.points.length} point${object.points.length === 1 ? "" : "s"}${object.box ? " + box" : ""}`;
      const score = object.score === null ? "" : ` · score ${object.score.toFixed(2)}`;
      item.append(swatch, `Object ${k + 1}: ${prompts}${score}`);
      item.addEventListener("click", () => select(k));
      item.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") select(k);
      });
      return item;
    }),
  );
}

function drawAll() {
  drawMasks();
  drawObjectsList();
}

// After the browser painted the frame holding what was just drawn.
function afterPaint(callback) {
  requestAnimationFrame(() => setTimeout(callback, 0));
}

function showStats(text) {
  ui.stats.textContent = text;
}

function showError(error, context) {
  const text = error instanceof ServerError ? `${error.code}: ${error.message}` : error.message || String(error);
  const message = context ? `${context}: ${text}` : text;
  stats.errors.push(message);
  ui.errorText.textContent = message;
  ui.error.hidden = false;
  if (error instanceof ServerError && error.code === "Unauthorized") ui.tokenForm.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.errorText.textContent = "";
}

// -- input -------------------------------------------------------------------------------------
// The image pixel under a pointer: the view's, the one transform the canvases are placed by.
function imagePoint(event) {
  return viewport.view.clampedImage(viewport.stagePoint(event));
}

let press = null; // {x, y, clientX, clientY, shift}

ui.marks.addEventListener("pointerdown", (event) => {
  if (!(onServer() || exemplars.drawsOn(state.image)) || event.button !== 0 || viewport.panning) return;
  ui.marks.setPointerCapture(event.pointerId);
  const [x, y] = imagePoint(event);
  press = { x, y, clientX: event.clientX, clientY: event.clientY, shift: event.shiftKey, dragging: false };
});

ui.marks.addEventListener("pointermove", (event) => {
  if (!state.image || viewport.panning) return;
  if (press) {
    if (Math.hypot(event.clientX - press.clientX, event.clientY - press.clientY) >= DRAG_PX) press.dragging = true;
    if (press.dragging) {
      clearHover();
      const [x, y] = imagePoint(event);
      drawMarks([Math.min(press.x, x), Math.min(press.y, y), Math.max(press.x, x), Math.max(press.y, y)]);
    }
    return;
  }
  if (!exemplars.drawsOn(state.image)) hover(imagePoint(event), event.shiftKey, event.timeStamp);
});

ui.marks.addEventListener("pointerup", (event) => {
  if (!press) return;
  const start = press;
  press = null;
  const t0 = event.timeStamp; // same clock as performance.now()
  if (exemplars.drawsOn(state.image)) {
    // Concept mode: a drag is an exemplar box for the next "Segment all"; a click, nothing.
    const [x, y] = imagePoint(event);
    if (start.dragging) exemplars.add([Math.min(start.x, x), Math.min(start.y, y), Math.max(start.x, x), Math.max(start.y, y)], state.image);
    else drawMarks();
    return;
  }
  remember();
  const object = current();
  if (start.dragging) {
    const [x, y] = imagePoint(event);
    object.box = [Math.min(start.x, x), Math.min(start.y, y), Math.max(start.x, x), Math.max(start.y, y)];
  } else {
    object.points.push([start.x, start.y, start.shift ? 0 : 1]);
  }
  drawAll();
  submitClick(t0);
});

ui.marks.addEventListener("pointerleave", () => {
  if (!press) clearHover();
});

document.addEventListener("keydown", (event) => {
  if (event.target instanceof HTMLInputElement && ["text", "number"].includes(event.target.type)) return;
  const key = event.key.toLowerCase();
  if ((event.ctrlKey || event.metaKey) && key === "z") {
    event.preventDefault();
    undo();
  } else if (event.ctrlKey || event.metaKey || event.altKey) {
    return;
  } else if (key === "n") {
    addObject();
  } else if (key === "[") {
    select(state.current - 1);
  } else if (key === "]") {
    select(state.current + 1);
  } else if (key === "r") {
    ui.refine.checked = !ui.refine.checked;
  } else if (key === "delete") {
    removeObject();
  } else if (key === "e") {
    segmentEverything();
  } else if (key === "f") {
    viewport.fit();
  } else if (key === "escape") {
    everythingJob?.abort();
    press = null;
    clearHover();
    drawMarks();
  }
});

ui.file.addEventListener("change", () => {
  openFile(ui.file.files[0]);
  ui.file.value = ""; // the same file again is a change too
});
ui.stage.addEventListener("dragover", (event) => event.preventDefault());
ui.stage.addEventListener("drop", (event) => {
  event.preventDefault();
  openFile(event.dataTransfer.files[0]);
});
ui.model.addEventListener("change", () => switchModel(ui.model.value));
$("new-object").addEventListener("click", addObject);
$("fit").addEventListener("click", () => viewport.fit());
ui.datasetForm.addEventListener("submit", (event) => {
  event.preventDefault();
  openDatasetNamed(ui.dataset.value.trim(), ui.datasetKey.value.trim());
});
ui.slice.addEventListener("change", () => showSlice(Number(ui.slice.value)));
ui.everything.addEventListener("click", () => segmentEverything());
$("undo").addEventListener("click", undo);
$("error-close").addEventListener("click", clearError);
$("export-png").addEventListener("click", () => exportPng());
$("export-coco").addEventListener("click", () => exportCoco());
ui.tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(ui.token.value.trim());
  ui.token.value = "";
  ui.tokenForm.hidden = true;
  clearError();
});
ui.concept.addEventListener("submit", (event) => {
  event.preventDefault();
  segmentConcept(ui.phrase.value.trim());
});

// -- export -----------------------------------------------------------------------------------
function baseName() {
  return (state.image?.name || "image").replace(/\.[^.]*$/, "");
}

function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function exportable() {
  if (state.image?.large) showError(new Error("exports of a large image: use the Python client (its large-image masks), the page holds only crops"));
  return Boolean(state.image && !state.image.large);
}

async function exportPng() {
  if (!exportable()) return;
  const { width, height } = state.image;
  const blob = await grayPng(labels(state.objects, height, width), height, width);
  download(blob, `${baseName()}_labels.png`);
}

function exportCoco() {
  if (!exportable()) return;
  const { width, height, name, model } = state.image;
  const text = coco(name, state.objects, height, width, model);
  download(new Blob([text], { type: "application/json" }), `${baseName()}_coco.json`);
}

// -- start -------------------------------------------------------------------------------------
async function start() {
  try {
    const response = await fetch("/web/models");
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || `HTTP ${response.status}`);
    state.models = body.models;
  } catch (e) {
    showError(e, "Could not list the server's models");
    return;
  }
  const sessions = state.models.filter((m) => m.kind === "session");
  ui.model.replaceChildren(...sessions.map((m) => new Option(m.label, m.name)));
  state.model = sessions[0]?.name ?? null;
  ui.concept.hidden = !state.models.some((m) => m.kind === "concept");
  // Without a session model a drag has nothing else to draw: exemplars by default.
  if (!sessions.length) ui.concept.querySelector("#exemplar-mode").value = "1";
  ui.datasetForm.hidden = !state.models.some((m) => m.kind === "large");
  videoConcepts.offer(state.models.find((m) => m.kind === "concept_video") ?? null);
  showEverything();
  if (!state.models.length) showError(new Error("the server offers no model this page can use"));
  document.body.dataset.ready = "true";
}

const idle = () =>
  hoverLane.idle && state.objects.every((o) => o.lane.idle) && (state.image?.tiles?.idle ?? true);

window.annotator = {
  state,
  stats,
  exemplars,
  videoConcepts,
  hoverLane,
  viewport,
  /** Opens a dataset the server reads (what the dataset form does). */
  openDataset: openDatasetNamed,
  /** Opens an image the large model holds under `handle` (uploaded by another client). */
  openHandle,
  /** Nothing in flight or waiting, in any lane. */
  idle,
  /** Resolves once idle and the last answer is on screen (checked in the page, so a test
   * waiting for it sends no polling traffic through WebDriver while it measures). */
  whenIdle: () =>
    new Promise((resolve) => {
      const check = () => (idle() ? afterPaint(resolve) : setTimeout(check, 2));
      check();
    }),
  everythingParams: { points_per_side: 8 },
  requestsSent: () => hoverLane.sent + state.objects.reduce((n, o) => n + o.lane.sent, 0),
};

start();
