// The image's objects as the user edits them: add, remove, select, undo (a snapshot of the
// objects before each change), and a click or box on the current object sent for its mask
// (taking the hover preview's answer when the preview asked for the same prompts).

import { MAX_OBJECTS, current, state, ui } from "./page.js";
import { drawAll } from "./drawing.js";
import { laneFor, newObject, promptKey, promptsOf } from "./prediction.js";
import { clearHover, hideHover, hoverLane, previewAnswer } from "./hover.js";

function snapshot() {
  return {
    current: state.current,
    objects: state.objects.map((o) => ({ ...o, points: o.points.slice() })),
  };
}

/** Keeps the objects as they are now, for undo (the last 200 changes). */
export function remember() {
  state.history.push(snapshot());
  if (state.history.length > 200) state.history.shift();
}

export function undo() {
  const last = state.history.pop();
  if (!last) return;
  for (const object of state.objects) object.lane.cancel();
  state.objects = last.objects.map((o) => {
    const copy = { ...o };
    copy.lane = laneFor(copy);
    return copy;
  });
  state.current = Math.min(last.current, state.objects.length - 1);
  drawAll();
}

export function addObject() {
  if (!state.image || state.objects.length >= MAX_OBJECTS) return;
  remember();
  state.objects.push(newObject());
  state.current = state.objects.length - 1;
  drawAll();
}

export function removeObject() {
  if (!state.image || state.objects.length === 0) return;
  remember();
  current().lane.cancel();
  state.objects.splice(state.current, 1);
  if (state.objects.length === 0) state.objects.push(newObject());
  state.current = Math.min(state.current, state.objects.length - 1);
  drawAll();
}

export function select(index) {
  if (index < 0 || index >= state.objects.length) return;
  state.current = index;
  clearHover();
  drawAll();
}

/** Sends the current object's prompts (its points and box as they are now) for its mask. */
export function submitClick(t0) {
  const object = current();
  const prompts = promptsOf(object);
  const refineFrom = ui.refine.checked && object.logitsKey ? { key: object.logitsKey, index: object.maskIndex } : null;
  const adopt = refineFrom ? null : previewAnswer(promptKey(prompts));
  if (!adopt) hoverLane.cancel(); // a click does not wait for a preview it cannot use
  hideHover();
  object.lane.submit({ kind: "click", prompts, t0, image: state.image, refineFrom, adopt });
}
