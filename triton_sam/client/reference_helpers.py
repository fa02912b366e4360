"""The reference client's module functions (``queue_multiple_requests``,
``wait_for_latest_result``), over :class:`~triton_sam.client.speculative.SpeculativeSAM2Client`;
importable from :mod:`triton_sam.client.speculative` as before."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_sam.errors import InputValidationError

if TYPE_CHECKING:
    from triton_sam.client.speculative import SpeculativeSAM2Client


async def queue_multiple_requests(
    client: SpeculativeSAM2Client,
    point_coords_list: Sequence[Any],
    point_labels_list: Sequence[Any],
    session_id: str,
) -> list[tuple[str, asyncio.Task[tuple[np.ndarray, np.ndarray]]]]:
    """Send one request per prompt (as the reference): a list of ``(request_id, task)``.

    Raises:
        InputValidationError: the two lists differ in length, or a prompt is invalid (the
            requests sent before it stay in flight, in the session).
    """
    if len(point_coords_list) != len(point_labels_list):
        raise InputValidationError(
            "point_labels_list",
            f"{len(point_labels_list)} entries for {len(point_coords_list)} point_coords",
        )
    tasks = []
    for coords, labels in zip(point_coords_list, point_labels_list, strict=True):
        tasks.append(await client.predict_async(coords, labels, session_id=session_id))
    return tasks


async def wait_for_latest_result(
    tasks: Sequence[tuple[str, asyncio.Task[tuple[np.ndarray, np.ndarray]]]],
    client: SpeculativeSAM2Client,
    session_id: str,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Wait for the last request of ``tasks``; its ``(masks, iou)``, or None if cancelled.

    Unlike the reference, which printed failures and returned None, a failed request raises
    its error (``ServerError``, ``InferenceTimeoutError``...).
    """
    if not tasks:
        return None
    request_id, task = tasks[-1]
    await asyncio.wait([task])  # does not raise when the task was cancelled; we may be
    if task.cancelled() or client.get_request_status(session_id, request_id) == "cancelled":
        return None
    return task.result()
