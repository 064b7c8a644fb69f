"""The config role: the single writer of model configs (``role.ConfigRole``)."""

from sie.roles.config.role import ConfigRole, load_authority_registry

__all__ = ["ConfigRole", "load_authority_registry"]
