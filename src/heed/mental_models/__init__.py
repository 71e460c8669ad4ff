"""Mental models and the knowledge base, above reflect (a refresh is a reflect).

- :mod:`heed.mental_models.refresh`: the ``mental_model_refresh`` run (cancellable,
  journaled, leased, a minimum interval, background slots) and the dry run;
- :mod:`heed.mental_models.triggers`: refreshes after retains and consolidations;
- :mod:`heed.mental_models.service`: a bank's models and their rules;
- :mod:`heed.mental_models.knowledge`: folders, pages, the tree, search and export.

The values, the store protocol and reflect's lookup are the memory layer's
(:mod:`heed.memory.mental_models`).
"""

from heed.mental_models.knowledge import KnowledgeBase, Node
from heed.mental_models.refresh import (
    MENTAL_MODEL_REFRESH_KIND,
    MentalModelRefreshes,
    RefreshLimits,
    RefreshTooSoon,
)
from heed.mental_models.service import MentalModels
from heed.mental_models.triggers import RefreshTriggers

__all__ = [
    "MENTAL_MODEL_REFRESH_KIND",
    "KnowledgeBase",
    "MentalModelRefreshes",
    "MentalModels",
    "Node",
    "RefreshLimits",
    "RefreshTooSoon",
    "RefreshTriggers",
]
