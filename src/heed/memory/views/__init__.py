"""Bank views: what a bank holds, read for browsing (entities, the entity and memory graphs,
tags, observation scopes, chunks, memories per time bucket: ``timeseries``). ``service``
answers them from the store's reads, whose row types are in ``rows``."""
