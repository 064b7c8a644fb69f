"""``python -m sie``: the same entry point as the ``sie`` console script."""

from sie.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
