"""Recall: a query becomes ranked memory units within a token budget.

``pipeline`` runs the arms (semantic over ``vectors``, keyword, entity graph, time) and fuses
them (``fusion``), ranks (``ranking``, ``rerank``) and cuts to the budget (``budget``);
``query`` is what a query's text says.
"""
