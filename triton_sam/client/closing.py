"""``with client:`` for the clients: one place that closes a client on leaving the block."""

from __future__ import annotations

from typing import Self


class ClosesOnExit:
    """Mixin: ``with client: ...`` hands back the client and calls its ``close()`` on the
    way out, whatever happened inside (the class defines ``close``)."""

    def close(self) -> None:  # pragma: no cover - every client defines its own
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ClosesOnExit"]
