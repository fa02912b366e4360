"""Start/stop lifecycle shared by the processes the package runs (embedded tritonserver,
a set of replicas, the nginx proxy): ``start()`` returns the object, ``stop()`` is
idempotent, and ``with obj:`` starts it on entry and stops it on exit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

S = TypeVar("S", bound="Service")


class Service:
    """Base of the classes that own a running process: subclasses define ``start`` and
    ``stop``; the context manager protocol is the same for all of them."""

    def start(self: S) -> S:
        """Start the process(es); return ``self``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the process(es) and remove their files; safe to call twice."""
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def stopped_on_error(service: Service) -> Iterator[None]:
    """Stop ``service`` when the block raises anything (Ctrl-C included), then re-raise:
    a start that fails half way leaves no process behind."""
    try:
        yield
    except BaseException:
        service.stop()
        raise
