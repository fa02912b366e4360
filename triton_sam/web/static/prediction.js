// An object's masks: what its prompts ask the session model (or a large image's model) for,
// and how the answer becomes the object's mask on screen. Each object has its own
// latest-wins lane (lane.js); a new object gets the next colour of the palette.

import { ServerError, embed, predict } from "./kserve.js";
import { Lane } from "./lane.js";
import { decode } from "./rle.js";
import { predictLarge } from "./large.js";
import { afterPaint, clearError, showError, showStats, state, stats } from "./page.js";
import { drawMasks, drawObjectsList } from "./drawing.js";

const PALETTE = [
  [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
  [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212], [0, 128, 128],
];

export function newObject() {
  const colour = PALETTE[state.nextColour % PALETTE.length];
  state.nextColour += 1;
  const object = {
    colour, points: [], box: null, mask: null, rle: null, score: null,
    logitsKey: null, maskIndex: 0,
  };
  object.lane = laneFor(object);
  return object;
}

/** The lane an object's clicks go through (a restored copy of an object gets a new one). */
export function laneFor(object) {
  return new Lane(runPrediction, (result, job) => showPrediction(object, result, job), showError);
}

export function promptsOf(object, extra) {
  const points = object.points.concat(extra ? [extra] : []);
  return { points, box: object.box };
}

// Two requests with the same key ask for the same mask.
export const promptKey = (prompts) => JSON.stringify([prompts.points, prompts.box]);

// One point and no box is ambiguous: ask for three masks and keep the best scored (what
// SamPredictor recommends); more prompts: one mask.
export function multimaskFor(prompts) {
  return prompts.points.length === 1 && !prompts.box;
}

export async function withImage(run) {
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
export async function predictOnLarge(job, signal) {
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

/** The index of the best scored mask of an answer. */
export function best(result) {
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
