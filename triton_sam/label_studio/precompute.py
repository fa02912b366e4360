"""Project-wide precompute: every task's image embedded on the server before anyone clicks.

Walks a Label Studio project's tasks through its API (``GET /api/projects/<id>`` for the
labeling config, ``GET /api/tasks?project=<id>&page=N&page_size=M`` for the tasks), fetches each
image with the backend's bounded fetcher (same origin policy, same bounds, the same key) and has
the server embed it for the tenant the backend will click in. The first click on each task
then finds the features in the server's cache. Images the server already holds cost no encode.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from triton_sam.errors import ImageFetchError, InputValidationError
from triton_sam.label_studio.config import parse_labeling_config
from triton_sam.label_studio.fetch import Fetcher
from triton_sam.label_studio.segment import Segmenter
from triton_sam.scaleout.access import DEFAULT_TENANT

PAGE_SIZE = 100


@dataclass
class PrecomputeReport:
    """What a precompute did.

    Attributes:
        tasks: tasks seen.
        embedded: images sent to the server to embed (already cached ones cost it nothing).
        failed: ``(task id, reason)`` of the images that could not be fetched or embedded.
    """

    tasks: int = 0
    embedded: int = 0
    failed: list[tuple[object, str]] = field(default_factory=list)


def project_tasks(fetcher: Fetcher, project: int) -> tuple[str, Iterator[dict]]:
    """The project's image key (from its labeling config) and its tasks, page by page.

    Raises:
        InputValidationError: the project's labeling config is not one the backend serves.
        ImageFetchError: the API answered an error.
    """
    info = _get_json(fetcher, f"/api/projects/{project}", "project")
    config = parse_labeling_config(info.get("label_config"), field="project.label_config")

    def pages() -> Iterator[dict]:
        page = 1
        while True:
            url = f"/api/tasks?project={project}&page={page}&page_size={PAGE_SIZE}"
            try:
                answer = _get_json(fetcher, url, "tasks")
            except ImageFetchError as e:
                if "HTTP 404" in str(e) and page > 1:  # past the last page
                    return
                raise
            tasks = answer.get("tasks", []) if isinstance(answer, dict) else answer
            yield from tasks
            if len(tasks) < PAGE_SIZE:
                return
            page += 1

    return config.image_key, pages()


def precompute_project(
    fetcher: Fetcher,
    segmenter: Segmenter,
    project: int,
    *,
    tenant: str = DEFAULT_TENANT,
    on_task: Callable[[], None] | None = None,
) -> PrecomputeReport:
    """Embed every task image of ``project`` on the server, one after the other.

    Args:
        fetcher: the bounded fetcher (Label Studio's URL and API key).
        segmenter: where the models are.
        project: the Label Studio project id.
        tenant: the tenant the backend clicks in (the one its token maps to).
        on_task: called after each task (a progress bar's update).

    Returns:
        Counts and the failures (one bad image does not stop the walk).
    """
    report = PrecomputeReport()
    key, tasks = project_tasks(fetcher, project)

    async def walk() -> None:
        # one event loop for the whole walk: the segmenter keeps its client open between
        # images, and a client's channel belongs to the loop that opened it
        try:
            for task in tasks:
                report.tasks += 1
                task_id = task.get("id")
                where = f"task {task_id}.data.{key}"
                try:
                    image, _ = fetcher.fetch_image((task.get("data") or {}).get(key), where)
                    await segmenter.embed(image, tenant=tenant, field=where)
                    report.embedded += 1
                except InputValidationError as e:  # fetch refusals and failures name the task
                    report.failed.append((task_id, str(e)))
                if on_task is not None:
                    on_task()
        finally:
            await segmenter.aclose()

    asyncio.run(walk())
    return report


def _get_json(fetcher: Fetcher, path: str, field: str) -> dict:
    data = fetcher.fetch_bytes(path, field)
    try:
        return json.loads(data)
    except ValueError:
        raise ImageFetchError(field, f"{path}: not JSON") from None
