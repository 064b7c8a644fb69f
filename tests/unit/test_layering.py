"""Dependency direction (DESIGN.md): enforced by reading imports, not by memory."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SIE = Path(__file__).resolve().parents[2] / "sie"

# package -> sie packages it must never import
FORBIDDEN = {
    "core": {
        "transport",
        "control",
        "engines",
        "roles",
        "http",
        "container",
        "cli",
        "settings",
        "telemetry",
    },
    "transport": {"control", "engines", "roles", "http", "container", "cli"},
    "control": {"transport", "engines", "roles", "http", "container", "cli"},
    "engines": {"transport", "control", "roles", "http", "container", "cli"},
    "roles": {"http", "container", "cli"},
    "http": {"container", "cli"},
}
HEAVY_IN_CORE = {
    "torch",
    "vllm",
    "sentence_transformers",
    "nats",
    "starlette",
    "hypercorn",
    "fsspec",
    "anyio",
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers(package: str) -> None:
    bad = []
    for f in (SIE / package).rglob("*.py"):
        for mod in imports_of(f):
            parts = mod.split(".")
            if parts[0] == "sie" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                bad.append(f"{f.relative_to(SIE)} imports {mod}")
            if package == "core" and parts[0] in HEAVY_IN_CORE:
                bad.append(f"{f.relative_to(SIE)} imports {mod}")
    assert bad == []


def test_roles_do_not_import_each_other() -> None:
    # private helpers (``_x.py``) are shared wiring, not roles
    roles = {p.stem for p in (SIE / "roles").glob("*.py") if not p.stem.startswith("_")}
    bad = [
        f"{f.name} imports {m}"
        for f in (SIE / "roles").glob("*.py")
        for m in imports_of(f)
        if m.startswith("sie.roles.") and m.split(".")[2] in roles and m.split(".")[2] != f.stem
    ]
    assert bad == []


def test_only_wire_imports_ormsgpack_and_only_container_names_adapters() -> None:
    users = {
        str(f.relative_to(SIE))
        for f in SIE.rglob("*.py")
        if any(m.startswith("ormsgpack") for m in imports_of(f))
    }
    assert users == {"core/wire.py"}
    adapters = {
        str(f.relative_to(SIE))
        for f in SIE.rglob("*.py")
        if any(m in ("sie.transport.memory", "sie.transport.nats") for m in imports_of(f))
    }
    assert adapters <= {"container.py"}


def test_import_sie_is_light() -> None:
    code = (
        "import sys, sie, sie.core.config, sie.core.registry, sie.core.wire, sie.settings, sie.cli;"
        "heavy=[m for m in ('torch','vllm','nats','sentence_transformers','transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
