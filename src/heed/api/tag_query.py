"""The tag filter of a route's query string, shared by the routes that filter by tags.

- :data:`TagsMatchQuery`: ``tags_match`` as a free string documented with recall's modes
  (:data:`heed.memory.tags.TAGS_MATCH`); another value is a 400 when checked, not a 422;
- :func:`refuse_tag_groups`: Hindsight's ``tag_groups`` is refused with a 400 naming it;
- :data:`TagQueryDep`: ``tags``, ``tags_match`` and ``tag_groups`` as one dependency
  (:class:`TagQuery`); nothing is checked until the route calls :meth:`TagQuery.match`,
  so a route refuses them at the point of its body it always did;
- :data:`TypedTagQueryDep`: the same, with ``tags_match`` typed as the modes (another
  value is a 422 before the route runs, as for the knowledge base's routes).

The dependency classes need evaluated annotations, as :mod:`heed.api.list_queries` says:
no postponed annotations here either.
"""

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query

from heed.api.input_rules import QueryText, TagsQuery
from heed.memory.models import InvalidInput, TagsMatch
from heed.memory.tags import TAGS_MATCH, check_tags_match

__all__ = [
    "TagQuery",
    "TagQueryDep",
    "TagsMatchQuery",
    "TypedTagQuery",
    "TypedTagQueryDep",
    "refuse_tag_groups",
]

TagsMatchQuery = Annotated[
    str,
    Query(
        json_schema_extra={"enum": list(TAGS_MATCH)},
        description="How ``tags`` match, as recall's ``tags_match``; another value is a 400.",
    ),
]


def refuse_tag_groups(tag_groups: object) -> None:
    """A 400 naming ``tag_groups`` when it is given (not empty): heed filters by ``tags``
    and ``tags_match`` only."""
    if tag_groups:
        raise InvalidInput("tag_groups is not supported by heed; use tags and tags_match")


@dataclass(frozen=True, slots=True)
class TagQuery:
    """A request's ``tags``, ``tags_match`` and ``tag_groups``, as sent (unchecked). The
    class is its own dependency: FastAPI reads its fields as query parameters."""

    tags: TagsQuery = None
    tags_match: TagsMatchQuery = "any"
    tag_groups: QueryText | None = None

    def match(self) -> TagsMatch:
        """The checked ``tags_match`` mode, after refusing ``tag_groups`` (each a 400
        naming the parameter, :class:`InvalidInput`)."""
        refuse_tag_groups(self.tag_groups)
        return check_tags_match(self.tags_match)


@dataclass(frozen=True, slots=True)
class TypedTagQuery(TagQuery):
    """:class:`TagQuery` with ``tags_match`` typed as the modes: another value is a 422
    before the route runs."""

    tags_match: TagsMatch = "any"


TagQueryDep = Annotated[TagQuery, Depends(TagQuery)]
"""The three query parameters of :class:`TagQuery`, documented as the route's own."""

TypedTagQueryDep = Annotated[TagQuery, Depends(TypedTagQuery)]
"""As :data:`TagQueryDep`, ``tags_match`` one of the modes (the schema's enum)."""
