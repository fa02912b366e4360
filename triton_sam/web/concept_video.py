"""Video concepts for the page: ``POST /web/concept-video/{model}`` on the gateway's origin.

``sam3_concept_video`` is decoupled and gRPC-only (Triton's HTTP endpoint refuses decoupled
models), so the browser cannot reach it through the ``/v2`` pass-through. This route relays
the page's commands to it over gRPC's stream, with the tenant the pass-through passes (the
server binds each session to it). The body is one JSON object ``{"command": ..., ...}``:

- ``init`` ``{num_frames, video_hw: [H, W]}`` -> ``{session_id, status}``;
- ``add_frame`` ``{session_id, frame_index, frame_bytes}``: the frame's encoded image file
  (PNG, JPEG, TIFF...) in base64; the server decodes it (``frame_bytes``) -> ``{status}``;
- ``add_prompt`` ``{session_id, text: [phrase, ...]}`` -> ``{prompt_ids}``;
- ``info`` ``{session_id}`` -> ``{status}``; ``close`` ``{session_id}`` -> ``{}``;
- ``propagate`` ``{session_id, start_frame_index?, max_frames?, reverse?, settings?}``
  streams NDJSON, one line per response of the server: ``{"progress": [done, total]}``, with
  ``"frame": {frame_index, object_ids, prompt_ids, scores, tracker_scores, boxes, masks_rle,
  removed_object_ids}`` when that response answered a frame; then ``{"done":
  {"frames_answered": n, "progress": [done, total]}}``, or ``{"error": {code, message}}``.

A refusal before anything streams is the gateway's typed JSON (:mod:`triton_sam.gateway.
errors`) with the server's code (``SessionNotFound`` 404, ``InvalidInput`` 400...). When the
browser goes away mid-propagation, Starlette cancels the response's generator, which cancels
the gRPC stream: Triton marks the request cancelled and the model stops before its next frame.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from triton_sam.client.concept_video import ANSWER_NAMES
from triton_sam.client.transport import Endpoint
from triton_sam.client.wire import build_infer_inputs
from triton_sam.gateway.errors import ERR_LIMIT, GatewayError, invalid
from triton_sam.gateway.sam_service import MAX_FIELD_BYTES, tenant_of
from triton_sam.serving.protocol import ERROR_PREFIX, ERROR_STATUS, error_code
from triton_sam.serving.protocol import concept_video as protocol
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, TENANT_HEADER
from triton_sam.web.bodies import json_object

# An encoded frame from the page: the gateway's bound on an uploaded image (an image field of
# its SAM_service routes), below the server's own MAX_FRAME_BYTES; base64 makes it 4/3 larger.
MAX_FRAME_BYTES = MAX_FIELD_BYTES
MAX_BODY_BYTES = 4 * -(-MAX_FRAME_BYTES // 3) + 16 * 1024
MAX_SETTINGS_BYTES = 4096  # a settings object of every bounded field is under 1 KiB
COMMANDS = {
    protocol.CMD_INIT: {"num_frames", "video_hw"},
    protocol.CMD_ADD_FRAME: {"session_id", "frame_index", "frame_bytes"},
    protocol.CMD_ADD_PROMPT: {"session_id", "text"},
    protocol.CMD_INFO: {"session_id"},
    protocol.CMD_CLOSE: {"session_id"},
    protocol.CMD_PROPAGATE: {
        "session_id",
        "start_frame_index",
        "max_frames",
        "reverse",
        "settings",
    },
}
OPTIONAL = {"start_frame_index", "max_frames", "reverse", "settings"}
# A command's one answer comes within this; a propagation streams as long as it runs (the
# page's Cancel or its going away ends it).
COMMAND_TIMEOUT_S = 300.0
# The server's error codes by their TritonError status, as HTTP answers of the gateway.
HTTP_STATUS = {"INVALID_ARG": 400, "NOT_FOUND": 404, "CANCELLED": 409, "UNAVAILABLE": 503}

Listed = Callable[[], Awaitable[list[dict[str, Any]]]]
Tensors = dict[str, np.ndarray]


def concept_video_routes(grpc_address: str, listed: Listed) -> list[Route]:
    """The route, relaying to Triton's gRPC endpoint ``grpc_address`` (``host:port``);
    ``listed()`` gives the models the page may use (``/web/models``)."""
    endpoint = Endpoint(grpc_address, "grpc", False)

    async def handle(request: Request) -> Response:
        try:
            model = request.path_params["model"]
            if not any(
                m.get("name") == model and m.get("kind") == "concept_video" for m in await listed()
            ):
                raise GatewayError(
                    404, "NotFound", "model", f"{model!r} is not a served concept video model"
                )
            body = await json_object(request, MAX_BODY_BYTES, "{command, ...}")
            command, inputs = command_inputs(body)
            tenant = tenant_of(request)
            headers = {TENANT_HEADER: tenant} if tenant != DEFAULT_TENANT else None
            if command == protocol.CMD_PROPAGATE:
                return await _propagate(endpoint, model, inputs, headers)
            answers = [a async for a in responses(endpoint, model, inputs, headers)]
        except GatewayError as e:
            return e.response()
        return JSONResponse(command_answer(answers[-1] if answers else {}))

    return [Route("/web/concept-video/{model}", handle, methods=["POST"])]


# -- the request ---------------------------------------------------------------------------------
def command_inputs(data: dict[str, Any]) -> tuple[str, Tensors]:
    """The command and the model's input tensors of a page's JSON request.

    Only the shapes and types are checked here (the server checks values against its bounds
    and the session's state, and names the field in its refusal).

    Raises:
        GatewayError: 400 naming the field: an unknown command or field, a missing field, a
            value of the wrong type; 413 for a frame above :data:`MAX_FRAME_BYTES`.
    """
    command = data.get("command")
    if command not in COMMANDS:
        raise invalid("command", f"got {command!r}, expected one of {sorted(COMMANDS)}")
    fields = COMMANDS[command]
    unknown = sorted(set(data) - fields - {"command"})
    if unknown:
        raise invalid(unknown[0], f"unknown field of {command} (it takes {sorted(fields)})")
    missing = sorted(fields - OPTIONAL - set(data))
    if missing:
        raise invalid(missing[0], f"required by {command}")
    inputs: Tensors = {protocol.COMMAND: _strings([command])}
    if "session_id" in data:
        inputs[protocol.SESSION_ID] = _strings([_string(data, "session_id", 256)])
    if command == protocol.CMD_INIT:
        inputs[protocol.NUM_FRAMES] = np.array([_int(data, "num_frames")], np.int32)
        hw = data["video_hw"]
        if not (isinstance(hw, list) and len(hw) == 2 and all(_is_int(v) for v in hw)):
            raise invalid("video_hw", f"got {hw!r}, expected [height, width] integers")
        inputs[protocol.VIDEO_HW] = np.array(hw, np.int32)
    elif command == protocol.CMD_ADD_FRAME:
        inputs[protocol.FRAME_INDEX] = np.array([_int(data, "frame_index")], np.int32)
        inputs[protocol.FRAME_BYTES] = np.array([_frame_bytes(data["frame_bytes"])], np.object_)
    elif command == protocol.CMD_ADD_PROMPT:
        text = data["text"]
        if not (isinstance(text, list) and text and all(isinstance(t, str) for t in text)):
            raise invalid("text", "a non-empty list of phrases (strings) expected")
        if len(text) > protocol.MAX_PROMPTS:
            raise invalid("text", f"{len(text)} phrases, at most {protocol.MAX_PROMPTS} expected")
        inputs[protocol.TEXT] = _strings(text)
    elif command == protocol.CMD_PROPAGATE:
        inputs[protocol.START_FRAME] = np.array([_int(data, "start_frame_index", 0)], np.int32)
        inputs[protocol.MAX_FRAMES] = np.array([_int(data, "max_frames", -1)], np.int32)
        reverse = data.get("reverse", False)
        if not isinstance(reverse, bool):
            raise invalid("reverse", f"got {reverse!r}, expected true or false")
        inputs[protocol.REVERSE] = np.array([reverse], bool)
        settings = data.get("settings") or {}
        if not isinstance(settings, dict):
            raise invalid("settings", "a JSON object of settings expected")
        text = json.dumps(settings)
        if len(text) > MAX_SETTINGS_BYTES:
            raise invalid("settings", f"more than {MAX_SETTINGS_BYTES} bytes")
        if settings:
            inputs[protocol.SETTINGS] = _strings([text])
    return command, inputs


def _frame_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise invalid("frame_bytes", "the encoded image file in base64 (a string) expected")
    if len(value) > 4 * -(-MAX_FRAME_BYTES // 3):
        raise GatewayError(413, ERR_LIMIT, "frame_bytes", f"more than {MAX_FRAME_BYTES} bytes")
    try:
        encoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise invalid("frame_bytes", f"not base64 ({e})") from None
    if not encoded:
        raise invalid("frame_bytes", "empty; the encoded image file expected")
    return encoded


def _string(data: dict[str, Any], name: str, limit: int) -> str:
    value = data[name]
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise invalid(name, f"a string of 1..{limit} characters expected")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31


def _int(data: dict[str, Any], name: str, default: int | None = None) -> int:
    value = data.get(name, default)
    if not _is_int(value):
        raise invalid(name, f"got {value!r}, expected an integer")
    return int(value)


def _strings(values: list[str]) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=np.object_)


# -- the answers -------------------------------------------------------------------------------
def command_answer(outputs: Tensors) -> dict[str, Any]:
    """A command's one response as the page's JSON."""
    answer: dict[str, Any] = {}
    if protocol.OUT_SESSION_ID in outputs:
        answer["session_id"] = _text(outputs[protocol.OUT_SESSION_ID])
    if protocol.OUT_STATUS in outputs:
        answer["status"] = json.loads(_text(outputs[protocol.OUT_STATUS]))
    if protocol.OUT_PROMPT_IDS in outputs:
        answer["prompt_ids"] = [int(v) for v in outputs[protocol.OUT_PROMPT_IDS]]
    return answer


def stream_line(outputs: Tensors) -> dict[str, Any]:
    """One streamed response of ``propagate`` as the page's NDJSON line."""
    line: dict[str, Any] = {}
    if protocol.PROGRESS in outputs:
        line["progress"] = [int(v) for v in outputs[protocol.PROGRESS]]
    if protocol.FRAMES_ANSWERED in outputs:
        return {"done": {"frames_answered": int(outputs[protocol.FRAMES_ANSWERED][0]), **line}}
    if protocol.FRAME_INDEX in outputs:
        counts = outputs.get(protocol.MASKS_RLE, np.zeros(0, np.object_)).reshape(-1)
        line["frame"] = {
            "frame_index": int(outputs[protocol.FRAME_INDEX][0]),
            "object_ids": outputs[protocol.OBJECT_IDS].astype(int).tolist(),
            "prompt_ids": outputs[protocol.PROMPT_IDS].astype(int).tolist(),
            "scores": outputs[protocol.SCORES].astype(float).tolist(),
            "tracker_scores": outputs[protocol.TRACKER_SCORES].astype(float).tolist(),
            "boxes": outputs[protocol.BOXES].reshape(-1, 4).astype(float).tolist(),
            "masks_rle": [_text(np.array([c])) for c in counts],
            "removed_object_ids": outputs[protocol.REMOVED_OBJECT_IDS].astype(int).tolist(),
        }
    return line


def _text(value: np.ndarray) -> str:
    item = np.asarray(value).reshape(-1)[0]
    return item.decode() if isinstance(item, bytes) else str(item)


# -- the stream --------------------------------------------------------------------------------
async def responses(
    endpoint: Endpoint,
    model: str,
    inputs: Tensors,
    headers: dict[str, str] | None,
    timeout_s: float | None = COMMAND_TIMEOUT_S,
) -> AsyncIterator[Tensors]:
    """The responses of one request on its own gRPC stream, until Triton ends the stream
    (after the model's final response: the request side is closed at once). Leaving early
    (a cancelled task, an aclose) cancels the call: Triton marks the request cancelled.

    Raises:
        GatewayError: the server's refusal with its code and HTTP status, or 503 when
            Triton cannot be reached.
    """
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(endpoint.address)
    request = {"model_name": model, "inputs": build_infer_inputs(aioclient, inputs, http=False)}

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield request

    stream = client.stream_infer(requests(), stream_timeout=timeout_s, headers=headers)
    try:
        async for result, error in stream:
            if error is not None:
                raise refusal(error.message() if hasattr(error, "message") else str(error))
            outputs = {n: result.as_numpy(n) for n in ANSWER_NAMES}
            yield {n: v for n, v in outputs.items() if v is not None}
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return
    except GatewayError:
        raise
    except Exception as e:  # grpc's own: unreachable, deadline, the stream reset
        raise refusal(str(e)) from e
    finally:
        stream.cancel()  # a no-op once the stream ended; else Triton cancels the request
        await client.close()


def refusal(message: str) -> GatewayError:
    """The gateway's answer for an error the stream carried (a protocol code in its
    message: that code, its field and the server's text; else 503 / 502)."""
    code = error_code(message)
    if code is None:
        if "unavailable" in message.lower() or "connect" in message.lower():
            return GatewayError(503, "Unavailable", "triton", message, retry_after_s=5)
        return GatewayError(502, "Upstream", "triton", message)
    text = message[message.find(f"{ERROR_PREFIX}{code}: ") + len(ERROR_PREFIX + code) + 2 :]
    field, _, what = text.partition(": ")
    status = HTTP_STATUS.get(ERROR_STATUS[code], 502)
    retry = 1 if status == 503 else 0
    return GatewayError(
        status, code, field if what else "request", what or text, retry_after_s=retry
    )


async def _propagate(
    endpoint: Endpoint, model: str, inputs: Tensors, headers: dict[str, str] | None
) -> Response:
    """The stream as NDJSON; a refusal before the first response is a typed JSON answer."""
    answers = responses(endpoint, model, inputs, headers, timeout_s=None)
    try:
        first = await anext(answers)
    except StopAsyncIteration:
        raise GatewayError(
            502, "Upstream", "triton", "the stream ended without an answer"
        ) from None

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield _line(stream_line(first))
            async for outputs in answers:
                yield _line(stream_line(outputs))
        except GatewayError as e:
            yield _line({"error": {"code": e.code, "message": str(e)}})
        finally:
            await answers.aclose()  # the browser went away: the gRPC call is cancelled

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
