"""The ``limit`` / ``offset`` page of a listing route, as one dependency.

- :class:`PageQuery`: a request's ``limit`` and ``offset``; :meth:`PageQuery.answer`
  builds the route's ``{items, total, limit, offset}`` answer from a page of items;
- :func:`page_query`: the dependency for one route's page (its default ``limit`` and the
  bounds of ``limit``); ``offset`` is :data:`heed.api.input_rules.Offset`, default 0;
- :data:`PageDep`: the common page, ``limit`` 1 to 1000 (default 100);
- :data:`LogPageDep`: the page of a bank's audit log and LLM request traces, ``limit`` 1
  to 500 (default 50).

Both parameters are documented as the route's own query parameters, with the same names,
bounds and defaults as when each route declared them. A route whose own query parameters
come after ``limit`` / ``offset`` keeps declaring them itself: a dependency's parameters
are listed after the route's own (the schema's order).

This module does not use postponed annotations: :func:`page_query` builds each
dependency's signature from its arguments, which FastAPI reads as evaluated objects.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query

from heed.api.input_rules import Offset

__all__ = ["LogPageDep", "PageDep", "PageQuery", "page_query"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PageQuery:
    """A request's ``limit`` and ``offset`` (already in their bounds)."""

    limit: int
    offset: int

    def answer(
        self, response: Callable[..., R], items: Sequence[Any], total: int, **fields: Any
    ) -> R:
        """``response(items=items, total=total, limit=..., offset=..., **fields)``: the
        answer of a listing whose model has these four fields (and *fields*)."""
        return response(items=items, total=total, limit=self.limit, offset=self.offset, **fields)


def page_query(default: int = 100, *, least: int = 1, most: int = 1000) -> Callable[..., PageQuery]:
    """The dependency reading ``limit`` (``least`` to ``most``, default *default*) and
    ``offset`` (:data:`~heed.api.input_rules.Offset`, default 0) from the query string."""

    def dependency(
        limit: Annotated[int, Query(ge=least, le=most)] = default,
        offset: Offset = 0,
    ) -> PageQuery:
        return PageQuery(limit, offset)

    return dependency


PageDep = Annotated[PageQuery, Depends(page_query())]
"""``limit`` 1 to 1000 (default 100) and ``offset``: the page most listings take."""

LogPageDep = Annotated[PageQuery, Depends(page_query(50, most=500))]
"""``limit`` 1 to 500 (default 50) and ``offset``: a page of audit entries or LLM traces."""
