// What every part of the annotator shares: the page's elements, the annotation state (the
// image, its objects, the undo history), the timings the browser test reads, and the status
// and error lines. Nothing here sends a request or draws on a canvas.

import { ServerError } from "./kserve.js";

export const MAX_OBJECTS = 255; // the label image is 8-bit

export const $ = (id) => document.getElementById(id);
export const ui = {
  model: $("model"), file: $("file"), stage: $("stage"), image: $("image"), masks: $("masks"),
  hover: $("hover"), marks: $("marks"), objects: $("objects"), stats: $("stats"),
  error: $("error"), errorText: $("error-text"), refine: $("refine"), concept: $("concept"),
  phrase: $("phrase"), threshold: $("threshold"), everything: $("everything"), tokenForm: $("token-form"), token: $("token"),
  datasetForm: $("dataset-form"), dataset: $("dataset"), datasetKey: $("dataset-key"),
  sliceLabel: $("slice-label"), slice: $("slice"),
};

export const state = {
  models: [],
  model: null, // session model name
  image: null, // {name, bytes, bitmap, width, height, imageId, model}, or a large image:
  // {name, width, height, model, large: {model, handle, z, uploaded, shape}, tiles}
  objects: [],
  current: 0,
  history: [],
  nextColour: 0,
};

export const stats = {
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

/** The object the next click or box goes to. */
export function current() {
  return state.objects[state.current];
}

// An image the server holds: prompts can go.
export const onServer = () => Boolean(state.image?.imageId || state.image?.large);

// After the browser painted the frame holding what was just drawn.
export function afterPaint(callback) {
  requestAnimationFrame(() => setTimeout(callback, 0));
}

export function showStats(text) {
  ui.stats.textContent = text;
}

export function showError(error, context) {
  const text = error instanceof ServerError ? `${error.code}: ${error.message}` : error.message || String(error);
  const message = context ? `${context}: ${text}` : text;
  stats.errors.push(message);
  ui.errorText.textContent = message;
  ui.error.hidden = false;
  if (error instanceof ServerError && error.code === "Unauthorized") ui.tokenForm.hidden = false;
}

export function clearError() {
  ui.error.hidden = true;
  ui.errorText.textContent = "";
}
