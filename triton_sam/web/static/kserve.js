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

async function infer(model, body, headers, signal) {
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

/** Instances of text phrases on a concept model (pixels as UINT8 [H, W, 3], binary). */
export async function concepts(model, rgb, height, width, phrase, signal) {
  const header = encoder.encode(
    JSON.stringify({
      inputs: [
        {
          name: "image",
          shape: [1, height, width, 3],
          datatype: "UINT8",
          parameters: { binary_data_size: rgb.byteLength },
        },
        { name: "text", shape: [1, 1], datatype: "BYTES", data: [phrase] },
      ],
      outputs: [{ name: "masks_rle" }, { name: "scores" }, { name: "image_size" }],
    }),
  );
  const body = new Blob([header, rgb]);
  const headers = {
    "Content-Type": "application/octet-stream",
    "Inference-Header-Content-Length": String(header.length),
  };
  const { outputs, sent, received } = await infer(model, body, headers, signal);
  return {
    masks: outputs.masks_rle.data,
    scores: outputs.scores.data,
    size: outputs.image_size.data,
    sent,
    received,
  };
}
