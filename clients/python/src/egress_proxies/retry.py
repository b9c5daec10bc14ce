"""When to ask again after a ``503`` or ``429``: after ``Retry-After`` when
the server names it, else after an exponential backoff with jitter; never
past the policy's total wait."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Optional

from .errors import ApiError

#: Statuses worth asking again: no capacity, not durable yet, not the leader, over a rate limit.
RETRIED_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """``max_wait``: seconds a call may spend waiting between attempts in
    all (0 asks once). Backoff starts at ``initial_backoff`` and doubles up
    to ``max_backoff``; each delay is drawn from its upper half (jitter, so
    crawlers that were refused together do not ask again together)."""

    max_wait: float = 30.0
    initial_backoff: float = 0.2
    max_backoff: float = 5.0

    def attempts(self) -> Attempts:
        return Attempts(self)


class Attempts:
    """The retry state of one call."""

    def __init__(self, policy: RetryPolicy):
        self._policy = policy
        self._deadline = time.monotonic() + policy.max_wait
        self._failures = 0

    def delay_after(self, error: ApiError) -> Optional[float]:
        """Seconds to wait before asking again, or ``None`` to give up."""
        if error.status not in RETRIED_STATUSES:
            return None
        self._failures += 1
        if error.retry_after is not None:
            delay = error.retry_after
        else:
            step = self._policy.initial_backoff * 2 ** min(self._failures - 1, 30)
            ceiling = min(self._policy.max_backoff, step)
            delay = random.uniform(ceiling / 2, ceiling)
        left = self._deadline - time.monotonic()
        if delay > left:
            # Waiting past the budget would only fail later: fail now.
            return None
        return delay
