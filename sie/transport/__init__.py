"""The bus port (``base``) and its adapters (``memory``; ``nats`` in a later issue)."""
