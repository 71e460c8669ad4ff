"""Mental models and the knowledge base: the whole capability, above reflect (a refresh is a
reflect).

- :mod:`heed.mental_models.values`: the values and their pure rules (triggers, tag scopes);
- :mod:`heed.mental_models.store`: the store protocol (:mod:`heed.storage.mental_models`
  implements it);
- :mod:`heed.mental_models.lookup`: how models are found for a query (the ranking), and
  what reflect consults first (it implements :class:`heed.reflect.ports.MentalModelSource`);
- :mod:`heed.mental_models.refresh`: the ``mental_model_refresh`` run (cancellable,
  journaled, leased, a minimum interval, background slots) and the dry run;
- :mod:`heed.mental_models.triggers`: refreshes after retains and consolidations;
- :mod:`heed.mental_models.service`: a bank's models and their rules;
- :mod:`heed.mental_models.knowledge`: folders, pages, the tree, search and export.

The package imports none of them itself, so that its values (which the layers below a
refresh, such as storage, read) come without reflect.
"""
