"""Retain: items become documents of memory units.

``prepare`` splits items and computes entities, dates and embeddings (blocking, in the
offload); ``units`` is how one item becomes units; ``links`` which entity rows and links new
units get; ``idempotency`` makes a retried retain write nothing twice; ``operations`` runs a
retain in the background as a run of kind ``"retain"``.
"""
