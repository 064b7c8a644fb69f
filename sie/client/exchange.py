"""The I/O-free half of both clients' transport (docs/sdk.md "Retries"): how a ``Call``
becomes a request, which answer is final and which is retried after how long, how an
answer is parsed and how a stream is recognised. ``SIEClient`` and ``SIEAsyncClient``
only send, sleep and read around these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from sie.client.calls import Call
from sie.client.errors import SIEConnectionError, SIEError, error_from_response
from sie.client.wire import check_version_skew

__all__ = [
    "broken_stream",
    "builder_args",
    "forward",
    "is_event_stream",
    "parse_answer",
    "request_for",
    "retry_delay",
    "settled",
    "transport_delay",
]


def forward(local_vars: Mapping[str, Any]) -> dict[str, Any]:
    """A method's ``locals()`` (taken first thing) as keyword arguments: every
    parameter but ``self``."""
    return {k: v for k, v in local_vars.items() if k != "self"}


def builder_args(given: Mapping[str, Any]) -> dict[str, Any]:
    """A client's constructor arguments (its ``locals()``) → ``CallBuilder``'s, the
    unset ones from the client settings (``SIE_GATEWAY_URL``, ``SIE_AUTH_TOKEN``,
    ``SIE_CONFIG_SERVICE_URL``, ``SIE_ADMIN_TOKEN``). Transport-only arguments
    (``max_connections``, ...) are left out."""
    from sie.settings import client_settings

    env = client_settings()
    args = {k: given[k] for k in ("timeout_s", "gpu", "options", "pool")}
    args["base_url"] = given["base_url"] or env.gateway_url
    args["config_url"] = given["config_url"] or env.config_service_url
    for key, default in (("api_key", env.inference_token), ("admin_key", env.admin_token_value)):
        args[key] = given[key] if given[key] is not None else default()
    return args


def request_for(
    http: httpx.Client | httpx.AsyncClient, call: Call, default_timeout_s: float
) -> httpx.Request:
    """One attempt's request: the call's own attempt timeout when it retries (what is
    left of its budget), else ``default_timeout_s``."""
    policy = call.policy
    timeout = policy.attempt_timeout() if policy else default_timeout_s
    return http.build_request(
        call.method, call.url, content=call.content, headers=call.headers, timeout=timeout
    )


def transport_delay(call: Call, exc: httpx.TransportError) -> float:
    """Seconds to wait before the next attempt after ``exc``.

    Raises:
        SIEConnectionError: the call does not retry (or the policy gave up).
    """
    if call.policy is None:
        raise SIEConnectionError(f"{call.method} {call.url}: {exc!r}") from exc
    return call.policy.after_transport_error(exc)


def settled(call: Call, status: int, headers: Mapping[str, str], *, stream: bool = False) -> bool:
    """Whether an answer with ``status`` is the call's answer (not retried). A whole
    call retries a 202 when it has a policy; a stream takes any status below 400.
    A settled answer's headers are checked for version skew."""
    if stream:
        done = status < 400
    else:
        done = status in call.ok or (status < 400 and not (status == 202 and call.policy))
    if done:
        check_version_skew(headers)
    return done


def retry_delay(call: Call, status: int, headers: Mapping[str, str], body: bytes) -> float:
    """Seconds to wait before retrying an unsettled answer.

    Raises:
        SIEError: the call's error for the answer (through ``Call.on_error``) when it is
            not retried: no policy, a final status, or the budget spent.
    """
    try:
        if call.policy is None:
            raise error_from_response(status, headers, body)
        return call.policy.after_response(status, headers, body)
    except SIEError as err:
        raise (call.on_error(err) if call.on_error else err) from None


def parse_answer(call: Call, resp: httpx.Response) -> Any:
    """``Call.parse`` of a settled answer.

    Raises:
        SIEError: the answer did not have the expected shape.
    """
    try:
        return call.parse(resp)
    except (ValueError, KeyError, TypeError) as exc:
        raise SIEError(f"{call.method} {call.url}: unexpected answer: {exc}") from exc


def is_event_stream(resp: httpx.Response) -> bool:
    """Whether a streamed answer is server-sent events (else one JSON document)."""
    return "text/event-stream" in resp.headers.get("content-type", "")


def broken_stream(exc: httpx.TransportError) -> SIEConnectionError:
    """The error raised when the connection fails after a stream opened."""
    return SIEConnectionError(f"stream broke: {exc!r}")
