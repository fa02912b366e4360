// The export buttons: the objects as an 8-bit label PNG or as COCO annotations (encoded by
// export.js), downloaded under the image's name. A large image's masks are crops the page
// holds in pieces: its exports are the Python client's.

import { coco, grayPng, labels } from "./export.js";
import { showError, state } from "./page.js";

function baseName() {
  return (state.image?.name || "image").replace(/\.[^.]*$/, "");
}

function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function exportable() {
  if (state.image?.large) showError(new Error("exports of a large image: use the Python client (its large-image masks), the page holds only crops"));
  return Boolean(state.image && !state.image.large);
}

export async function exportPng() {
  if (!exportable()) return;
  const { width, height } = state.image;
  const blob = await grayPng(labels(state.objects, height, width), height, width);
  download(blob, `${baseName()}_labels.png`);
}

export function exportCoco() {
  if (!exportable()) return;
  const { width, height, name, model } = state.image;
  const text = coco(name, state.objects, height, width, model);
  download(new Blob([text], { type: "application/json" }), `${baseName()}_coco.json`);
}
