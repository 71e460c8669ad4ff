"""What a memory edit may say (``PATCH .../memories/{id}``), checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from heed.memory.models import InvalidInput, refuse_nul

__all__ = ["CURATED_TYPES", "STATES", "MemoryEdit", "parse_when"]

#: The fact types a client may curate; observations are derived from them.
CURATED_TYPES: Final = ("world", "experience")
#: A fact's curation states.
STATES: Final = ("valid", "invalidated")

#: A field given as ``null`` or ``""``: clear it (a date or the context).
CLEAR: Final = ""


@dataclass(frozen=True, slots=True)
class MemoryEdit:
    """One curation request. ``None``: leave the field as it is; for ``context`` and the
    dates, :data:`CLEAR` (``""``) clears it. ``entities`` replaces the fact's entities
    (``[]`` detaches them all). ``state``: ``invalidated`` or ``valid`` (revert)."""

    text: str | None = None
    context: str | None = None
    occurred_start: str | None = None
    occurred_end: str | None = None
    mentioned_at: str | None = None
    fact_type: str | None = None
    entities: list[str] | None = None
    state: Literal["valid", "invalidated"] | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        for name in ("text", "context", "occurred_start", "occurred_end", "mentioned_at"):
            refuse_nul(getattr(self, name), name)
        refuse_nul(self.reason, "reason")
        for name in self.entities or ():
            refuse_nul(name, "entities")
        if not self.changes_fields and self.state is None:
            raise InvalidInput(
                "give at least one field to update: text, context, occurred_start, "
                "occurred_end, mentioned_at, fact_type, entities or state"
            )
        if self.text is not None and not self.text.strip():
            raise InvalidInput("text is empty: give the fact's new text, or omit it")
        if self.fact_type is not None and self.fact_type not in CURATED_TYPES:
            raise InvalidInput(
                f"fact_type {self.fact_type!r}: a fact may become 'world' or 'experience'"
            )
        if self.state is not None and self.state not in STATES:
            raise InvalidInput(f"state {self.state!r}: give 'valid' or 'invalidated'")
        if self.state == "invalidated" and self.changes_fields:
            raise InvalidInput(
                "state 'invalidated' retires the fact as it is: give it alone (with a "
                "reason), not with an edit"
            )
        for name in ("occurred_start", "occurred_end", "mentioned_at"):
            parse_when(getattr(self, name), name)

    @property
    def changes_fields(self) -> bool:
        """Whether the edit changes the fact's content (anything but its state)."""
        values = (
            self.text,
            self.context,
            self.occurred_start,
            self.occurred_end,
            self.mentioned_at,
            self.fact_type,
            self.entities,
        )
        return any(v is not None for v in values)


def parse_when(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 date or time (UTC when it gives no zone); ``None`` for none or
    :data:`CLEAR`; :class:`InvalidInput` naming *name* when it is not one."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{name} {value!r} is not an ISO 8601 date or time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
