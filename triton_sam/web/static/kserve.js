// KServe v2 over HTTP to a session model (<family>_session), same origin (the gateway's /v2).
//
// embed: the image file's bytes as the BYTES input "image_bytes" with Triton's binary-data
// extension (a JSON header, then the tensor: a 4-byte little-endian length + the bytes); the
// server decodes them, computes the image id from the pixels and answers it. predict: the id
// and the prompts in original pixels (JSON); the answer carries the masks at the original
// size as COCO compressed RLE, their scores, and optionally a key to the kept low-res logits
// for refinement. Errors come back as {"error": "triton_sam.<Code>: <field>: <message>"}.

const encoder = new TextEncoder();
const TOKEN_KEY = "triton-sam-token";

// A bearer token for servers behind the token-checking proxy or ingress (kept for this tab
// only); without one, no Authorization header is sent.
let token = sessionStorage.getItem(TOKEN_KEY);

export function setToken(value) {
  token = value || null;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** Headers a same-origin GET needs (the token, when there is one). */
export function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** A request the server (or the network) refused, with a message a person can read. */
export class ServerError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** "triton_sam.InvalidInput: image_bytes: ..." -> {code: "InvalidInput", text: "image_bytes: ..."} */
export function parseError(status, body) {
  let text = body;
  try {
    const json = JSON.parse(body);
    text = json.error || json.message || body;
  } catch {
    // not JSON: the text as it came
  }
  const match = /^triton_sam\.(\w+): ([\s\S]*)$/.exec(text || "");
  if (match) return new ServerError(status, match[1], match[2]);
  if (status === 401) return new ServerError(status, "Unauthorized", "this server needs an access token");
  return new ServerError(status, `HTTP ${status}`, text || `HTTP ${status}`);
}

/** POST a KServe v2 request to `model`; resolves {outputs (by name), sent, received}. */
export async function infer(model, body, headers, signal) {
  const sent = body instanceof Blob ? body.size : encoder.encode(body).length;
  let response;
  if (token) headers = { ...headers, Authorization: `Bearer ${token}` };
  try {
    response = await fetch(`/v2/models/${encodeURIComponent(model)}/infer`, {
      method: "POST",
      body,
      headers,
      signal,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ServerError(0, "Unavailable", `cannot reach the server (${e.message})`);
  }
  const text = await response.text();
  if (!response.ok) throw parseError(response.status, text);
  const outputs = {};
  for (const output of JSON.parse(text).outputs) outputs[output.name] = output;
  return { outputs, sent, received: encoder.encode(text).length };
}

/** Send an image file once; resolves {imageId, encoded, sent, received}. */
export async function embed(model, bytes, signal) {
  const header = encoder.encode(
    JSON.stringify({
      inputs: [
        {
          name: "image_bytes",
          shape: [1, 1],
          datatype: "BYTES",
          parameters: { binary_data_size: bytes.byteLength + 4 },
        },
      ],
      outputs: [{ name: "image_id" }, { name: "encoded" }],
    }),
  );
  const length = new Uint8Array(4);
  new DataView(length.buffer).setUint32(0, bytes.byteLength, true);
  const body = new Blob([header, length, bytes]);
  const headers = {
    "Content-Type": "application/octet-stream",
    "Inference-Header-Content-Length": String(header.length),
  };
  const { outputs, sent, received } = await infer(model, body, headers, signal);
  return {
    imageId: outputs.image_id.data[0],
    encoded: outputs.encoded.data[0],
    sent,
    received,
  };
}

/**
 * Masks for prompts in original pixels.
 * @param prompts {points: [[x, y, label]...], box: [x0, y0, x1, y1] | null}
 * @param options {multimask, keepLogits, previousKey, previousIndex}
 * Resolves {masks: [rle counts], scores, size: [H, W], logitsKey, sent, received}.
 */
export async function predict(model, imageId, prompts, options, signal) {
  const inputs = [{ name: "image_id", shape: [1, 1], datatype: "BYTES", data: [imageId] }];
  const n = prompts.points.length;
  if (n > 0) {
    inputs.push({
      name: "points",
      shape: [1, n, 2],
      datatype: "FP32",
      data: prompts.points.flatMap((p) => [p[0], p[1]]),
    });
    inputs.push({ name: "labels", shape: [1, n], datatype: "INT32", data: prompts.points.map((p) => p[2]) });
  }
  if (prompts.box) inputs.push({ name: "box", shape: [1, 4], datatype: "FP32", data: prompts.box });
  inputs.push({ name: "multimask_output", shape: [1, 1], datatype: "INT32", data: [options.multimask ? 1 : 0] });
  if (options.previousKey) {
    inputs.push({ name: "previous_key", shape: [1, 1], datatype: "BYTES", data: [options.previousKey] });
    inputs.push({ name: "previous_mask_index", shape: [1, 1], datatype: "INT32", data: [options.previousIndex] });
  }
  const names = ["masks_rle", "mask_scores", "image_size"];
  if (options.keepLogits) names.push("logits_key");
  const body = JSON.stringify({ inputs, outputs: names.map((name) => ({ name })) });
  const { outputs, sent, received } = await infer(model, body, { "Content-Type": "application/json" }, signal);
  return {
    masks: outputs.masks_rle.data,
    scores: outputs.mask_scores.data,
    size: outputs.image_size.data,
    logitsKey: outputs.logits_key ? outputs.logits_key.data[0] : null,
    sent,
    received,
  };
}

/**
 * Instances of a concept on a concept model: a phrase, exemplar boxes (in pixels of `image`,
 * labelled 1 "more like this" / 0 "less like this") and the ids of exemplars the server keeps
 * (drawn on earlier images), any of them. The pixels (UINT8 [H, W, 3], binary) go once per
 * image: the answer's image_id is kept on `image` (image.conceptIds[model]) and sent instead
 * next time; when the server no longer holds it, the pixels go again.
 * @param prompt {phrase, boxes: [[x0, y0, x1, y1]...], labels: [0 | 1...], ids: [string...],
 *   threshold: keep instances scoring above it (not finite: the server's default)}
 * Resolves {masks, scores, size, exemplarId (of the boxes sent; null without), sent, received}.
 */
export async function concepts(model, image, rgb, prompt, signal) {
  image.conceptIds ??= {};
  const known = image.conceptIds[model];
  const prompts = [];
  if (Number.isFinite(prompt.threshold)) prompts.push({ name: "threshold", shape: [1, 1], datatype: "FP32", data: [prompt.threshold] });
  if (prompt.phrase) prompts.push({ name: "text", shape: [1, 1], datatype: "BYTES", data: [prompt.phrase] });
  const boxes = prompt.boxes ?? [];
  if (boxes.length) {
    prompts.push({ name: "exemplar_boxes", shape: [1, boxes.length, 4], datatype: "FP32", data: boxes.flat() });
    prompts.push({ name: "exemplar_labels", shape: [1, boxes.length], datatype: "INT32", data: prompt.labels });
  }
  const ids = prompt.ids ?? [];
  if (ids.length) prompts.push({ name: "exemplar_ids", shape: [1, ids.length], datatype: "BYTES", data: ids });
  const names = ["image_id", "masks_rle", "scores", "image_size"];
  if (boxes.length) names.push("exemplar_id");
  const outputs = names.map((name) => ({ name }));
  let answer;
  if (known) {
    const inputs = [{ name: "image_id", shape: [1, 1], datatype: "BYTES", data: [known] }, ...prompts];
    try {
      answer = await infer(model, JSON.stringify({ inputs, outputs }), { "Content-Type": "application/json" }, signal);
    } catch (e) {
      // Only the image is cured by sending the pixels again, not a kept exemplar the server
      // no longer holds (its message names exemplar_ids[i]).
      if (!(e instanceof ServerError) || e.code !== "EmbeddingNotFound" || exemplarGone(e) !== null) throw e;
    }
  }
  if (!answer) {
    const pixels = {
      name: "image",
      shape: [1, image.height, image.width, 3],
      datatype: "UINT8",
      parameters: { binary_data_size: rgb.byteLength },
    };
    const header = encoder.encode(JSON.stringify({ inputs: [pixels, ...prompts], outputs }));
    const headers = {
      "Content-Type": "application/octet-stream",
      "Inference-Header-Content-Length": String(header.length),
    };
    answer = await infer(model, new Blob([header, rgb]), headers, signal);
  }
  const out = answer.outputs;
  image.conceptIds[model] = out.image_id.data[0];
  return {
    masks: out.masks_rle.data,
    scores: out.scores.data,
    size: out.image_size.data,
    exemplarId: out.exemplar_id?.data[0] || null,
    sent: answer.sent,
    received: answer.received,
  };
}

/**
 * The index in exemplar_ids of the kept exemplar a refusal says the server no longer holds
 * (code ExemplarNotFound, or EmbeddingNotFound from servers before that code), else null.
 */
export function exemplarGone(error) {
  if (!(error instanceof ServerError) || !["ExemplarNotFound", "EmbeddingNotFound"].includes(error.code)) return null;
  const found = /exemplar_ids\[(\d+)\]/.exec(error.message);
  return found ? Number(found[1]) : null;
}

/**
 * Segment everything on a kept image (POST /web/everything/{model}, NDJSON): calls
 * onProgress(done, total) per decoder batch; resolves to {image_size, instances}. Aborting
 * `signal` closes the response, and the gateway cancels the job on the server.
 */
export async function everything(model, imageId, params, onProgress, signal) {
  const response = await postJson(`/web/everything/${encodeURIComponent(model)}`, { image_id: imageId, params }, signal);
  for await (const line of ndjsonLines(response)) {
    if (line.progress) onProgress(...line.progress);
    else if (line.error) throw new ServerError(200, line.error.type, line.error.message);
    else if (line.instances) return line;
  }
  throw new ServerError(0, "Unavailable", "the stream ended without an answer");
}

/** POST `body` as JSON to one of the gateway's own routes (/web/...); the response once it is
 * OK, else the gateway's typed refusal ({code, field, message}) as a ServerError. */
export async function postJson(path, body, signal) {
  const headers = { "Content-Type": "application/json", ...authHeaders() };
  let response;
  try {
    response = await fetch(path, { method: "POST", body: JSON.stringify(body), headers, signal });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ServerError(0, "Unavailable", `cannot reach the server (${e.message})`);
  }
  if (!response.ok) {
    const text = await response.text();
    let json = {};
    try {
      json = JSON.parse(text);
    } catch {
      // not JSON: the text as it came
    }
    // The gateway's message names the field ("params.points_per_side: ...").
    throw new ServerError(response.status, json.code || `HTTP ${response.status}`, json.message || text);
  }
  return response;
}

/** The lines of a streamed NDJSON response, parsed, as they arrive (an aborted fetch's
 * signal rejects the read with its AbortError). */
export async function* ndjsonLines(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buffer += value;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = JSON.parse(buffer.slice(0, newline));
      buffer = buffer.slice(newline + 1);
      yield line;
    }
    if (done) return;
  }
}
