"""Encode engines (dense, sparse, multivector): sentence-transformers adapters with
their TorchScript and int8 helpers."""
