"""Bearer-token validation through the Kubernetes TokenReview API (`authentication.k8s.io/v1`), for the
direct-routing API. Blocking: callers run `review` in a worker thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client

REVIEW_TIMEOUT_S = 5.0


class TokenReviewError(Exception):
    """The API server did not answer the review (unreachable, forbidden, timed out)."""


class KubernetesTokenReviewer:
    """`review(token)` -> the authenticated user name, or None when the API server rejects the token.
    `audiences` restricts which tokens count (empty: the API server's own audience)."""

    def __init__(self, api: Any, audiences: Sequence[str] = ()) -> None:
        self._api = client.AuthenticationV1Api(api)
        self._audiences = list(audiences) or None

    def review(self, token: str) -> str | None:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=self._audiences))
        try:
            answer = self._api.create_token_review(body, _request_timeout=REVIEW_TIMEOUT_S)
        except client.ApiException as e:
            raise TokenReviewError(f"TokenReview answered HTTP {e.status}: {e.reason}") from None
        except Exception as e:  # urllib3 connection and timeout errors
            raise TokenReviewError(f"TokenReview failed: {type(e).__name__}: {e}") from None
        status = answer.status
        if status is None or not status.authenticated or status.user is None or not status.user.username:
            return None
        return str(status.user.username)
