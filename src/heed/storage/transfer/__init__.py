"""Storage of bank transfers (:mod:`heed.transfer`), on SQLite and PostgreSQL.

- :mod:`~heed.storage.transfer.rows`: :class:`~heed.storage.transfer.rows.TransferRows`,
  the memory store's part that writes a bank's rows (:class:`heed.transfer.store.TransferStore`),
  in portable SQL; :mod:`~heed.storage.transfer.reader` reads them from one snapshot.
- :mod:`~heed.storage.transfer.pg_parallel`: PostgreSQL's way of writing memories, on
  several connections at once with binary vectors (the memory dialect hands it out).
- :mod:`~heed.storage.transfer.archives`: where archives wait
  (:class:`heed.transfer.store.ArchiveStore`).
"""
