"""Bearer-token auth for the gateway and the config role (architecture §3 step 1, §13;
docs/security.md "Authentication", docs/security.md "Authentication").

Decisions are pure functions of (method, path, bearer) and the configured tokens;
``AuthMiddleware`` applies one to every HTTP request. Tokens are compared in
constant time (``hmac.compare_digest``) against every configured token.

Gateway (``SIE_AUTH_MODE``: ``none`` default on a loopback address; ``token`` or its
alias ``static`` enforce; any other value is refused by the settings, and a policy
holding one enforces: a typo never turns auth off; docs/security.md "Authentication"):

- ``/healthz`` and ``/readyz`` are always open (kubelet probes);
- ``/``, ``/health``, ``/metrics``, ``/ws/*`` are open only with
  ``SIE_AUTH_EXEMPT_OPERATIONAL=true``;
- admin mutations (POST/PUT/PATCH/DELETE under ``/v1/configs/`` except
  ``/v1/configs/resolve``, ``/v1/admin/``, ``/v1/pools``) need ``SIE_ADMIN_TOKEN``;
  unset → 403 (fail closed);
- everything else needs ``SIE_AUTH_TOKEN``/``SIE_AUTH_TOKENS`` (or the admin
  token); missing or wrong → 401; auth on with no tokens at all → 500.

Config role (no mode switch; enforced whenever a token is set):

- ``/healthz``, ``/readyz`` open (``/metrics`` is a read, as on the gateway);
- writes (``POST /v1/configs/models``, ``GET /v1/configs/export``): with
  ``SIE_ADMIN_TOKEN`` set the bearer must equal it (missing 401, wrong 403);
  with only ``SIE_AUTH_TOKEN`` set → 403 (the inference token never grants
  writes); with neither → open (dev only);
- reads: open when no token is set; else the bearer must be the inference or the
  admin token (missing 401, wrong 403).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sie.core.errors import AuthMisconfigured, Forbidden, SieError, Unauthorized

__all__ = [
    "AuthMiddleware",
    "AuthPolicy",
    "audit_auth",
    "bearer_token",
    "config_decision",
    "gateway_decision",
]

log = logging.getLogger(__name__)

PROBES = frozenset({"/healthz", "/readyz"})
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    """Configured auth. ``tokens``: inference/read tokens; ``admin_token``: admin rights."""

    mode: str = "none"
    tokens: tuple[str, ...] = ()
    admin_token: str | None = None
    exempt_operational: bool = False

    @property
    def enforcing(self) -> bool:
        """Everything but ``none`` enforces (fail closed)."""
        return self.mode.strip().lower() != "none"


def audit_auth(policy: AuthPolicy) -> list[str]:
    """Startup findings, logged by the caller (errors first)."""
    out = []
    if policy.enforcing and not policy.tokens:
        out.append(
            "error: SIE_AUTH_MODE enables auth but SIE_AUTH_TOKEN(S) is empty: requests get 500"
        )
    if policy.enforcing and not policy.admin_token:
        out.append("warning: SIE_ADMIN_TOKEN is unset: admin mutations are refused (403)")
    if policy.enforcing and policy.exempt_operational:
        out.append("warning: SIE_AUTH_EXEMPT_OPERATIONAL exposes /, /health, /metrics, /ws/*")
    return out


def bearer_token(header: str | None) -> str | None:
    """``Authorization: Bearer <t>`` → ``t`` (scheme case-insensitive); else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _matches(token: str, candidates: Sequence[str | None]) -> bool:
    ok = False
    for c in candidates:
        if c:  # compare against every candidate: timing does not reveal which matched
            ok |= hmac.compare_digest(token.encode(), c.encode())
    return ok


def _is_gateway_admin(method: str, path: str) -> bool:
    if method not in MUTATING:
        return False
    if path.startswith("/v1/configs/"):
        return path != "/v1/configs/resolve"
    return path.startswith("/v1/admin/") or path == "/v1/pools" or path.startswith("/v1/pools/")


def _is_operational(path: str) -> bool:
    return path in ("/", "/health", "/metrics") or path.startswith("/ws/")


def gateway_decision(
    policy: AuthPolicy, method: str, path: str, token: str | None
) -> SieError | None:
    """None to allow, else the error to answer with (architecture §13 "Gateway")."""
    if not policy.enforcing or path in PROBES:
        return None
    if policy.exempt_operational and _is_operational(path):
        return None
    if _is_gateway_admin(method, path):
        if not policy.admin_token:
            return Forbidden("admin routes are disabled: SIE_ADMIN_TOKEN is not set")
        if token is None:
            return Unauthorized("missing bearer token (admin route)")
        if not _matches(token, [policy.admin_token]):
            return Forbidden("this route needs the admin token")
        return None
    if not policy.tokens:
        return AuthMisconfigured("auth is enabled but no SIE_AUTH_TOKEN(S) are configured")
    if token is None:
        return Unauthorized("missing bearer token")
    if not _matches(token, [*policy.tokens, policy.admin_token]):
        return Unauthorized("invalid bearer token")
    return None


def _is_config_write(method: str, path: str) -> bool:
    return (method == "POST" and path == "/v1/configs/models") or path == "/v1/configs/export"


def config_decision(
    policy: AuthPolicy, method: str, path: str, token: str | None
) -> SieError | None:
    """None to allow, else the error (architecture §3 step 1; docs/security.md "Authentication")."""
    if path in PROBES:
        return None
    if _is_config_write(method, path):
        if policy.admin_token:
            if token is None:
                return Unauthorized("missing bearer token (config writes need the admin token)")
            if not _matches(token, [policy.admin_token]):
                return Forbidden("config writes need the admin token")
            return None
        if policy.tokens:
            return Forbidden(
                "config writes are disabled: SIE_ADMIN_TOKEN is not set "
                "(the inference token never grants writes)"
            )
        return None
    if not policy.tokens and not policy.admin_token:
        return None
    if token is None:
        return Unauthorized("missing bearer token")
    if not _matches(token, [*policy.tokens, policy.admin_token]):
        return Forbidden("invalid bearer token")
    return None


Decision = Callable[[AuthPolicy, str, str, str | None], SieError | None]


class AuthMiddleware:
    """Applies ``decide`` to each HTTP request; ``respond`` renders the refusal."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        policy: AuthPolicy,
        decide: Decision,
        respond: Callable[[Scope, SieError], Response],
    ) -> None:
        self.app = app
        self.policy = policy
        self.decide = decide
        self.respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = None
            for k, v in scope.get("headers", []):
                if k == b"authorization":
                    header = v.decode("latin-1")
                    break
            err = self.decide(self.policy, scope["method"], scope["path"], bearer_token(header))
            if err is not None:
                response = self.respond(scope, err)
                if isinstance(err, Unauthorized):
                    response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
