"""Role objects the container starts: gateway, config, worker.

Each depends on ports (``sie.transport.base``, ``sie.engines``, ``sie.core``),
never on a concrete adapter and never on another role.
"""
