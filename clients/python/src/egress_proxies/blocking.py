"""When an answer means the target blocked the proxy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Iterable, Optional, Tuple

#: Statuses that mean "blocked" unless told otherwise: refused, and too many requests from this address.
DEFAULT_BLOCKED_STATUSES: FrozenSet[int] = frozenset({403, 429})


@dataclass(frozen=True)
class BlockRules:
    """An answer is a block when its status is one of ``statuses`` or its
    body contains one of ``markers`` (case-insensitive, e.g. ``"captcha"``)."""

    statuses: FrozenSet[int] = DEFAULT_BLOCKED_STATUSES
    markers: Tuple[str, ...] = ()

    @classmethod
    def of(cls, statuses: Iterable[int] = DEFAULT_BLOCKED_STATUSES, markers: Iterable[str] = ()) -> BlockRules:
        return cls(frozenset(int(s) for s in statuses), tuple(str(m) for m in markers if str(m)))

    @property
    def reads_body(self) -> bool:
        return bool(self.markers)

    def verdict(self, status: int, body: bytes = b"") -> Optional[str]:
        """Why the answer is a block (for the report's detail), or ``None``."""
        if status in self.statuses:
            return f"HTTP {status}"
        if self.markers and body:
            text = body.decode("utf-8", "replace").lower()
            for marker in self.markers:
                if marker.lower() in text:
                    return f"HTTP {status} with {marker!r} in the body"
        return None
