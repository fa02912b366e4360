// The annotator: one image, several objects, each with its own prompts, mask and colour.
//
// The image file's bytes go to the session model once (embed); every click, box or hover
// sends the image id and the object's prompts and gets RLE masks back (kserve.js). Each
// object's requests and the hover preview run in their own latest-wins lane (lane.js).
// An image larger than the session model takes goes to the <family>_large model instead
// (large.js: a dataset by name, or a file in pieces), is shown from the gateway's tile
// pyramid (tilelayer.js) and its masks come back as crops (crops.js). Zoom and pan are
// viewport.js's; every position between the screen and the image goes through its View.
// window.annotator exposes the state and timings (read by the browser test).
//
// This module only wires the parts together and starts the page; each part is its own module:
//   page.js        the elements, the state, the timings, the status and error lines
//   drawing.js     the canvases (masks, hover, marks), the objects list, the viewport
//   prediction.js  an object's prompts to its mask (the session or the large model)
//   hover.js       the hover preview, whose answer a click at the same place takes
//   objects.js     add, remove, select, undo; a click or box sent for the current object
//   segment.js     "Segment all" (concepts, exemplars) and "Segment everything"
//   images.js      opening a file, a dataset, a handle, a slice; switching model
//   input.js       pointer and keyboard on the stage
//   downloads.js   the PNG and COCO export buttons
// Calls go down this list (and to the request and encoding modules), never up.

import { setToken } from "./kserve.js";
import { VideoConcepts } from "./videoconcepts.js";
import { $, afterPaint, clearError, showError, showStats, state, stats, ui } from "./page.js";
import { exemplars, onObjectChosen, viewport } from "./drawing.js";
import { hoverLane } from "./hover.js";
import { addObject, select, undo } from "./objects.js";
import { segmentConcept, segmentEverything, showEverything } from "./segment.js";
import { openDatasetNamed, openFile, openHandle, showSlice, switchModel } from "./images.js";
import { listenToInput } from "./input.js";
import { exportCoco, exportPng } from "./downloads.js";

// The "Video concepts" panel (a phrase tracked through frames), shown when the server has it.
const videoConcepts = new VideoConcepts(
  {
    form: $("video-concepts"), files: $("vc-files"), count: $("vc-count"), phrase: $("vc-phrase"),
    settings: $("vc-settings"), propagate: $("vc-propagate"), cancel: $("vc-cancel"),
    progress: $("vc-progress"), slider: $("vc-slider"), frameLabel: $("vc-frame"),
    canvas: $("vc-canvas"), download: $("vc-download"),
  },
  (error, context) => showError(error, context),
  (text) => showStats(text),
);

onObjectChosen(select);
listenToInput();

// -- buttons and forms ---------------------------------------------------------------------
ui.file.addEventListener("change", () => {
  openFile(ui.file.files[0]);
  ui.file.value = ""; // the same file again is a change too
});
ui.stage.addEventListener("dragover", (event) => event.preventDefault());
ui.stage.addEventListener("drop", (event) => {
  event.preventDefault();
  openFile(event.dataTransfer.files[0]);
});
ui.model.addEventListener("change", () => switchModel(ui.model.value));
$("new-object").addEventListener("click", addObject);
$("fit").addEventListener("click", () => viewport.fit());
ui.datasetForm.addEventListener("submit", (event) => {
  event.preventDefault();
  openDatasetNamed(ui.dataset.value.trim(), ui.datasetKey.value.trim());
});
ui.slice.addEventListener("change", () => showSlice(Number(ui.slice.value)));
ui.everything.addEventListener("click", () => segmentEverything());
$("undo").addEventListener("click", undo);
$("error-close").addEventListener("click", clearError);
$("export-png").addEventListener("click", () => exportPng());
$("export-coco").addEventListener("click", () => exportCoco());
ui.tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(ui.token.value.trim());
  ui.token.value = "";
  ui.tokenForm.hidden = true;
  clearError();
});
ui.concept.addEventListener("submit", (event) => {
  event.preventDefault();
  segmentConcept(ui.phrase.value.trim());
});

// -- start -------------------------------------------------------------------------------------
async function start() {
  try {
    const response = await fetch("/web/models");
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || `HTTP ${response.status}`);
    state.models = body.models;
  } catch (e) {
    showError(e, "Could not list the server's models");
    return;
  }
  const sessions = state.models.filter((m) => m.kind === "session");
  ui.model.replaceChildren(...sessions.map((m) => new Option(m.label, m.name)));
  state.model = sessions[0]?.name ?? null;
  ui.concept.hidden = !state.models.some((m) => m.kind === "concept");
  // Without a session model a drag has nothing else to draw: exemplars by default.
  if (!sessions.length) ui.concept.querySelector("#exemplar-mode").value = "1";
  ui.datasetForm.hidden = !state.models.some((m) => m.kind === "large");
  videoConcepts.offer(state.models.find((m) => m.kind === "concept_video") ?? null);
  showEverything();
  if (!state.models.length) showError(new Error("the server offers no model this page can use"));
  document.body.dataset.ready = "true";
}

const idle = () =>
  hoverLane.idle && state.objects.every((o) => o.lane.idle) && (state.image?.tiles?.idle ?? true);

window.annotator = {
  state,
  stats,
  exemplars,
  videoConcepts,
  hoverLane,
  viewport,
  /** Opens a dataset the server reads (what the dataset form does). */
  openDataset: openDatasetNamed,
  /** Opens an image the large model holds under `handle` (uploaded by another client). */
  openHandle,
  /** Nothing in flight or waiting, in any lane. */
  idle,
  /** Resolves once idle and the last answer is on screen (checked in the page, so a test
   * waiting for it sends no polling traffic through WebDriver while it measures). */
  whenIdle: () =>
    new Promise((resolve) => {
      const check = () => (idle() ? afterPaint(resolve) : setTimeout(check, 2));
      check();
    }),
  everythingParams: { points_per_side: 8 },
  requestsSent: () => hoverLane.sent + state.objects.reduce((n, o) => n + o.lane.sent, 0),
};

start();
