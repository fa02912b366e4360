// Pointer and keyboard on the stage: a press that moves less than DRAG_PX is a click (a
// point, negative with Shift), more is a box (or, in concept mode, an exemplar box); the
// pointer resting over the image asks for a hover preview. Keys: N new object, [ ] select,
// Delete remove, Ctrl+Z undo, R refine, E segment everything, F fit, Esc cancel.

import { current, onServer, state, ui } from "./page.js";
import { drawAll, drawMarks, exemplars, viewport } from "./drawing.js";
import { clearHover, hover } from "./hover.js";
import { addObject, remember, removeObject, select, submitClick, undo } from "./objects.js";
import { cancelEverything, segmentEverything } from "./segment.js";

const DRAG_PX = 4; // screen pixels a press must move to be a box rather than a click

// The image pixel under a pointer: the view's, the one transform the canvases are placed by.
function imagePoint(event) {
  return viewport.view.clampedImage(viewport.stagePoint(event));
}

let press = null; // {x, y, clientX, clientY, shift}

/** Listens to the pointer on the marks canvas (the stage's top layer) and to the keyboard. */
export function listenToInput() {
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
      cancelEverything();
      press = null;
      clearHover();
      drawMarks();
    }
  });
}
