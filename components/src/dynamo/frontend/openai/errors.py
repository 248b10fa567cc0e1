"""The OpenAI error shape, ``{"error": {"message", "type", "param", "code"}}``, and the errors
the frontend answers with it: a 400 naming the request's field, a 404 for a model no worker
serves, a 503 when no worker can answer.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error answered to the client in the OpenAI shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        param: str | None = None,
        code: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.detail = detail  # for the log only (instances tried, their errors); None: message

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_value"):
    return ApiError(400, message, type="invalid_request_error", param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or has no worker registered.",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def service_unavailable(
    message: str, *, code: str = "worker_unavailable", detail: str | None = None
) -> ApiError:
    return ApiError(503, message, type="service_unavailable_error", code=code, detail=detail)
