"""Retries with exponential backoff, for idempotent calls only.

Policy:

- **What is retried**: calls that can run twice without changing the result: health and
  metadata queries, the encoder, and the stateless decoder (embeddings + prompts in, masks
  out). The transports retry only when the caller says a call is idempotent; a call on
  server-side state (e.g. a session that accumulates prompts) is never retried.
- **On which errors**: only when the request cannot have been answered: the server cannot be
  reached or refused it as unavailable (:class:`~triton_sam.errors.ServerUnavailableError`,
  which includes :class:`~triton_sam.errors.ServerOverloadedError`). Never on a validation
  error (ours or the server's), a timeout (the per-request timeout is the caller's budget), a
  cancellation, an unknown or unloaded model (:class:`~triton_sam.errors.ModelNotReadyError`:
  waiting will not load it), or any other server error.
- **How**: attempt ``n`` (from 1) waits ``initial_backoff_s * multiplier ** (n - 1)``, capped
  at ``max_backoff_s``, with up to ``jitter`` of it added at random so that many clients do not
  retry in lockstep. The transport reconnects (a fresh connection, see
  ``Transport.reconnect``) before each retry, so a restarted server is reached at once;
  not after an overloaded answer, whose server is up and whose connection other requests
  are still using.
  No retry starts once the total time would exceed ``deadline_s``.
- **Who**: each transport runs its attempts itself and asks a :class:`Backoff` what to do
  after a failure, so nothing here calls the transport back.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from triton_sam.errors import (
    InputValidationError,
    ModelNotReadyError,
    ServerOverloadedError,
    ServerUnavailableError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How idempotent calls are retried (see the module docstring).

    Attributes:
        max_attempts: attempts in all, the first included (1 = no retry).
        initial_backoff_s: wait before the first retry.
        multiplier: factor between consecutive waits.
        max_backoff_s: longest single wait.
        jitter: fraction of each wait added at random (0 = none).
        deadline_s: no retry starts after this many seconds since the first attempt
            (None: the transport's per-request timeout).
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.2
    multiplier: float = 2.0
    max_backoff_s: float = 2.0
    jitter: float = 0.1
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InputValidationError(
                "max_attempts", f"got {self.max_attempts!r}, expected an integer >= 1"
            )
        for field in ("initial_backoff_s", "max_backoff_s", "jitter"):
            if not getattr(self, field) >= 0:
                raise InputValidationError(field, f"got {getattr(self, field)!r}, expected >= 0")
        if not self.multiplier >= 1:
            raise InputValidationError("multiplier", f"got {self.multiplier!r}, expected >= 1")

    def backoff_s(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1 = the first retry), without jitter."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))


NO_RETRY = RetryPolicy(max_attempts=1)
DEFAULT_RETRY = RetryPolicy()


def is_retryable(error: BaseException) -> bool:
    """True for errors that mean the request was not answered (see the module docstring)."""
    return isinstance(error, ServerUnavailableError) and not isinstance(error, ModelNotReadyError)


def needs_reconnect(error: BaseException) -> bool:
    """False for an overloaded server: it answered over a working connection, and a new
    connection would cancel every other request in flight on the old one (the clients share
    one channel between their concurrent calls)."""
    return not isinstance(error, ServerOverloadedError)


class Backoff:
    """The attempts of one idempotent call under ``policy``, decided without calling anything:
    the caller makes each attempt and asks :meth:`after` what to do when it fails.

    Args:
        policy: attempts and backoff.
        deadline_s: default for ``policy.deadline_s`` (the transport's timeout).
        clock: seconds, monotonic (default ``time.monotonic``).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        deadline_s: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.policy = policy
        self.limit_s = policy.deadline_s if policy.deadline_s is not None else deadline_s
        self._clock = clock or time.monotonic
        self._started = self._clock()
        self.attempts = 0
        self.reconnect = False  # the next attempt wants a fresh connection

    def after(self, error: BaseException) -> float | None:
        """Seconds to wait before the next attempt after ``error``, or None: re-raise it (not
        retryable, attempts spent, or the wait would pass the deadline). Sets
        :attr:`reconnect` (see :func:`needs_reconnect`)."""
        self.attempts += 1
        if not is_retryable(error) or self.attempts >= self.policy.max_attempts:
            return None
        wait = self.policy.backoff_s(self.attempts) * (1 + self.policy.jitter * random.random())
        if self.limit_s is not None and self._clock() - self._started + wait > self.limit_s:
            return None
        self.reconnect = needs_reconnect(error)
        return wait
