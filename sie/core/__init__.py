"""Pure domain of SIE: config types, registry, hashing, subjects, wire codec, errors.

Nothing here performs I/O beyond parsing bytes and strings handed to it, and
nothing here imports another ``sie`` package (docs/architecture.md "Where things go").
"""
