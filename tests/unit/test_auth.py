"""Auth decisions (architecture §3 step 1, §13; reference §5.3, §6.5), as pure functions."""

from __future__ import annotations

import pytest

from sie.core.errors import AuthMisconfigured, Forbidden, Unauthorized
from sie.http.auth import AuthPolicy, audit_auth, bearer_token, config_decision, gateway_decision

ON = AuthPolicy(mode="token", tokens=("user",), admin_token="admin")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER  abc ", "abc"),
        ("abc", None),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer   ", None),
        (None, None),
        ("", None),
    ],
)
def test_bearer_extraction(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_auth_off_only_for_none_and_on_for_unknown_modes() -> None:
    for mode in ("none", "NONE", " none "):
        assert (
            gateway_decision(AuthPolicy(mode=mode, tokens=("t",)), "POST", "/v1/encode/m", None)
            is None
        )
    for mode in ("tokne", "", "off", "token"):  # fail closed: a typo never turns auth off
        err = gateway_decision(AuthPolicy(mode=mode, tokens=("t",)), "POST", "/v1/encode/m", None)
        assert isinstance(err, Unauthorized), mode
    assert audit_auth(AuthPolicy()) == []


def test_static_is_an_alias_of_token() -> None:
    p = AuthPolicy(mode="static", tokens=("user",))
    assert isinstance(gateway_decision(p, "GET", "/v1/models", None), Unauthorized)


def test_probes_always_open() -> None:
    for path in ("/healthz", "/readyz"):
        assert gateway_decision(ON, "GET", path, None) is None
        assert gateway_decision(AuthPolicy(mode="token"), "GET", path, None) is None


def test_operational_paths_closed_unless_exempted() -> None:
    for path in ("/", "/health", "/metrics", "/ws/cluster-status"):
        assert isinstance(gateway_decision(ON, "GET", path, None), Unauthorized)
        exempt = AuthPolicy(mode="token", tokens=("user",), exempt_operational=True)
        assert gateway_decision(exempt, "GET", path, None) is None


def test_enabled_without_tokens_is_500_and_audited() -> None:
    p = AuthPolicy(mode="token")
    assert isinstance(gateway_decision(p, "POST", "/v1/encode/m", "x"), AuthMisconfigured)
    assert any("SIE_AUTH_TOKEN" in f for f in audit_auth(p))


def test_admin_mutations() -> None:
    assert isinstance(gateway_decision(ON, "POST", "/v1/configs/models", "user"), Forbidden)
    assert gateway_decision(ON, "POST", "/v1/configs/models", "admin") is None
    assert isinstance(gateway_decision(ON, "DELETE", "/v1/pools/x", None), Unauthorized)
    assert isinstance(gateway_decision(ON, "POST", "/v1/admin/x", "wrong"), Forbidden)
    no_admin = AuthPolicy(mode="token", tokens=("user",))
    assert isinstance(gateway_decision(no_admin, "POST", "/v1/pools", "user"), Forbidden)
    # resolve is a read even though it is a POST; pool reads are reads
    assert gateway_decision(ON, "POST", "/v1/configs/resolve", "user") is None
    assert gateway_decision(ON, "GET", "/v1/pools", "user") is None


def test_inference_and_reads_accept_user_or_admin_tokens() -> None:
    p = AuthPolicy(mode="token", tokens=("a", "b"), admin_token="admin")
    for t in ("a", "b", "admin"):
        assert gateway_decision(p, "POST", "/v1/encode/m", t) is None
    assert isinstance(gateway_decision(p, "POST", "/v1/encode/m", "c"), Unauthorized)
    assert isinstance(gateway_decision(p, "POST", "/v1/encode/m", "a "), Unauthorized)


def test_config_role_matrix() -> None:
    both = AuthPolicy(tokens=("user",), admin_token="admin")
    assert isinstance(config_decision(both, "POST", "/v1/configs/models", None), Unauthorized)
    assert isinstance(config_decision(both, "POST", "/v1/configs/models", "user"), Forbidden)
    assert config_decision(both, "POST", "/v1/configs/models", "admin") is None
    assert isinstance(config_decision(both, "GET", "/v1/configs/export", "user"), Forbidden)
    assert config_decision(both, "GET", "/v1/configs/epoch", "user") is None
    assert config_decision(both, "GET", "/v1/configs/epoch", "admin") is None
    assert isinstance(config_decision(both, "GET", "/v1/configs/epoch", None), Unauthorized)
    assert isinstance(config_decision(both, "GET", "/v1/configs/epoch", "wrong"), Forbidden)
    # only the inference token: writes are refused whatever the bearer (§3 step 1)
    user_only = AuthPolicy(tokens=("user",))
    for t in (None, "user", "admin"):
        assert isinstance(config_decision(user_only, "POST", "/v1/configs/models", t), Forbidden)
    assert config_decision(user_only, "GET", "/v1/configs/models", "user") is None
    # neither: open (dev only)
    assert config_decision(AuthPolicy(), "POST", "/v1/configs/models", None) is None
    for path in ("/healthz", "/readyz"):
        assert config_decision(both, "GET", path, None) is None
    assert isinstance(config_decision(both, "GET", "/metrics", None), Unauthorized)


def test_misspelt_mode_refuses_to_start() -> None:
    from pydantic import ValidationError

    from sie.settings import ServeSettings

    for mode in ("tokne", "off", "true", ""):
        with pytest.raises(ValidationError, match="SIE_AUTH_MODE"):
            ServeSettings.from_env({}, auth_mode=mode)
    assert ServeSettings(auth_mode=" Token ").auth_mode == "token"  # type: ignore[arg-type]
    assert ServeSettings().effective_auth_mode == "none"


def test_open_address_needs_auth_stated(caplog: pytest.LogCaptureFixture) -> None:
    from pydantic import ValidationError

    from sie.container import Container
    from sie.settings import ServeSettings

    for host in ("0.0.0.0", "::", "10.1.2.3", "sie.example.com"):
        with pytest.raises(ValidationError, match="SIE_AUTH_MODE=none"):
            ServeSettings(host=host)
    for host in ("127.0.0.1", "::1", "localhost", "127.8.9.10"):
        assert ServeSettings(host=host).effective_auth_mode == "none"
    assert ServeSettings(host="0.0.0.0", auth_mode="token").auth_mode == "token"
    with caplog.at_level("WARNING"):
        Container(ServeSettings(host="0.0.0.0", auth_mode="none"))
    assert any("auth is off" in r.getMessage() for r in caplog.records)
