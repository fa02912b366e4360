// "Video concepts": a phrase tracked through a clip or a z-stack by the served
// sam3_concept_video, every instance an object with an id that stays the same across frames.
//
// The frames are image files (in name order, numbers by value: z2 before z10). Propagate opens
// a session on the server (POST /web/concept-video/{model}: init, each file's own bytes as
// add_frame — the server decodes them —, add_prompt), then streams the propagation: one NDJSON
// line per frame the server processed (progress, and the frame's objects once the server's
// hot-start hold-back releases it). Cancel aborts the stream; the gateway cancels the request
// and the server stops before its next frame. The session stays open (its id bound to this
// page's tenant) until the next Propagate or until the page goes away.

import { ServerError, authHeaders, ndjsonLines, postJson } from "./kserve.js";
import { decode } from "./rle.js";

// Colour by object id, so an object keeps its colour from frame to frame.
const PALETTE = [
  [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
  [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212], [0, 128, 128],
];
const ALPHA = 0.5; // a mask over its frame

export function colourOf(objectId) {
  return PALETTE[objectId % PALETTE.length];
}

/** Frame files in the order the page sends them: by name, runs of digits compared as numbers. */
export function inNameOrder(files) {
  return [...files].sort((a, b) => a.name.localeCompare(b.name, "en", { numeric: true }));
}

/** The file's bytes in base64 (the JSON body's frame_bytes). */
function base64Of(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result.slice(reader.result.indexOf(",") + 1));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class VideoConcepts {
  /**
   * @param ui {form, files, count, phrase, settings, propagate, cancel, progress, slider,
   *   frameLabel, canvas, download}: the panel's elements.
   * @param showError (error, context) => void: the page's error banner.
   * @param showStats (text) => void: the page's "last request" line.
   */
  constructor(ui, showError, showStats) {
    this.ui = ui;
    this.showError = showError;
    this.showStats = showStats;
    this.model = null;
    this.files = []; // in name order
    this.bitmaps = [];
    this.hw = null; // [H, W] of every frame
    this.session = null; // the open session's id
    this.phrase = ""; // what the results are of: the phrase, its prompt ids, the settings sent
    this.promptIds = [];
    this.settingsSent = {};
    this.results = new Map(); // frame index -> the server's frame line
    this.progress = [0, 0];
    this.state = "idle"; // idle | uploading | propagating | done | cancelled | failed
    this.job = null; // the running propagation's AbortController
    this.stats = { sent: 0, lines: 0, frames: 0 };
    ui.files.addEventListener("change", () => {
      this.choose([...ui.files.files]);
      ui.files.value = ""; // the next choice replaces these, and the same files again is a change
    });
    ui.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.propagate();
    });
    ui.cancel.addEventListener("click", () => this.cancel());
    ui.slider.addEventListener("input", () => this.show(Number(ui.slider.value)));
    ui.download.addEventListener("click", () => this.download());
    // The server evicts idle sessions too; closing when the page goes frees its frames now.
    window.addEventListener("pagehide", () => this.closeOnLeave());
  }

  /** Shows the panel for `model` (a /web/models entry of kind concept_video), or hides it. */
  offer(model) {
    this.model = model;
    this.ui.form.hidden = !model;
  }

  async choose(fileList) {
    this.files = inNameOrder(fileList);
    this.ui.count.textContent = "";
    try {
      this.bitmaps = await Promise.all(this.files.map((f) => createImageBitmap(f)));
    } catch (e) {
      this.bitmaps = [];
      this.showError(e, "Could not read the frames");
      return;
    }
    const [first] = this.bitmaps;
    const odd = this.bitmaps.findIndex((b) => b.width !== first?.width || b.height !== first?.height);
    if (odd >= 0) {
      this.showError(new Error(`frame ${this.files[odd].name} is ${this.bitmaps[odd].width}x${this.bitmaps[odd].height}, the first is ${first.width}x${first.height}: every frame must be one size`));
      this.bitmaps = [];
      return;
    }
    this.hw = first ? [first.height, first.width] : null;
    this.results = new Map();
    this.ui.count.textContent = `${this.files.length} frames, ${first?.width}x${first?.height}`;
    this.ui.slider.max = String(Math.max(0, this.files.length - 1));
    this.ui.slider.value = "0";
    this.ui.slider.disabled = !this.files.length;
    this.show(0);
  }

  /** One command's JSON answer. */
  command(body) {
    return postJson(`/web/concept-video/${encodeURIComponent(this.model.name)}`, body).then((r) => r.json());
  }

  settings() {
    const text = this.ui.settings.value.trim();
    if (!text) return {};
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new ServerError(0, "InvalidInput", `settings: not JSON (${e.message})`);
    }
  }

  async propagate() {
    if (this.job || this.state === "uploading") return;
    const phrase = this.ui.phrase.value.trim();
    try {
      if (!this.model) throw new Error("the server offers no concept video model");
      if (!this.bitmaps.length) throw new Error("choose the frames first (image files, one size)");
      if (!phrase) throw new Error("type a phrase (what to find in every frame)");
      const settings = this.settings();
      // The previous results go before anything waits: what shows from here on is this run's.
      this.results = new Map();
      this.progress = [0, this.files.length];
      this.stats = { sent: 0, lines: 0, frames: 0 };
      this.setState("uploading");
      this.drawProgress();
      await this.closeSession();
      const [height, width] = this.hw;
      const opened = await this.command({ command: "init", num_frames: this.files.length, video_hw: [height, width] });
      this.session = opened.session_id;
      for (const [index, file] of this.files.entries()) {
        const frameBytes = await base64Of(file);
        this.stats.sent += frameBytes.length;
        await this.command({ command: "add_frame", session_id: this.session, frame_index: index, frame_bytes: frameBytes });
        this.showStats(`Video concepts: frame ${index + 1}/${this.files.length} uploaded`);
      }
      this.promptIds = (await this.command({ command: "add_prompt", session_id: this.session, text: [phrase] })).prompt_ids;
      this.phrase = phrase;
      this.settingsSent = settings;
      await this.stream({ command: "propagate", session_id: this.session, settings });
    } catch (e) {
      this.job = null;
      if (e.name === "AbortError") {
        this.setState("cancelled");
        this.showStats(`Video concepts: cancelled after ${this.progress[0]}/${this.progress[1]} frames`);
      } else {
        this.setState("failed");
        this.showError(e, "Video concepts");
      }
    }
  }

  async stream(body) {
    this.job = new AbortController();
    this.setState("propagating");
    const response = await postJson(`/web/concept-video/${encodeURIComponent(this.model.name)}`, body, this.job.signal);
    for await (const line of ndjsonLines(response)) {
      this.stats.lines += 1;
      if (line.error) throw new ServerError(200, line.error.code, line.error.message);
      if (line.progress) this.progress = line.progress;
      if (line.frame) {
        this.results.set(line.frame.frame_index, line.frame);
        this.stats.frames += 1;
        this.ui.slider.value = String(line.frame.frame_index);
        this.show(line.frame.frame_index);
      }
      this.drawProgress();
      if (line.done) {
        this.job = null;
        this.setState("done");
        const objects = new Set([...this.results.values()].flatMap((f) => f.object_ids)).size;
        this.showStats(`Video concepts: ${line.done.frames_answered} frames, ${objects} objects`);
        return;
      }
    }
    throw new ServerError(0, "Unavailable", "the stream ended without its totals");
  }

  cancel() {
    this.job?.abort();
  }

  setState(state) {
    this.state = state;
    const busy = state === "uploading" || state === "propagating";
    this.ui.propagate.disabled = busy;
    this.ui.cancel.disabled = state !== "propagating";
    this.ui.download.disabled = !this.results.size || busy;
    this.ui.form.dataset.state = state;
  }

  drawProgress() {
    const [done, total] = this.progress;
    this.ui.progress.max = Math.max(1, total);
    this.ui.progress.value = done;
    this.ui.progress.textContent = `${done}/${total}`;
  }

  /** Frame `index` with its objects' masks, each in its object's colour. */
  show(index) {
    const bitmap = this.bitmaps[index];
    const canvas = this.ui.canvas;
    if (!bitmap) {
      canvas.hidden = true;
      return;
    }
    canvas.hidden = false;
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
    const context = canvas.getContext("2d");
    context.drawImage(bitmap, 0, 0);
    const frame = this.results.get(index);
    const name = this.files[index]?.name ?? "";
    if (!frame) {
      this.ui.frameLabel.textContent = `${index + 1}/${this.files.length} ${name}`;
      return;
    }
    const { width, height } = bitmap;
    const pixels = context.getImageData(0, 0, width, height);
    frame.masks_rle.forEach((counts, row) => {
      const mask = decode(counts, height, width);
      const colour = colourOf(frame.object_ids[row]);
      for (let i = 0; i < mask.length; i += 1) {
        if (!mask[i]) continue;
        for (let c = 0; c < 3; c += 1) pixels.data[4 * i + c] = Math.round((1 - ALPHA) * pixels.data[4 * i + c] + ALPHA * colour[c]);
      }
    });
    context.putImageData(pixels, 0, 0);
    this.ui.frameLabel.textContent = `${index + 1}/${this.files.length} ${name}: objects ${frame.object_ids.join(", ") || "none"}`;
  }

  /** The per-frame results as JSON: masks as COCO RLE at the frames' size. */
  resultsJson() {
    const [height, width] = this.hw;
    const frames = [...this.results.values()].sort((a, b) => a.frame_index - b.frame_index);
    return {
      model: this.model.name,
      phrase: this.phrase,
      prompt_ids: this.promptIds,
      settings: this.settingsSent,
      video_hw: [height, width],
      files: this.files.map((f) => f.name),
      frames: frames.map((f) => ({
        frame_index: f.frame_index,
        file: this.files[f.frame_index].name,
        object_ids: f.object_ids,
        prompt_ids: f.prompt_ids,
        scores: f.scores,
        tracker_scores: f.tracker_scores,
        boxes: f.boxes,
        removed_object_ids: f.removed_object_ids,
        masks: f.masks_rle.map((counts) => ({ size: [height, width], counts })),
      })),
    };
  }

  download() {
    if (!this.results.size) return;
    const blob = new Blob([JSON.stringify(this.resultsJson())], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = `${this.phrase.replace(/[^\w-]+/g, "_") || "concepts"}_video_concepts.json`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  async closeSession() {
    if (!this.session) return;
    const session = this.session;
    this.session = null;
    try {
      await this.command({ command: "close", session_id: session });
    } catch {
      // gone already (evicted, the server restarted): nothing to free
    }
  }

  closeOnLeave() {
    if (!this.session || !this.model) return;
    // A beacon outlives the page; it carries no Authorization header, so behind a token the
    // server's idle eviction frees the session instead.
    if (Object.keys(authHeaders()).length) return;
    navigator.sendBeacon(
      `/web/concept-video/${encodeURIComponent(this.model.name)}`,
      new Blob([JSON.stringify({ command: "close", session_id: this.session })], { type: "application/json" }),
    );
  }
}
