"""A bank's settings: which exist, their types and defaults (``settings``), and a tenant's reads
and changes of them through the engine (``service``)."""
