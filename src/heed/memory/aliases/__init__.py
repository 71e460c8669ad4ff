"""Bank aliases: extra ids a bank answers to.

An alias is a second name for a bank within its tenant: every route that takes a bank id
takes an alias too (the store resolves one when no bank has the id), so callers move onto
a new id in phases while the old one keeps working. Nothing is copied: the bank keeps its
own ``bank_id``, which every response, export and log goes on using. One alias may be
**primary**, shown in the bank list as ``display_alias`` (display only). ``rules`` says
what an alias may be, ``service`` runs the routes, ``store`` is its storage protocol.
"""

from heed.memory.aliases.service import BankAliases
from heed.memory.aliases.store import AliasStore, BankAlias

__all__ = ["AliasStore", "BankAlias", "BankAliases"]
