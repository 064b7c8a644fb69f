"""Per-concern settings views (sie.settings_views): subsets of the one registry."""

import pytest
from pydantic import ValidationError

from sie import settings_views
from sie.settings import ServeSettings
from sie.settings_views import (
    AdmissionSettings,
    GatewaySettings,
    LimitsSettings,
    SettingsView,
    SyncSettings,
    WorkerSettings,
)

VIEWS = [getattr(settings_views, n) for n in settings_views.__all__ if n != "SettingsView"]
#: Read only at the edge (the CLI, the container, the HTTP server), not by a role.
EDGE_ONLY = {
    "roles",
    "host",
    "port",
    "config_port",
    "metrics_port",
    "drain_timeout_s",
    "gil_switch_interval_ms",
    "log_level",
    "log_json",
    "tracing_enabled",
    "weights_roots",
    "allow_trust_remote_code",
    "upstream_base_urls",
    "upstream_api_key_envs",
    "upstream_api_keys",
    "default_profiles",  # build_registry (sie.container)
}


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
def test_every_view_field_is_a_setting_of_the_same_type(view: type[SettingsView]) -> None:
    fields = ServeSettings.model_fields
    for name, info in view.model_fields.items():
        if name == "read_token":  # derived by ServeSettings.sync_view
            continue
        assert name in fields, f"{view.__name__}.{name} is not a ServeSettings field"
        assert str(info.annotation) == str(fields[name].annotation), name


def test_every_setting_reaches_a_view_or_the_edge() -> None:
    covered = {n for v in VIEWS for n in v.model_fields} | EDGE_ONLY
    assert set(ServeSettings.model_fields) - covered == set()


def test_views_carry_the_validated_values_and_are_frozen() -> None:
    s = ServeSettings(
        router_id="gw-x",
        max_body_bytes=1234,
        admission_observe_models=("a/b",),
        request_timeout_s=7.5,
    )
    gw = s.view(GatewaySettings)
    assert gw.router_id == "gw-x" and gw.request_timeout_s == 7.5
    assert s.view(LimitsSettings).max_body_bytes == 1234
    assert s.view(AdmissionSettings).admission_observe_models == ("a/b",)
    assert s.view(WorkerSettings).worker_id == s.worker_id
    with pytest.raises(ValidationError):
        gw.router_id = "other"  # type: ignore[misc]


def test_sync_view_presents_the_admin_token_else_an_inference_token() -> None:
    assert ServeSettings().sync_view().read_token is None
    both = ServeSettings(admin_token="adm", auth_token="inf").sync_view().read_token
    assert both is not None and both.get_secret_value() == "adm"
    inf = ServeSettings(auth_token="inf").sync_view().read_token
    assert inf is not None and inf.get_secret_value() == "inf"
    assert isinstance(ServeSettings().sync_view(), SyncSettings)
