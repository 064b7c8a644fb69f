"""The SDK's retry contract (docs/sdk.md "Retries"), one policy for both clients.

A call owns a ``RetryPolicy``. Before each attempt the client asks ``attempt_timeout()``
(the per-attempt timeout: ``min(timeout_s, budget left)``); after a failed attempt it
hands the answer to ``after_response`` or the transport error to
``after_transport_error``, which either return the seconds to sleep before the next
attempt or raise the error to surface. The budget is ``provision_timeout_s``
(default 900 s), counted from the first attempt.

==============================  ==========================  ===============================
answer                          retried when                delay
==============================  ==========================  ===============================
502 ``MODEL_LOAD_FAILED``       never (raised at once)      -
503 ``PROVISIONING`` / 202      ``wait_for_capacity``       Retry-After (else 5 s)
503 ``MODEL_LOADING``           always, within the budget   Retry-After (else 5 s)
503 ``LORA_LOADING``            encode, up to 10 times      Retry-After (else 1 s)
503 ``RESOURCE_EXHAUSTED``      up to ``max_oom_retries``   ``oom_backoff`` (5, 10, 20 s)
other 503, 504                  ``wait_for_capacity``       Retry-After (else 5 s)
503 ``TRANSPORT_FAILURE``       never                       -
connect / mid-flight errors     ``wait_for_capacity``       5 s
anything else                   never                       -
==============================  ==========================  ===============================

Every delay is capped to the budget left; when none is left the last error is raised
(``ModelLoadingError``, ``ProvisioningError``, ``ServerError`` or
``SIEConnectionError``). A ``RESOURCE_EXHAUSTED`` whose next backoff would overrun the
budget raises ``ResourceExhaustedError`` at once, not a timeout.
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from collections.abc import Callable, Mapping

import httpx

from sie.client.errors import (
    LoraLoadingError,
    ModelLoadingError,
    ProvisioningError,
    ResourceExhaustedError,
    SIEConnectionError,
    SIEError,
    StatusError,
    error_from_response,
    retry_after_of,
)

__all__ = [
    "DEFAULT_PROVISION_TIMEOUT_S",
    "DEFAULT_RETRY_DELAY_S",
    "LORA_MAX_RETRIES",
    "OOM_BACKOFF_CAP_S",
    "RetryPolicy",
    "is_transient_connect_error",
    "oom_backoff",
]

log = logging.getLogger("sie.client")

#: The whole-call time budget when the call does not give ``provision_timeout_s``.
DEFAULT_PROVISION_TIMEOUT_S = 900.0
#: Delay before a retry when the answer has no ``Retry-After``.
DEFAULT_RETRY_DELAY_S = 5.0
DEFAULT_LORA_DELAY_S = 1.0
LORA_MAX_RETRIES = 10
#: The largest single out-of-memory backoff.
OOM_BACKOFF_CAP_S = 30.0
#: Codes of a 503 that a retry cannot fix.
TERMINAL_503 = frozenset({"TRANSPORT_FAILURE"})

_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    getattr(errno, "EHOSTDOWN", -1),
    -3,  # socket.EAI_AGAIN: temporary failure in name resolution
}


def oom_backoff(attempt: int, retry_after: float | None) -> float:
    """Seconds before out-of-memory retry number ``attempt`` (0-based).

    With the server's ``Retry-After`` R: the first retry waits ``min(R, 30)``, later
    ones ``min(max(5, R) * 2**attempt, 30)``; without it ``min(5 * 2**attempt, 30)``
    (5, 10, 20 s).
    """
    if retry_after is not None:
        r = max(0.0, float(retry_after))
        if attempt == 0:
            return min(r, OOM_BACKOFF_CAP_S)
        return min(max(DEFAULT_RETRY_DELAY_S, r) * float(2**attempt), OOM_BACKOFF_CAP_S)
    return min(DEFAULT_RETRY_DELAY_S * float(2**attempt), OOM_BACKOFF_CAP_S)


def is_transient_connect_error(exc: BaseException) -> bool:
    """Whether a failed connect may succeed later: refused, reset, unreachable, timed
    out, a name lookup to retry, or an unknown cause; never a TLS failure."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError):
            return False
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur.errno in _TRANSIENT_ERRNOS
        cur = cur.__cause__ or cur.__context__
    return True


class RetryPolicy:
    """One call's retry state (see the module docstring).

    ``operation``: ``encode``, ``score``, ``extract``, ``generate``...; ``model`` and
    ``gpu`` name the target in errors; ``clock``: monotonic seconds (tests).
    """

    def __init__(
        self,
        *,
        operation: str,
        model: str,
        timeout_s: float,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
        gpu: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operation = operation
        self.model = model
        self.timeout_s = timeout_s
        self.wait = wait_for_capacity
        self.budget_s = (
            DEFAULT_PROVISION_TIMEOUT_S if provision_timeout_s is None else provision_timeout_s
        )
        self.max_oom_retries = max(0, max_oom_retries)
        self.gpu = gpu
        self.clock = clock
        self.started = clock()
        self.oom_retries = 0
        self.lora_retries = 0
        self.attempts = 0
        self.last_error: SIEError | None = None

    def remaining(self) -> float:
        """Seconds of the budget left (may be negative)."""
        return self.budget_s - (self.clock() - self.started)

    def attempt_timeout(self) -> float:
        """The timeout of the next attempt.

        Raises:
            the last error (or ``ProvisioningError`` before any) when no budget is left.
        """
        left = self.remaining()
        if left <= 0:
            raise self.last_error or ProvisioningError(
                f"{self.operation} {self.model}: time budget of {self.budget_s:g} s spent "
                "before the first attempt",
                gpu=self.gpu,
            )
        self.attempts += 1
        return max(0.001, min(self.timeout_s, left))

    def _delay(self, wanted: float, err: SIEError) -> float:
        """``wanted`` capped to the budget; raise ``err`` when none is left."""
        self.last_error = err
        left = self.remaining()
        if left <= 0:
            raise err
        return max(0.0, min(wanted, left))

    def after_response(self, status: int, headers: Mapping[str, str], content: bytes) -> float:
        """Seconds to wait before retrying this answer, or raise its error."""
        err = error_from_response(status, headers, content, model=self.model)
        retry_after = retry_after_of(headers)
        code = err.code if isinstance(err, StatusError) else "PROVISIONING"
        if status == 202 or isinstance(err, ProvisioningError):
            prov = ProvisioningError(
                f"{self.operation} {self.model}: no capacity serves the lane "
                f"({getattr(err, 'message', 'provisioning')})",
                gpu=self.gpu,
                retry_after=retry_after,
            )
            if not self.wait:
                raise prov
            return self._log(self._delay(retry_after or DEFAULT_RETRY_DELAY_S, prov), code)
        if code == "MODEL_LOAD_FAILED" or status not in (503, 504):
            raise err
        if code == "MODEL_LOADING":
            loading = ModelLoadingError(
                f"{self.model} was still loading when the time budget of "
                f"{self.budget_s:g} s ran out",
                model=self.model,
            )
            return self._log(self._delay(retry_after or DEFAULT_RETRY_DELAY_S, loading), code)
        if code == "LORA_LOADING" and self.operation == "encode":
            if self.lora_retries >= LORA_MAX_RETRIES:
                raise LoraLoadingError(
                    f"{self.model}: LoRA still loading after {LORA_MAX_RETRIES} retries",
                    model=self.model,
                )
            self.lora_retries += 1
            return self._log(self._delay(retry_after or DEFAULT_LORA_DELAY_S, err), code)
        if code == "RESOURCE_EXHAUSTED":
            return self._log(self._oom(retry_after), code)
        if code in TERMINAL_503 or not self.wait:
            raise err
        return self._log(self._delay(retry_after or DEFAULT_RETRY_DELAY_S, err), code)

    def _oom(self, retry_after: float | None) -> float:
        n = self.oom_retries
        exhausted = ResourceExhaustedError(
            f"{self.model}: out of memory on the server after {n} retries",
            model=self.model,
            retries=n,
        )
        if n >= self.max_oom_retries:
            raise exhausted
        delay = oom_backoff(n, retry_after)
        if delay >= self.remaining():  # sustained OOM surfaces as OOM, not as a timeout
            raise exhausted
        self.oom_retries += 1
        self.last_error = exhausted
        if n == 0:
            log.warning(
                "%s %s: out of memory on the server, retrying in %.1fs", *self._who(), delay
            )
        return delay

    def after_transport_error(self, exc: httpx.TransportError) -> float:
        """Seconds to wait before retrying after a transport error, or raise
        ``SIEConnectionError``."""
        kind = "connect" if isinstance(exc, httpx.ConnectError) else "transport"
        err = SIEConnectionError(f"{self.operation} {self.model}: {kind} error: {exc!r}")
        retryable = isinstance(
            exc,
            httpx.TimeoutException
            | httpx.RemoteProtocolError
            | httpx.ReadError
            | httpx.WriteError
            | httpx.ConnectError,
        )
        if isinstance(exc, httpx.ConnectError) and not is_transient_connect_error(exc):
            retryable = False
        if not (self.wait and retryable):
            raise err from exc
        return self._log(self._delay(DEFAULT_RETRY_DELAY_S, err), kind)

    def _who(self) -> tuple[str, str]:
        return self.operation, self.model

    def _log(self, delay: float, why: str | None) -> float:
        log.info(
            "%s %s: %s, retry %d in %.1fs (%.0fs of budget left)",
            self.operation,
            self.model,
            why or "retryable answer",
            self.attempts,
            delay,
            self.remaining(),
        )
        return delay
