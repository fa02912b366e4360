// Many objects at once: "Segment all" (a phrase and/or exemplar boxes, to the concept model)
// and "Segment everything" (a grid of points, to the <family>_everything beside the session
// model). Each adds its instances as new objects, one undo step, at most MAX_OBJECTS in all.

import { concepts, everything, exemplarGone } from "./kserve.js";
import { decode } from "./rle.js";
import { MAX_OBJECTS, showError, showStats, state, stats, ui } from "./page.js";
import { drawAll, exemplars } from "./drawing.js";
import { newObject } from "./prediction.js";
import { remember } from "./objects.js";

export async function segmentConcept(phrase) {
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

/** Shows the "Segment everything" button only where it has a model for the image. */
export function showEverything() {
  ui.everything.hidden = !everythingModel();
}

// Small by default: the page is for checking the model, a full 32x32 grid takes long on a CPU.
// window.annotator.everythingParams can be replaced (a test does).
let everythingJob = null; // its AbortController while one runs

/** Cancels a segment everything in flight (nothing when none runs). */
export function cancelEverything() {
  everythingJob?.abort();
}

export async function segmentEverything() {
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
