// The hover preview: the current object's prompts plus a point under the cursor (negative
// while Shift is held), asked for exactly as a click there would ask (kept logits included),
// so a click where the cursor rests takes the preview's answer, or waits for the one in
// flight (previewAnswer). The previews run in their own latest-wins lane.

import { predict } from "./kserve.js";
import { Lane } from "./lane.js";
import { afterPaint, current, onServer, showError, state, stats } from "./page.js";
import { clearHoverLayer, paintHover } from "./drawing.js";
import { best, multimaskFor, predictOnLarge, promptKey, promptsOf, withImage } from "./prediction.js";

let hoverInflight = null; // {key, image, promise}
let hoverDone = null; // {key, image, result}: the last preview answered
let hovering = false;

export const hoverLane = new Lane(
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
    paintHover(result, best(result), current().colour);
    afterPaint(() => stats.hoverMs.push(performance.now() - job.t0));
  },
  (error) => showError(error),
);

export function hover(point, negative, t0) {
  if (!onServer()) return;
  hovering = true;
  stats.hoverEvents += 1;
  stats.hoverFirst ??= t0;
  stats.hoverLast = t0;
  const prompts = promptsOf(current(), [point[0], point[1], negative ? 0 : 1]);
  hoverLane.submit({ prompts, key: promptKey(prompts), t0: performance.now(), image: state.image });
}

/** The answer (a promise) of the preview that asked for prompts of `key` on this image, if any:
 * the one answered last, else the one in flight; null when neither asked for them. */
export function previewAnswer(key) {
  if (hoverDone?.key === key && hoverDone.image === state.image) return Promise.resolve(hoverDone.result);
  if (hoverInflight?.key === key && hoverInflight.image === state.image) return hoverInflight.promise;
  return null;
}

/** Forgets the last preview's answer (another model's answers are not this one's). */
export function forgetPreviews() {
  hoverDone = null;
}

// Hide the preview and drop the waiting one; the request in flight goes on (a click may be
// waiting for its answer).
export function hideHover() {
  hovering = false;
  hoverLane.dropWaiting();
  clearHoverLayer();
}

export function clearHover() {
  hideHover();
  hoverLane.cancel();
}
