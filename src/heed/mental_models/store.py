"""The storage interface of mental models and the knowledge base.

:class:`heed.storage.memory.SqlMemoryStore` implements it (its part:
:mod:`heed.storage.mental_models`), on SQLite and on PostgreSQL. All methods block (call them
through the offload).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from heed.memory.models import TagsMatch
from heed.mental_models.values import HistoryEntry, KnowledgeFolder, MentalModel, MentalModelRow

__all__ = ["MentalModelStore"]


class MentalModelStore(Protocol):
    """Mental models, their history and the knowledge base's folders
    (:mod:`heed.mental_models.values`); :class:`heed.storage.memory.SqlMemoryStore` implements
    it beside :class:`heed.memory.store.MemoryStore` (contract:
    ``tests/storage/test_memory_mental_models.py``).

    Writes are one transaction each under the bank's lock and check the bank's row first
    (:class:`~heed.memory.store.BankGone`, nothing written). Ids are unique per bank across
    models and folders (:class:`~heed.memory.models.Conflict`); a node's name is unique among
    its siblings (:class:`~heed.memory.models.Conflict`); a parent that is not one of the
    bank's folders is :class:`~heed.memory.models.NotFound`. Reads whose id holds NUL find
    nothing."""

    def mental_models(self, bank_ref: str, with_embeddings: bool = False) -> list[MentalModel]:
        """Every model of the bank (pages too), oldest first (then by id); their embeddings
        only when asked for."""
        ...

    def get_mental_model(self, bank_ref: str, model_id: str) -> MentalModel | None:
        """The bank's model *model_id*, with its embedding."""
        ...

    def create_mental_model(self, model: MentalModel, limit: int) -> MentalModel:
        """Insert *model* (its ``created_at`` and ``updated_at`` set now); refuses a bank
        already holding *limit* models (:class:`~heed.memory.models.InvalidInput`)."""
        ...

    def update_mental_model(
        self, bank_ref: str, model_id: str, changes: dict[str, Any]
    ) -> MentalModel | None:
        """Set the given fields (``name``, ``source_query``, ``tags``, ``max_tokens``,
        ``trigger``, ``parent_id``) of the model; ``None`` when the bank has no such model.
        A move (``parent_id``) checks the name among its new siblings."""
        ...

    def write_mental_model_content(
        self,
        bank_ref: str,
        model_id: str,
        content: str,
        reflect_response: dict[str, Any] | None,
        embedding: np.ndarray | None,
        *,
        reason: str,
        history_limit: int,
        refreshed: bool,
        fingerprint: str | None = None,
    ) -> MentalModel | None:
        """Replace the model's content (and the response it came from, and its embedding);
        the content it replaces, when not empty and not the same, goes to its history with
        *reason*, which keeps the newest *history_limit*. *refreshed* stamps
        ``last_refreshed_at``. *fingerprint* is stored as the model's source fingerprint
        (:mod:`heed.mental_models.fingerprint`); ``None`` empties it. ``None`` when the bank
        has no such model."""
        ...

    def refresh_fingerprint(self, bank_ref: str, model_id: str) -> str | None:
        """The source fingerprint stored with the model's content (``None``: none, or no
        such model)."""
        ...

    def mark_refresh_skipped(self, bank_ref: str, model_id: str, fingerprint: str) -> bool:
        """Stamp the model's ``last_refreshed_at`` if its stored source fingerprint is still
        *fingerprint* (a refresh found its sources unchanged); whether it was. Content,
        history and ``updated_at`` stay as they are."""
        ...

    def scope_digest(
        self,
        bank_ref: str,
        tags: Sequence[str] | None,
        tags_match: TagsMatch,
        fact_types: Sequence[str] | None,
    ) -> list[int]:
        """A digest of the bank's units a recall with these filters can find (tags matched
        by recall's rule, :func:`heed.memory.tags.tags_pass`; *fact_types* ``None``: any):
        it changes whenever a unit enters or leaves that scope."""
        ...

    def mark_refresh_failed(self, bank_ref: str, model_id: str) -> None:
        """Stamp the model's ``last_refresh_failed_at`` (nothing when it is gone)."""
        ...

    def delete_mental_model(self, bank_ref: str, model_id: str) -> bool:
        """Delete the model and its history; whether there was one."""
        ...

    def mental_model_history(self, bank_ref: str, model_id: str) -> list[HistoryEntry]:
        """The model's earlier contents, newest first."""
        ...

    def knowledge_folders(self, bank_ref: str) -> list[KnowledgeFolder]:
        """Every folder of the bank's knowledge base, oldest first (then by id)."""
        ...

    def write_knowledge_rows(
        self,
        bank_ref: str,
        folders: Sequence[KnowledgeFolder],
        models: Sequence[MentalModelRow],
    ) -> int:
        """A transfer's write: insert *folders* and *models* (with their history) into the
        bank as they are, timestamps included, in one transaction; how many nodes. The
        caller checked the tree (:func:`heed.transfer.check.check_knowledge`); an id taken
        already fails the write (nothing written)."""
        ...

    def create_knowledge_folder(self, folder: KnowledgeFolder, limit: int) -> KnowledgeFolder:
        """Insert *folder* (timestamps set now); refuses a bank already holding *limit*
        folders (:class:`~heed.memory.models.InvalidInput`)."""
        ...

    def update_knowledge_folder(
        self, bank_ref: str, folder_id: str, changes: dict[str, Any]
    ) -> KnowledgeFolder | None:
        """Rename (``name``) or move (``parent_id``, ``None``: the root) a folder; a move
        under itself or its own subtree is :class:`~heed.memory.models.InvalidInput`.
        ``None`` when the bank has no such folder."""
        ...

    def delete_knowledge_node(self, bank_ref: str, node_id: str) -> list[str] | None:
        """Delete a folder with everything under it, or a page: the ids of the models
        (pages) deleted; ``None`` when the bank has no such node."""
        ...
