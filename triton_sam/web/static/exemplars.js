// Exemplar boxes for the concept model: "more like this" / "less like this".
//
// With the concept form's mode on "more like this" (label 1) or "less like this" (label 0), a
// drag on the image draws an exemplar box instead of an object's box. The boxes drawn since
// the last request go with the next "Segment all", with or without a phrase, as
// exemplar_boxes / exemplar_labels in pixels of the image they were drawn on; the server
// encodes them on that image and answers an exemplar_id. From then on the page sends that id
// (exemplar_ids), never the boxes again: the id is what lets the exemplar prompt the next
// image, whose pixels the boxes were not drawn on. The ids in use are listed beside the form;
// "Clear exemplars" forgets boxes and ids (the server forgets them itself, least recently
// used first, or when it restarts: the page then says so and drops the id).

const COLOURS = { 1: "#00c853", 0: "#ff1744" }; // more / less like this

export class Exemplars {
  /**
   * @param ui {mode: <select>, status: element, clear: <button>}
   * @param onChange called after boxes or ids change (the page redraws its marks)
   */
  constructor(ui, onChange) {
    this.ui = ui;
    this.onChange = onChange;
    this.pending = []; // {box: [x0, y0, x1, y1], label: 0 | 1, image}: not sent yet
    this.kept = []; // {id, boxes, labels, image}: the server holds them under id
    ui.clear.addEventListener("click", () => this.clear());
    this.render();
  }

  /** 1 (more like this), 0 (less like this), or null: a drag draws an object's box. */
  get mode() {
    return this.ui.mode.value === "" ? null : Number(this.ui.mode.value);
  }

  /** Whether a drag on `image` draws an exemplar (the concept model takes the whole image). */
  drawsOn(image) {
    return this.mode !== null && Boolean(image) && !image.large && !this.ui.mode.closest("form").hidden;
  }

  add(box, image) {
    this.pending.push({ box, label: this.mode, image });
    this.changed();
  }

  /** Another image is shown: boxes not yet sent were drawn on the one before and go. */
  imageChanged(image) {
    this.pending = this.pending.filter((p) => p.image === image);
    this.changed();
  }

  /** What the next request on `image` sends: {boxes, labels, ids}. */
  request(image) {
    const mine = this.pending.filter((p) => p.image === image);
    return {
      boxes: mine.map((p) => p.box),
      labels: mine.map((p) => p.label),
      ids: this.kept.map((k) => k.id),
    };
  }

  any(image) {
    return this.kept.length > 0 || this.pending.some((p) => p.image === image);
  }

  /** The server answered `id` for the boxes `sent` on `image`: keep the id, not the boxes. */
  keep(id, sent, image) {
    if (!id || !sent.boxes.length) return;
    this.kept.push({ id, boxes: sent.boxes, labels: sent.labels, image });
    this.pending = this.pending.filter((p) => p.image !== image);
    this.changed();
  }

  /** The server no longer holds the id sent at `index`: drop it. */
  forget(index) {
    this.kept.splice(index, 1);
    this.changed();
  }

  clear() {
    this.pending = [];
    this.kept = [];
    this.changed();
  }

  changed() {
    this.render();
    this.onChange();
  }

  render() {
    const count = (items, label) => items.filter((l) => l === label).length;
    const parts = [];
    const labels = this.pending.map((p) => p.label);
    if (labels.length) parts.push(`${labels.length} box${labels.length === 1 ? "" : "es"} to send (${count(labels, 1)} more, ${count(labels, 0)} less)`);
    for (const k of this.kept) {
      parts.push(`in use: exemplar ${k.id.slice(0, 8)}… (${count(k.labels, 1)} more, ${count(k.labels, 0)} less)`);
    }
    this.ui.status.textContent = parts.length ? `Exemplars: ${parts.join(" · ")}` : "";
    this.ui.clear.hidden = parts.length === 0;
  }

  /** Draws the exemplar boxes of `image` (sent ones dashed) on a 2D context in image pixels. */
  draw(ctx, image, scale) {
    const boxes = [
      ...this.pending.filter((p) => p.image === image).map((p) => [p.box, p.label, false]),
      ...this.kept.filter((k) => k.image === image).flatMap((k) => k.boxes.map((b, i) => [b, k.labels[i], true])),
    ];
    ctx.lineWidth = 2 * scale;
    for (const [[x0, y0, x1, y1], label, sent] of boxes) {
      ctx.setLineDash(sent ? [6 * scale, 4 * scale] : []);
      ctx.strokeStyle = COLOURS[label];
      ctx.strokeRect(x0, y0, x1 - x0, y1 - y0);
    }
    ctx.setLineDash([]);
  }
}
