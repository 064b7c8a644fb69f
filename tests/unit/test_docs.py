"""The README documents every SIE_* variable `sie serve` reads (sie.settings.ENV_VARS)."""

from pathlib import Path

from sie.settings import ENV_VARS, ServeSettings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_env_var_is_documented() -> None:
    missing = [k for k in ENV_VARS if f"`{k}`" not in README]
    assert missing == []


def test_env_vars_fill_settings_and_flags_win() -> None:
    s = ServeSettings.from_env(
        {
            "SIE_PORT": "9999",
            "SIE_ROLES": "gateway, worker",
            "SIE_PRELOAD_MODELS": "a,b",
            "SIE_GATEWAY_REQUEST_TIMEOUT": "2.5",
        },
        port=7777,
    )
    assert s.port == 7777 and s.roles == ("gateway", "worker") and s.preload == ("a", "b")
    assert s.request_timeout_s == 2.5
    assert set(ENV_VARS.values()) <= set(ServeSettings.model_fields)
