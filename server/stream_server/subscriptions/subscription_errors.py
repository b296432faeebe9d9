"""Why a subscription request was refused: one class, carrying the protocol's error code.

Section 7 names its errors by code (``FENCED``, ``ALREADY_CLAIMED``), not only
by status, and clients branch on the code; so each refusal carries both, and
whatever extra fields the code defines (``current_holder``), and the protocol
layer renders every one the same way: ``{"error": {"code", "message", ...}}``.
"""

from __future__ import annotations

from typing import Any

STATUS = {
    "INVALID_REQUEST": 400,
    "WEBHOOK_URL_REJECTED": 400,
    "TOKEN_INVALID": 401,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "SUBSCRIPTION_NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "SUBSCRIPTION_ALREADY_EXISTS": 409,
    "FENCED": 409,
    "ALREADY_CLAIMED": 409,
    "NO_PENDING_WORK": 409,
    "INVALID_OFFSET": 409,
    "REQUEST_TIMEOUT": 408,
    "PAYLOAD_TOO_LARGE": 413,
    "TOO_MANY_REQUESTS": 429,
    "UNAVAILABLE": 503,
}


class SubscriptionError(Exception):
    """A refused request; nothing was changed."""

    def __init__(
        self, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}  # response headers the refusal needs (Allow, Retry-After)
        self.extra = extra

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 500)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


def invalid(message: str) -> SubscriptionError:
    return SubscriptionError("INVALID_REQUEST", message)


def not_found(sub_id: str) -> SubscriptionError:
    return SubscriptionError("SUBSCRIPTION_NOT_FOUND", f"subscription {sub_id!r} not found")


def fenced(message: str) -> SubscriptionError:
    return SubscriptionError("FENCED", message)
