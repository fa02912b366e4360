// The four canvases on the stage and the objects list: the image (a large image's tiles),
// the masks, the hover preview and the marks (points, boxes, exemplar boxes, a drag), all
// placed by the viewport (zoom and pan, viewport.js) it owns. Drawing only reads the state;
// what changed it is the caller's.

import { Exemplars } from "./exemplars.js";
import { decode } from "./rle.js";
import { Viewport } from "./viewport.js";
import { paintCrops } from "./crops.js";
import { $, state, ui } from "./page.js";

// Concept mode's "more like this" / "less like this" boxes and the exemplar ids kept (drawn
// with the marks, so they live where the marks are drawn).
export const exemplars = new Exemplars(
  { mode: $("exemplar-mode"), status: $("exemplars"), clear: $("exemplars-clear") },
  () => drawMarks(),
);

// Large images redraw everything through the view (and embed the tiles a resting view
// shows); small ones redraw only their marks (line widths).
export const viewport = new Viewport(ui.stage, [ui.image, ui.masks, ui.hover, ui.marks], (marksOnly) => {
  if (marksOnly) return drawMarks();
  redrawLarge();
  state.image?.prefetch?.viewChanged(viewport.view.visible(ui.image.width, ui.image.height));
});

let hoverCrop = null; // a large image's preview, redrawn as the view moves
let chooseObject = () => {}; // what a click (or Enter) on an object in the list does

/** Sets what choosing object `index` in the objects list does (the page selects it). */
export function onObjectChosen(handler) {
  chooseObject = handler;
}

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

export function drawMasks() {
  if (state.image?.large) paintCrops(ui.masks, viewport.view, state.objects);
  else paint(ui.masks, state.objects);
  drawMarks();
}

export function drawMarks(drag) {
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

export function drawObjectsList() {
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
      item.addEventListener("click", () => chooseObject(k));
      item.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") chooseObject(k);
      });
      return item;
    }),
  );
}

export function drawAll() {
  drawMasks();
  drawObjectsList();
}

export function redrawLarge() {
  const image = state.image;
  if (!image?.large) return;
  image.tiles.draw(ui.image.getContext("2d"), viewport.view, ui.image.width, ui.image.height);
  drawMasks();
  if (hoverCrop) paintCrops(ui.hover, viewport.view, [hoverCrop]);
}

/** Draws a preview's mask `index` of `result` (RLE masks, or a large image's crops) in `colour`. */
export function paintHover(result, index, colour) {
  if (result.large) {
    hoverCrop = { crop: result.masks[index], colour };
    paintCrops(ui.hover, viewport.view, [hoverCrop]);
  } else {
    const [height, width] = result.size;
    const mask = decode(result.masks[index], height, width);
    paint(ui.hover, [{ mask, colour }]);
  }
}

/** Clears the preview layer (and forgets a large image's preview crop). */
export function clearHoverLayer() {
  hoverCrop = null;
  const ctx = ui.hover.getContext("2d");
  ctx.setTransform(1, 0, 0, 1, 0, 0); // a large image's canvases draw through the view
  ctx.clearRect(0, 0, ui.hover.width, ui.hover.height);
}
