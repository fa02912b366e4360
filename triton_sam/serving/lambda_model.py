"""Triton python-backend (BLS) model ``sam2``: the Lambda seed's JSON contract.

The repository writer copies this file to ``sam2/1/model.py`` (both targets), with the
dependency-free ``triton_sam.serving`` modules beside it as ``triton_sam_serving``. The
contract, the prompt forms and the refusals are in
:mod:`triton_sam.serving.protocol.lambda_json`.

No state of its own: each request is checked here (base64, JSON, bounds: refused before any
work), then answered by the session model (config parameter ``session_model``, e.g.
``sam2_session``) through BLS: the first call sends the image file (``image_bytes``: decoded,
bounded, embedded and cached there) with the first prompt, each further box one call naming
the ``image_id`` it answered (its cached features; a miss sends the file again, once). The
session model answers original-size masks (``masks_bits``); this model encodes them as the
seed's 8-bit PNGs. The tenant of the request (``protocol/tenancy.py``) travels on every BLS
call, so the cache stays per tenant; the session model's errors come back with their code and
status, the field renamed to the one the client sent.

Like the session model, ``execute`` schedules each request on the instance's event loop and
returns; each request answers through its response sender when its BLS calls are done, so
one request waiting on an encode does not hold up another's click.
"""

import asyncio
import json
import os
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import bounds, intake, lambda_prompts, model_io, prompt_frame
from triton_sam_serving import protocol as envelope
from triton_sam_serving.protocol import embedding_cache as session
from triton_sam_serving.protocol import lambda_json as protocol
from triton_sam_serving.protocol import settings, tenancy
from triton_sam_serving.session_call import SessionCall, SessionError

# What each session call asks for: masks at the original size as bits, their scores, the
# size, and the id of the features it cached (for the next box).
WANTED = [session.MASKS_BITS, session.MASK_SCORES, session.IMAGE_SIZE, session.IMAGE_ID]
# The no-prompt answer: the decoder's own inputs with no point at all (the session model's
# pixel prompts always add the padding point), low-res logits and score back.
UNPROMPTED = ["masks", "iou_predictions"]


class TritonPythonModel:
    """``sam2``: image_b64 + prompt_json in, result_json out, over the session model."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.settings = settings.from_model_config(protocol.LambdaSettings, config)
        self.name = args["model_name"]
        self.session_call = SessionCall(pb_utils, self.settings.session_model)
        pre_json = self.settings.preprocessing
        self.pre = intake.preprocessing_from_json(pre_json) if pre_json else None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="triton_sam_lambda", daemon=True
        )
        self.thread.start()

    def execute(self, requests):
        """Schedule every request on the instance's loop; each answers through its sender."""
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._respond(request), self.loop)
        return None

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _respond(self, request):
        sender = request.get_response_sender()
        try:
            response = await self._answer(request)
        except Exception as e:  # _answer catches its own; this only guards the send
            response = model_io.error_answer(pb_utils, e)
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _answer(self, request):
        try:
            tenant = tenancy.request_tenant(request)  # a forged second value: refused
            image_b64 = _one_string(request, protocol.IMAGE_B64)
            prompt_text = _one_string(request, protocol.PROMPT_JSON)
            prompt = lambda_prompts.parse_prompt(
                prompt_text,
                max_points=self.settings.max_points,
                max_boxes=self.settings.max_boxes,
                max_bytes=self.settings.max_prompt_bytes,
            )
            # Base64 (up to 85 MiB of it) and PNG encoding off the loop: other requests' BLS
            # calls go on meanwhile.
            loop = asyncio.get_running_loop()
            image = await loop.run_in_executor(
                None,
                lambda: lambda_prompts.decode_image_b64(
                    image_b64, max_bytes=self.settings.max_image_bytes
                ),
            )
            masks, scores, size = await self._masks(image, prompt, tenant)
            text = await loop.run_in_executor(
                None,
                lambda: lambda_prompts.result_json(
                    self.name, len(image_b64), prompt, masks, scores, size
                ),
            )
            out = np.array([[text.encode("utf-8")]], dtype=np.object_)
            return pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(protocol.RESULT_JSON, out)]
            )
        except Exception as e:  # refusals by their code; never let one request take the stub down
            return model_io.error_answer(pb_utils, e)

    async def _masks(self, image, prompt, tenant):
        """(masks bool [H, W] each, scores, (H, W)): one session call per box (or one)."""
        if prompt.empty:
            return await self._unprompted(image, tenant)
        calls = prompt.requests()
        first = await self._call(tenant, calls[0], image=image, box_index=0)
        image_id = first[3]
        rest = await asyncio.gather(
            *(
                self._call(tenant, call, image_id=image_id, image=image, box_index=i)
                for i, call in enumerate(calls[1:], start=1)
            )
        )
        answers = [first, *rest]
        return [a[0] for a in answers], [a[1] for a in answers], first[2]

    async def _unprompted(self, image, tenant):
        """The seed's answer to ``{"points": [], "boxes": []}``: ``SAM2ImagePredictor.predict``
        without prompts, whose prompt encoder then adds no token (not even the padding point
        the session model's pixel prompts carry). Sent to the session model as the decoder's
        own prompt tensors with N = 0, and its low-res logits upsampled here by the family's
        rule, at the size of the image the session model decoded (decoded again here: this
        prompt is a smoke test's, not a click's)."""
        if self.pre is None:
            raise bounds.RequestError(protocol.PROMPT_JSON, "no points and no boxes: send one")
        inputs = [
            _bytes_tensor(session.IMAGE_BYTES, image),
            pb_utils.Tensor("point_coords", np.zeros((1, 0, 2), np.float32)),
            pb_utils.Tensor("point_labels", np.zeros((1, 0), np.float32)),
        ]
        out = await self._session(tenant, inputs, UNPROMPTED, box_index=None)
        rgb = await asyncio.get_running_loop().run_in_executor(
            None, lambda: intake.decode_image(image, max_pixels=0, field=protocol.IMAGE_B64)
        )
        hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        low = np.asarray(out["masks"], np.float32)
        mask = prompt_frame.upsample(low[:, :1], hw, self.pre)[0, 0] > 0
        return [mask], [float(np.asarray(out["iou_predictions"]).reshape(-1)[0])], hw

    async def _call(self, tenant, call, *, image, box_index, image_id=None):
        """One session prediction: by ``image_id`` when given (a miss sends the file once),
        else with the file. Returns (mask, score, (H, W), image id)."""
        if image_id is not None:
            try:
                return await self._predict(tenant, call, image_id=image_id, box_index=box_index)
            except SessionError as e:
                if e.code != envelope.ERR_EMBEDDING_NOT_FOUND:  # evicted meanwhile: resend
                    raise
        return await self._predict(tenant, call, image=image, box_index=box_index)

    async def _predict(self, tenant, call, *, box_index, image=None, image_id=None):
        points, labels, box = call
        inputs = []
        if image is not None:
            inputs.append(_bytes_tensor(session.IMAGE_BYTES, image))
        else:
            inputs.append(_bytes_tensor(session.IMAGE_ID, image_id.encode("utf-8")))
        if points is not None:
            inputs.append(pb_utils.Tensor(session.POINTS, points.astype(np.float32)[None]))
            inputs.append(pb_utils.Tensor(session.LABELS, labels.astype(np.int32)[None]))
        if box is not None:
            inputs.append(pb_utils.Tensor(session.BOX, box.astype(np.float32)[None]))
        inputs.append(pb_utils.Tensor(session.MULTIMASK, np.zeros((1, 1), np.int32)))
        out = await self._session(tenant, inputs, WANTED, box_index=box_index)
        h, w = (int(v) for v in out[session.IMAGE_SIZE].reshape(-1)[:2])
        bits = bytes(out[session.MASKS_BITS].reshape(-1)[0])
        mask = np.unpackbits(np.frombuffer(bits, np.uint8), count=h * w).reshape(h, w) > 0
        score = float(out[session.MASK_SCORES].reshape(-1)[0])
        answered_id = bytes(out[session.IMAGE_ID].reshape(-1)[0]).decode("utf-8")
        return mask, score, (h, w), answered_id

    async def _session(self, tenant, inputs, wanted, *, box_index):
        """One session call as ``tenant``: output name -> array; its refusals name the
        client's fields (``boxes[i]`` for the box a call answers)."""
        try:
            out = await self.session_call.acall(tenant, inputs, wanted)
        except SessionError as e:
            raise SessionError(e.code, lambda_prompts.client_message(str(e), box_index)) from None
        return {n: tensor.as_numpy() for n, tensor in out.items()}


def _bytes_tensor(name, value):
    return pb_utils.Tensor(name, np.array([[value]], dtype=np.object_))


def _one_string(request, name):
    """The bytes of BYTES input ``name``: one element (shape [1] or [1, 1])."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise bounds.RequestError(name, "missing; the request needs image_b64 and prompt_json")
    array = tensor.as_numpy()
    if array.size != 1:
        raise bounds.RequestError(
            name,
            f"got shape {list(array.shape)}, expected one value (shape [1, 1]); send one "
            "request per image",
        )
    return model_io.as_bytes(array.reshape(-1)[0])
