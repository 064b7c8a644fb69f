"""``SIE_MODEL_CACHE_DIR`` is a setting: it reaches the engines that convert weights
and the default weights roots, and nothing reads it from the environment later."""

from pathlib import Path

from sie.core.config import parse_model_config
from sie.engines.generators.transformers_gen import TransformersGenerator
from sie.engines.weights import default_weights_roots
from sie.settings import ServeSettings


def _generator(**extra: object) -> TransformersGenerator:
    cfg = parse_model_config(
        {
            "sie_id": "org/gen",
            "hf_id": "org/gen",
            "tasks": {},
            "profiles": {
                "default": {
                    "adapter_path": "sie.engines.generators.transformers_gen:TransformersGenerator",
                    "max_batch_tokens": 64,
                }
            },
        }
    )
    return TransformersGenerator(cfg, cfg.resolve_profile(), "cpu", **extra)  # type: ignore[arg-type]


def test_the_setting_reaches_the_engine_and_the_weights_roots(tmp_path: Path) -> None:
    s = ServeSettings.from_env({"SIE_MODEL_CACHE_DIR": str(tmp_path)})
    assert s.model_cache_dir == str(tmp_path)
    assert _generator(model_cache_dir=s.model_cache_dir).model_cache_dir == tmp_path
    assert tmp_path in default_weights_roots(s.model_cache_dir)


def test_unset_is_the_home_cache_whatever_the_environment_says(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SIE_MODEL_CACHE_DIR", "/elsewhere")
    home = Path("~/.cache/sie/models").expanduser()
    assert _generator().model_cache_dir == home
    assert ServeSettings.from_env({}).model_cache_dir == ""
    assert home in default_weights_roots()
