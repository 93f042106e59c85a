"""The one domain error type. The director raises it; the protocol adapter maps it to an HTTP status
in one place (400, 404, 429, 503, 500, ...)."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Error codes with the reference EPP's names (they appear in the `error_code` metric label)."""

    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"
    INTERNAL = "Internal"
    MODEL_SERVER_ERROR = "ModelServerError"

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
    ErrorCode.MODEL_SERVER_ERROR: 502,
}


class EppError(Exception):
    """An expected failure of a request, answered to the client with `code.http_status`.

    `message` is shown to the client: say what was wrong and how to fix it.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"EppError({self.code.value}, {self.message!r})"
