"""Directives, a bank's standing rules: which apply and how they are said to a model (``rules``),
and a tenant's create, list, update and delete of them (``service``)."""
