// The stage as a viewport onto the image: wheel to zoom around the cursor, drag with Space
// held to pan, "fit" to see the whole image. The transform itself is view.js's; this module
// only turns input into changes of it and applies it to the canvases:
// - a small image: canvases at the image's resolution, placed by a CSS transform (zooming
//   and panning redraw nothing; what the page drew before it zoomed is drawn the same);
// - a large image: canvases the stage's size, redrawn through the transform (`redraw`).

import { View, wheelFactor } from "./view.js";

export class Viewport {
  constructor(stage, canvases, redraw) {
    this.stage = stage;
    this.canvases = canvases;
    this.redraw = redraw;
    this.view = new View();
    this.large = false;
    this.space = false; // Space held: a drag pans
    this.pan = null; // {pointerId, clientX, clientY} while panning
    stage.addEventListener("wheel", (e) => this.#wheel(e), { passive: false });
    stage.addEventListener("pointerdown", (e) => this.#panStart(e), { capture: true });
    stage.addEventListener("pointermove", (e) => this.#panMove(e), { capture: true });
    stage.addEventListener("pointerup", (e) => this.#panEnd(e), { capture: true });
    document.addEventListener("keydown", (e) => this.#key(e, true));
    document.addEventListener("keyup", (e) => this.#key(e, false));
    window.addEventListener("blur", () => this.#setSpace(false));
    window.addEventListener("resize", () => this.layout());
  }

  /** Stage pixels of a pointer event (the stage has no border or padding). */
  stagePoint(event) {
    const rect = this.stage.getBoundingClientRect();
    return [event.clientX - rect.left, event.clientY - rect.top];
  }

  /** Shows `image` ({width, height, large}) fitted to the stage. */
  show(image) {
    this.image = image;
    this.large = Boolean(image.large);
    this.stage.classList.toggle("large", this.large);
    this.fit();
  }

  fit() {
    if (!this.image) return;
    this.view.fit(this.image.width, this.image.height, this.stage.clientWidth, this.stage.clientHeight);
    this.layout();
  }

  /** Applies the view to the canvases (and redraws a large image). */
  layout() {
    if (!this.image) return;
    if (this.large) {
      const w = this.stage.clientWidth;
      const h = this.stage.clientHeight;
      for (const canvas of this.canvases) {
        canvas.style.transform = "";
        if (canvas.width !== w || canvas.height !== h) {
          canvas.width = w;
          canvas.height = h;
        }
      }
      this.redraw();
    } else {
      const css = this.view.css();
      for (const canvas of this.canvases) canvas.style.transform = css;
      this.redraw(true); // only what depends on the scale on screen (marks' line widths)
    }
  }

  #wheel(event) {
    if (!this.image) return;
    event.preventDefault(); // the page does not scroll under the image
    this.view.zoomAt(this.stagePoint(event), wheelFactor(event.deltaY, event.deltaMode));
    this.layout();
  }

  #setSpace(held) {
    this.space = held;
    this.stage.classList.toggle("panning", held);
  }

  #key(event, down) {
    if (event.key !== " " || (event.target instanceof HTMLInputElement && event.target.type === "text")) return;
    if (this.image) event.preventDefault(); // Space pans here, it does not scroll the page
    this.#setSpace(down);
  }

  /** True while a drag pans (the annotation handlers leave the pointer alone). */
  get panning() {
    return this.space || this.pan !== null;
  }

  #panStart(event) {
    if (!this.space || !this.image || event.button !== 0) return;
    event.stopPropagation(); // not a click or a box
    this.stage.setPointerCapture(event.pointerId);
    this.pan = { pointerId: event.pointerId, clientX: event.clientX, clientY: event.clientY };
  }

  #panMove(event) {
    if (!this.pan || event.pointerId !== this.pan.pointerId) return;
    event.stopPropagation();
    this.view.panBy(event.clientX - this.pan.clientX, event.clientY - this.pan.clientY);
    this.pan.clientX = event.clientX;
    this.pan.clientY = event.clientY;
    this.layout();
  }

  #panEnd(event) {
    if (!this.pan || event.pointerId !== this.pan.pointerId) return;
    event.stopPropagation();
    this.pan = null;
  }
}
