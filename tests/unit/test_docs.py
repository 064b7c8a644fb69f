"""docs/configuration.md is generated from the settings registry and documents every
SIE_* variable `sie serve` reads (sie.settings.ENV_VARS); the README links to it."""

import re
from pathlib import Path

from sie.cli import parser
from sie.settings import ENV_VARS, ServeSettings
from sie.settings_docs import ENV_DOCS, default_text, render_configuration, unit_of

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def test_configuration_md_is_the_rendered_registry() -> None:
    """Fails when a setting, default or meaning changed without ``make docs``."""
    assert render_configuration() == CONFIGURATION, "run `make docs`"
    assert set(ENV_DOCS) == set(ENV_VARS)  # one entry per variable
    assert "docs/configuration.md" in README


def test_every_env_var_is_documented_with_its_code_default() -> None:
    missing = [k for k in ENV_VARS if f"| `{k}` |" not in CONFIGURATION]
    assert missing == []
    assert default_text("SIE_PORT") == "`8080`"
    assert default_text("SIE_GATEWAY_LANE_BACKPRESSURE_ENFORCE") == "`false`"
    assert default_text("SIE_ROLES") == "`gateway,config,worker`"
    assert default_text("SIE_CONFIG_STORE_DIR") == "unset"
    assert unit_of("request_timeout_s") == "seconds" and unit_of("max_batch_wait_ms") == (
        "milliseconds"
    )


def test_documented_flags_are_the_serve_options(capsys) -> None:  # type: ignore[no-untyped-def]
    try:
        parser().parse_args(["serve", "--help"])
    except SystemExit:
        pass
    serve_help = capsys.readouterr().out
    unknown = [d.flag for d in ENV_DOCS.values() if d.flag and d.flag not in serve_help]
    assert unknown == []
    assert "next issue" not in CONFIGURATION and "next issue" not in README


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


def _sections(doc: Path) -> set[str]:
    """Section numbers of a document's headings (``## 8.2 Title`` → ``8.2``)."""
    out = set()
    for line in doc.read_text().splitlines():
        m = re.match(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", line)
        if m:
            out.add(m.group(1))
    return out


def test_docstring_citations_name_sections_that_exist() -> None:
    """Code cites the project's own docs by section ("architecture §N", "docs/api.md
    §N"), never the external reference; every cited section is a heading there."""
    root = Path(__file__).resolve().parents[2]
    arch, api = _sections(root / "docs" / "architecture.md"), _sections(root / "docs" / "api.md")
    assert len(arch) > 20 and len(api) >= 11
    missing = []
    for path in (root / "sie").rglob("*.py"):
        text = path.read_text()
        assert "reference §" not in text, f"{path}: cites the external reference"
        for doc, known in (("architecture", arch), ("docs/api.md", api)):
            for m in re.finditer(re.escape(doc) + r" ((?:§[\d.]+[,\- ]*)+)", text):
                for sec in re.findall(r"§(\d+(?:\.\d+)*)", m.group(1)):
                    if sec not in known:
                        missing.append(f"{path.name}: {doc} §{sec}")
    assert missing == []
