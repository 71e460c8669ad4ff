"""File retain's wire format (``POST /v1/default/banks/{bank_id}/files/retain``).

The multipart form has ``files`` (one or more) and ``request``, a JSON string: Hindsight's
``FileRetainRequest`` with the fields heed honours (:class:`FileRetainRequest`). A field
heed does not implement (``parser``: heed has one set of parsers) is refused by name.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from heed.api.input_rules import (
    MAX_LIST_ITEMS,
    Identifier,
    MetadataMap,
    RequestBody,
    TagList,
    Text,
)

__all__ = ["FileMetadataEntry", "FileRetainRequest", "FileRetainResponse"]


class FileMetadataEntry(RequestBody):
    """What the client says of one file, in the order of the files."""

    model_config = ConfigDict(strict=True, extra="forbid")

    context: Text | None = None
    document_id: Identifier | None = None
    tags: TagList | None = None
    metadata: MetadataMap | None = None


class FileRetainRequest(RequestBody):
    """The ``request`` form field, parsed."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    files_metadata: Annotated[list[FileMetadataEntry], Field(max_length=MAX_LIST_ITEMS)] | None = (
        None
    )
    async_: bool = Field(
        default=False,
        alias="async",
        description="heed: retain each file as an operation (its id returned) instead of "
        "before answering.",
    )


class FileRetainResponse(RequestBody):
    """Hindsight's ``FileRetainResponse`` (``operation_ids``, empty when the files were
    retained before the answer), with what heed did."""

    model_config = ConfigDict(populate_by_name=True)

    operation_ids: list[str]
    async_: bool = Field(alias="async")
    document_ids: list[str]
    items_count: int
    units_count: int | None = None
