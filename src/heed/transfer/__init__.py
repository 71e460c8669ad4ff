"""Bank transfer: export a bank (or some of its documents) as an archive, import an archive
as a new bank or merge its documents into one, clone a bank.

Above what a bank holds (:mod:`heed.memory`, :mod:`heed.webhooks`, the mental models), so
it carries each through its own package. The modules:

- :mod:`~heed.transfer.service`: what is asked, checked and served (the API's entry);
- :mod:`~heed.transfer.runs`: how the runs go (staging banks, stored exports, cleanup);
- :mod:`~heed.transfer.work`: their blocking halves, walking the sections in order;
- :mod:`~heed.transfer.sections`: one module per archive section behind an ordered
  registry (docs/bank-archive.md's table);
- :mod:`~heed.transfer.archive` (the container), :mod:`~heed.transfer.check` (the whole
  check of an upload), :mod:`~heed.transfer.records` (a record's field types),
  :mod:`~heed.transfer.rows` (a bank as rows), :mod:`~heed.transfer.ids`,
  :mod:`~heed.transfer.limits`;
- :mod:`~heed.transfer.store`: the stores it needs (:class:`~heed.transfer.store.TransferStore`,
  :class:`~heed.transfer.store.ArchiveStore`), implemented in :mod:`heed.storage.transfer`.
"""
