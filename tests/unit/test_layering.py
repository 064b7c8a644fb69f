"""Dependency direction (docs/architecture.md "Where things go"): enforced by reading imports, not by memory."""

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


ROLES = SIE / "roles"


def test_roles_do_not_import_each_other() -> None:
    """A role package (``sie/roles/<role>/``) imports no other role package; the
    shared wiring beside them (``sie/roles/*.py``) imports none."""
    roles = {p.name for p in ROLES.iterdir() if (p / "__init__.py").exists()}
    assert roles == {"config", "gateway", "worker"}
    bad = []
    for f in ROLES.rglob("*.py"):
        rel = f.relative_to(ROLES)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        for m in imports_of(f):
            parts = m.split(".")
            other = parts[2] if parts[:2] == ["sie", "roles"] and len(parts) > 2 else None
            if other in roles and other != own:
                bad.append(f"roles/{rel} imports {m}")
    assert bad == []


def _private_imports(path: Path, source: str | None = None) -> list[str]:
    """``sie`` modules or names the file at ``path`` (repository-relative location;
    ``source`` its text if not read from there) imports whose name starts with ``_``
    from a package other than its own: ``sie.a._x`` is importable only in ``sie/a/``."""
    tree = ast.parse(path.read_text() if source is None else source)
    rel = path.resolve()
    bad = []
    for node in ast.walk(tree):
        targets: list[tuple[str, str]] = []  # (module path, imported name or "")
        if isinstance(node, ast.Import):
            targets = [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [(node.module, a.name) for a in node.names]
        for module, name in targets:
            parts = module.split(".")
            if parts[0] != "sie":
                continue
            private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
            if private is not None:
                owner = SIE.parent.joinpath(*parts[:private])
            elif name.startswith("_"):
                owner = SIE.parent.joinpath(*parts[:-1]) if len(parts) > 1 else SIE
                if SIE.parent.joinpath(*parts).is_dir():
                    owner = SIE.parent.joinpath(*parts)
            else:
                continue
            if owner.resolve() not in rel.parents:
                bad.append(f"{path.relative_to(SIE.parent)} imports {module} {name}".strip())
    return bad


def test_no_import_of_another_packages_private_module() -> None:
    """``_x`` modules and ``_names`` stay inside their package: not imported by other
    packages of ``sie``, by the tests or by the benchmarks."""
    root = SIE.parent
    files = [*SIE.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "bench").rglob("*.py")]
    bad = [b for f in files for b in _private_imports(f)]
    assert bad == []


def test_the_private_import_check_can_fail() -> None:
    code = "from sie.transport._buffered import BufferedSubscription\nfrom sie.http.limits import _drain\n"
    outside = SIE.parent / "tests" / "unit" / "probe.py"
    assert _private_imports(outside, code) == [
        "tests/unit/probe.py imports sie.transport._buffered BufferedSubscription",
        "tests/unit/probe.py imports sie.http.limits _drain",
    ]
    assert _private_imports(SIE / "transport" / "probe.py", code) == [
        "sie/transport/probe.py imports sie.http.limits _drain"
    ]


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


def _environment_reads(source: str) -> list[str]:
    """``os.environ`` / ``os.getenv`` / ``os.putenv`` uses and ``from os import
    environ|getenv`` in ``source``."""
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
        ):
            out.append(f"os.{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            out += [f"from os import {a.name}" for a in node.names if "env" in a.name]
    return out


def test_only_settings_reads_the_environment() -> None:
    """Settings are built once at the edge (``ServeSettings.from_env``); no other module
    of ``sie`` reads or writes the process environment."""
    bad = {
        str(f.relative_to(SIE)): found
        for f in SIE.rglob("*.py")
        if f != SIE / "settings.py" and (found := _environment_reads(f.read_text()))
    }
    assert bad == {}
    assert _environment_reads("import os\nx = os.environ.get('A')\n") == ["os.environ (line 2)"]
    assert _environment_reads("from os import getenv\n") == ["from os import getenv"]


#: One concept per module: none under sie/ grows past this many lines (CONTRIBUTING.md).
MAX_MODULE_LINES = 500


def test_no_module_over_the_line_budget() -> None:
    sizes = {
        str(p.relative_to(SIE.parent)): len(p.read_text().splitlines()) for p in SIE.rglob("*.py")
    }
    assert len(sizes) > 50  # the walk found the package
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}
