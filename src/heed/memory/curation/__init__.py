"""Curation: a client corrects what heed remembers.

A fact (``world`` / ``experience``) is **edited** (text, context, dates, type, entities:
embedded again, its old text kept in its history), **invalidated** (moved out of recall's
reach, reversibly) or **reverted**; a bank's memories are **cleared**, all or of one type.
Observations are derived, so they are never curated directly: an edit, invalidation or
delete of a fact removes the observations citing it and queues their other sources for
consolidation again (:mod:`heed.storage.memory.curation`), and the bank's mental models
become stale. ``rules`` checks an edit, ``service`` runs it, ``store`` is its storage
protocol.
"""

from heed.memory.curation.rules import MemoryEdit
from heed.memory.curation.service import MemoryCuration

__all__ = ["MemoryCuration", "MemoryEdit"]
