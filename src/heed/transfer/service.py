"""Bank transfer: export a bank (or some of its documents) as an archive, import an archive
as a new bank (or merge its documents into a bank), clone a bank: what is asked, checked
and served. Each is a run of the bank's operations, cancellable while it processes, with
progress: how they run is :mod:`heed.transfer.runs`; what an archive holds is
docs/bank-archive.md (:mod:`heed.transfer.archive`, :mod:`heed.transfer.sections`).

:class:`BankTransfers` checks a request's options before anything is read; checks an
uploaded archive whole, in a child process within :attr:`TransferLimits.check`, before
anything is stored (:func:`heed.transfer.check.check_archive_file`: a bad archive is a 400
naming the problem); stores it and queues its import; refuses an export past the tenant's
quota (:class:`~heed.transfer.limits.ExportQuotaExceeded`, 429) unless the bank has a
stored export with the same parameters (it may be reused); and serves the exported
archives, a part at a time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from heed.memory.bank_runs import bank_session
from heed.memory.engine import MemoryEngine, is_bank_id
from heed.memory.models import Bank, Conflict, InvalidInput, NotFound
from heed.mental_models.store import MentalModelStore
from heed.runs.kinds import KindSpec
from heed.runs.manager import RunManager
from heed.runs.model import Run
from heed.runtime import (
    ChildFd,
    WorkerLimitExceeded,
    current_context,
    detached,
    run_in_process,
    run_in_thread,
    use_context,
)
from heed.transfer.check import ArchiveCheck, check_archive_file
from heed.transfer.limits import ArchiveTooLarge, ExportQuotaExceeded, TransferLimits, export_key
from heed.transfer.runs import CLONE_KIND, EXPORT_KIND, IMPORT_KIND, TransferRuns
from heed.transfer.sections.bank import bank_settings
from heed.transfer.sections.base import TransferStores
from heed.transfer.store import ArchiveStore, StoredArchive, TransferStore, file_parts
from heed.transfer.work import CONFLICTS
from heed.webhooks.service import Webhooks

__all__ = ["BankTransfers", "ImportOptions"]


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """An import's options as its request gives them (``None``: the mode's default); what
    each means and which mode takes it: :meth:`BankTransfers.submit_import`."""

    target_bank_id: str | None = None
    mode: str | None = None
    document_conflict: str | None = None
    include_data: bool | None = None
    include_bank_config: bool | None = None
    include_history: bool = False


class BankTransfers:
    """Submits and serves bank transfers (see the module docstring); its :attr:`runs`
    (:class:`~heed.transfer.runs.TransferRuns`) runs them. A bank's rows are read and
    written in *rows*, its mental models and knowledge base in *knowledge*, its webhooks
    through *webhooks* (a part given ``None`` is not carried); built with all of them,
    nothing is wired later."""

    def __init__(
        self,
        manager: RunManager,
        engine: MemoryEngine,
        archives: ArchiveStore,
        rows: TransferStore,
        model: str,
        limits: TransferLimits | None = None,
        *,
        knowledge: MentalModelStore | None = None,
        webhooks: Webhooks | None = None,
    ) -> None:
        self.manager = manager
        self.engine = engine
        self.archives = archives
        self.model = model
        self.limits = limits or TransferLimits()
        #: Everything a transfer reads and writes of a bank.
        self.stores = TransferStores(engine.store, rows, knowledge, webhooks)
        self.webhooks = webhooks
        self.runs = TransferRuns(manager, engine, archives, self.stores, model, self.limits)

    # -- submitting ----------------------------------------------------------------------

    @staticmethod
    def _refuse_history(include_history: bool) -> None:
        if include_history:
            raise InvalidInput(
                "include_history: heed keeps no audit log or LLM request log to carry "
                "(send false or leave it out)"
            )

    async def _new_bank_id(self, bank_id: str, what: str) -> None:
        if not is_bank_id(bank_id):
            raise InvalidInput(
                f"invalid {what} {bank_id!r}: use 1-128 letters, digits, '.', '_', ':', '@' or '-'"
            )
        if await self.engine.find_bank(bank_id) is not None:
            raise Conflict(
                f"bank {bank_id!r} exists: a transfer restores a whole bank into a new one "
                "(choose another id, or delete that bank first)"
            )

    async def _submit(
        self, kind: str, bank: Bank, payload: dict[str, Any], summary: dict[str, Any]
    ) -> Run:
        run = await self.manager.submit(
            kind,
            tenant=bank.tenant,
            session_id=bank_session(bank),
            payload={"bank_id": bank.bank_id, "bank_ref": bank.ref, **payload},
            summary={"bank_id": bank.bank_id, **summary},
        )
        assert run is not None
        return run

    async def submit_export(
        self,
        bank: Bank,
        *,
        include_data: bool = True,
        include_bank_config: bool = True,
        include_history: bool = False,
        document_ids: Sequence[str] | None = None,
        documents_only: bool = False,
        include_observations: bool = True,
        include_knowledge_base: bool = False,
    ) -> Run:
        """Queue an export of *bank* (its documents *document_ids* only, when given: an
        archive of ``documents`` scope, without the bank's profile or observations; the
        same with *documents_only*, observations when *include_observations*)."""
        self._refuse_history(include_history)
        if include_knowledge_base and document_ids is not None:
            raise InvalidInput(
                "include_knowledge_base: mental models and knowledge pages travel with a "
                "whole bank's documents (leave document_id out)"
            )
        ids = list(dict.fromkeys(document_ids)) if document_ids is not None else None
        if ids is not None:
            if not ids:
                raise InvalidInput("document_id: name at least one document, or leave it out")
            if len(ids) > self.limits.max_document_ids:
                raise InvalidInput(
                    f"document_id: {len(ids)} ids; the limit is {self.limits.max_document_ids}"
                )
            for document_id in ids:
                if not document_id or "\x00" in document_id or len(document_id) > 512:
                    raise InvalidInput(f"document_id {document_id[:100]!r} is not a document id")
        scope = "documents" if ids is not None or documents_only else "bank"
        payload = {
            "scope": scope,
            "document_ids": ids,
            "include_observations": include_observations and ids is None,
            "include_data": include_data,
            "include_bank_config": include_bank_config,
            "include_knowledge_base": include_knowledge_base,
        }
        await self._check_export_quota(bank, payload)
        return await self._submit(EXPORT_KIND, bank, payload, {"scope": scope})

    async def _check_export_quota(self, bank: Bank, payload: dict[str, Any]) -> None:
        """Refuse an export when the tenant's stored exports are at the quota, unless the
        bank has a stored export with the same parameters (the run may reuse it)."""
        quota = self.limits.export_quota
        if quota is None:
            return
        now = time.time()
        usage = await run_in_thread(self.archives.export_usage, bank.tenant, now)
        if not usage.full(quota):
            return
        params = export_key(
            {"bank_id": bank.bank_id, **payload}, self.model, self.engine.embedder.dim
        )
        earlier = await run_in_thread(self.archives.bank_exports, bank.tenant, bank.bank_id, now)
        if not any((a.reuse_key or "").startswith(params + ":") for a in earlier):
            raise ExportQuotaExceeded(usage, quota)

    async def submit_clone(
        self,
        bank: Bank,
        target_bank_id: str,
        *,
        include_data: bool = True,
        include_bank_config: bool = True,
        include_history: bool = False,
    ) -> Run:
        """Queue a clone of *bank* as the new bank *target_bank_id*."""
        self._refuse_history(include_history)
        await self._new_bank_id(target_bank_id, "target_bank_id")
        payload = {
            "target_bank_id": target_bank_id,
            "include_data": include_data,
            "include_bank_config": include_bank_config,
        }
        return await self._submit(CLONE_KIND, bank, payload, {"target_bank_id": target_bank_id})

    async def check_import(self, bank: Bank, options: ImportOptions) -> None:
        """What an import's request must pass before its archive is read (the route runs it
        before the upload's body is read; :meth:`submit_import` runs it again): the mode
        and the options it takes, and a named ``target_bank_id`` that must not exist.
        Raises :class:`InvalidInput` (400) or :class:`Conflict` (409)."""
        self._refuse_history(options.include_history)
        if options.mode not in (None, "restore", "merge"):
            raise InvalidInput(f"mode {options.mode!r} is neither 'restore' nor 'merge'")
        if options.mode == "merge":
            self._merge_conflict(bank, options)
            return
        if options.document_conflict is not None:
            raise InvalidInput("document_conflict applies to mode=merge")
        if options.target_bank_id is not None:
            await self._new_bank_id(options.target_bank_id, "target_bank_id")

    async def submit_import(
        self,
        bank: Bank,
        archive: IO[bytes],
        filename: str | None,
        options: ImportOptions,
    ) -> Run:
        """Check *archive* (a seekable binary file: the upload) whole
        (:class:`InvalidArchive`, 400, naming the problem: nothing stored), store it and
        queue its import, recorded as an operation of *bank*, by *options*: into the new
        bank ``target_bank_id`` (default: the archive's source bank id; ``mode``
        ``restore``, the default), or its documents into *bank* itself (``mode`` ``merge``,
        by ``document_conflict``: :data:`~heed.transfer.work.CONFLICTS`). The options are
        checked first (:meth:`check_import`)."""
        await self.check_import(bank, options)
        if options.mode == "merge":
            conflict = options.document_conflict or "skip"
            await self._check_upload(archive, False)
            return await self._submit_upload(
                bank, archive, filename, {"document_conflict": conflict}, mode="merge"
            )
        include_data = True if options.include_data is None else options.include_data
        include_bank_config = (
            True if options.include_bank_config is None else options.include_bank_config
        )
        check = await self._check_upload(archive, include_bank_config)
        target = options.target_bank_id or check.manifest.source_bank_id
        await self._new_bank_id(target, "target_bank_id")
        payload = {"include_data": include_data, "include_bank_config": include_bank_config}
        return await self._submit_upload(bank, archive, filename, payload, target_bank_id=target)

    @staticmethod
    def _merge_conflict(bank: Bank, options: ImportOptions) -> str:
        """A merge's options, checked (see :meth:`submit_import`); its conflict rule."""
        conflict = options.document_conflict or "skip"
        if conflict not in CONFLICTS:
            raise InvalidInput(
                f"document_conflict {conflict!r} is not one of {', '.join(CONFLICTS)}"
            )
        if options.target_bank_id is not None and options.target_bank_id != bank.bank_id:
            raise InvalidInput(
                "target_bank_id applies to mode=restore; a merge folds the archive into "
                f"bank {bank.bank_id!r}, the bank of the request"
            )
        if options.include_data is False:
            raise InvalidInput("include_data=false: a merge folds the archive's documents")
        if options.include_bank_config:
            raise InvalidInput(
                "include_bank_config: a merge folds documents only; the bank's settings, "
                "directives, webhooks and mental models are not merged (leave it out)"
            )
        return conflict

    async def _submit_upload(
        self,
        bank: Bank,
        archive: IO[bytes],
        filename: str | None,
        payload: dict[str, Any],
        **summary: str,
    ) -> Run:
        """Store the checked upload *archive* and queue its import run (its *summary*
        fields go into the payload too); the stored upload is deleted if the submit
        fails."""
        row = self.runs.archive_row(bank, "upload", filename or "upload.zip")
        stored = await run_in_thread(self._store_upload, row, archive)
        summary["archive_id"] = stored.id
        try:
            return await self._submit(IMPORT_KIND, bank, payload | summary, summary)
        except BaseException:
            with use_context(detached()):
                await run_in_thread(self.archives.delete_archive, stored.id)
            raise

    async def _check_upload(self, archive: IO[bytes], include_bank_config: bool) -> ArchiveCheck:
        """Check an uploaded archive whole (:func:`check_archive_file`: the records, that
        this server's embedder made its vectors), then (when they are to be imported) that
        its webhooks are ones this server would accept, and its bank's settings.

        The check runs in a child process (:func:`heed.runtime.run_in_process`) handed the
        upload's open file, at a lower CPU priority and within
        :attr:`TransferLimits.check` (CPU seconds, memory): a large archive costs seconds
        of CPU in pure Python, which in the server would hold the interpreter's lock
        against every request, and whatever memory it took goes with the child. A retain
        slot is held around it as background work, so concurrent checks are bounded by
        the lane and yield to users' retains and recalls. A client that leaves kills it.
        Raises :class:`InvalidArchive` (400), or 413 past a limit."""
        archive.flush()
        fd = archive.fileno()  # a spooled upload still in memory goes to disk here
        async with self.engine.retain_lane.slot(background=True):
            try:
                check, webhooks = await run_in_process(
                    check_archive_file,
                    ChildFd(fd),
                    self.limits.archive,
                    self.model,
                    self.engine.embedder.dim,
                    include_bank_config and self.webhooks is not None,
                    limits=self.limits.check,
                )
            except WorkerLimitExceeded as exc:
                raise ArchiveTooLarge(exc.limit, self.limits.check) from None
        if webhooks and self.webhooks is not None:
            self.webhooks.check_carried(webhooks)
        if check.bank is not None:
            bank_settings(check.bank.config)
        return check

    def _store_upload(self, row: StoredArchive, archive: IO[bytes]) -> StoredArchive:
        archive.seek(0)
        try:
            return self.archives.put_archive(row, file_parts(archive))
        except BaseException:
            self.archives.delete_archive(row.id)  # a part-written upload is no archive
            raise

    # -- downloads -------------------------------------------------------------------------

    async def download(self, key: str) -> StoredArchive:
        """The current tenant's exported archive *key*; :class:`NotFound` otherwise."""
        tenant = current_context().tenant
        archive = await run_in_thread(self.archives.get_archive, tenant, key)
        if archive is None or archive.kind != "export":
            raise NotFound(f"file {key!r} not found")
        return archive

    async def archive_bytes(self, archive: StoredArchive) -> AsyncIterator[bytes]:
        """The archive's bytes, a part at a time (each read in the offload)."""
        parts = self.archives.archive_parts(archive.id)
        while True:
            part = await run_in_thread(next, parts, None)
            if part is None:
                return
            yield part

    # -- running (heed.transfer.runs) -------------------------------------------------------

    def kind_specs(self) -> dict[str, KindSpec]:
        """How transfer runs execute: register each under its kind."""
        return self.runs.kind_specs()

    async def sweep(self) -> int:
        """See :meth:`TransferRuns.sweep`."""
        return await self.runs.sweep()

    async def aclose(self) -> None:
        """Wait for the staging banks being deleted."""
        await self.runs.aclose()
