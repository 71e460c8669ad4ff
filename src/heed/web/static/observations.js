// observations.js: the Observations tab of a bank: what consolidation learned (text, proof count,
// its sources and its earlier versions on demand), and Consolidate with its live progress and Stop.

import { observations as api } from "./api.js";
import { RunProgress, activeRuns } from "./progress.js";
import { askFirst, card, clear, describeError, factItem, formatTime, h, setStatus, shorten } from "./ui.js";

const PAGE = 50;
const MAX_SOURCES = 50; // sources fetched when a list of them is opened
const CONSOLIDATION_KIND = "consolidation";
const RELOAD_EVERY_MS = 1000; // the list's refresh while a consolidation runs

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** The line shown when a consolidation completed, from its result. */
export function consolidationSummary(result = {}) {
  const facts = result.facts_consolidated ?? 0;
  if (!result.rounds && !facts && !result.facts_failed) return "Consolidation completed: no memory was waiting.";
  const changes = [
    [result.observations_created, "created"],
    [result.observations_updated, "updated"],
    [result.observations_merged, "merged"],
  ]
    .filter(([n]) => n)
    .map(([n, what]) => `${plural(n, "observation")} ${what}`);
  const failed = result.facts_failed ? `; ${plural(result.facts_failed, "fact")} failed` : "";
  const what = changes.length ? changes.join(", ") : "no observation changed";
  return `Consolidation completed: ${plural(facts, "fact")} consolidated, ${what}${failed}.`;
}

function sourceView(unit) {
  if (unit.error) {
    return h("li", { class: "fact source missing", dataset: { id: unit.id } }, h("span", { class: "muted" }, `${unit.id}: ${unit.error}`));
  }
  const when = unit.occurred_start || unit.mentioned_at || unit.date;
  return factItem({ class: "fact source", dataset: { id: unit.id } }, unit.text ?? "", [
    unit.fact_type ? h("span", { class: "tag" }, unit.fact_type) : null,
    when ? h("span", {}, formatTime(when)) : null,
    unit.context ? h("span", {}, shorten(unit.context, 40)) : null,
  ]);
}

function versionView(version) {
  return factItem({ class: "version" }, version.text ?? "", [
    version.reason ? h("span", { class: "tag" }, version.reason) : null,
    typeof version.proof_count === "number" ? h("span", {}, `proof count ${version.proof_count}`) : null,
    version.changed_at ? h("span", {}, `until ${formatTime(version.changed_at)}`) : null,
  ]);
}

/** A list inside <details> read when first opened: load() -> [elements], or throws. */
function lazyDetails(className, summary, load) {
  const list = h("ol", { class: "facts nested" });
  const state = h("p", { class: "form-status", role: "status" });
  let loaded = false;
  const details = h("details", { class: className }, h("summary", {}, summary), state, list);
  details.addEventListener("toggle", async () => {
    if (!details.open || loaded) return;
    loaded = true;
    setStatus(state, "Loading…", "pending");
    try {
      const items = await load();
      clear(list).append(...items);
      setStatus(state, items.length ? "" : "Nothing here.", "");
    } catch (error) {
      loaded = false;
      setStatus(state, describeError(error), "error");
    }
  });
  return details;
}

/** The observations tab: setBank(id), load(), close(). */
export class ObservationsSection {
  constructor() {
    this.bankId = null;
    this.offset = 0;
    this.reloadTimer = null;
    this.build();
  }

  build() {
    this.count = h("span", { id: "observation-count", class: "muted" });
    this.consolidateButton = h(
      "button",
      { type: "button", id: "consolidate", title: "Turn the memories waiting into observations now", onclick: () => this.consolidate() },
      "Consolidate",
    );
    this.progress = new RunProgress({
      label: "Consolidation",
      id: "consolidation-progress",
      summarize: consolidationSummary,
      stoppedNote: "Its memories that were not consolidated stay waiting.",
      onProgress: () => this.reloadSoon(), // each round: what it wrote shows while it runs
      onSettled: () => {
        this.consolidateButton.disabled = false;
        this.loadList(true);
      },
    });
    this.statusEl = h("p", { class: "form-status", role: "status", id: "observation-status" });
    this.list = h("ol", { class: "facts observations", id: "observation-list", "aria-label": "observations" });
    this.more = h("button", { type: "button", class: "secondary", hidden: true, onclick: () => this.loadList(false) }, "Load more");
    const clearAll = askFirst({
      label: "Delete all",
      ariaLabel: "delete all observations",
      question: "Delete every observation? Their memories are consolidated again.",
      confirmLabel: "Delete all",
      onConfirm: () => this.clearAll(),
    });
    const header = h(
      "div",
      { class: "row" },
      this.count,
      h("span", { class: "spacer" }),
      h("button", { type: "button", class: "secondary", onclick: () => this.loadList(true) }, "Refresh"),
      clearAll,
      this.consolidateButton,
    );
    this.el = card(
      "Observations",
      h(
        "p",
        { class: "muted hint" },
        "Beliefs consolidated from the bank's memories, each resting on the facts that prove it. " +
          "A bank that keeps observations consolidates after each retain; Consolidate starts one now.",
      ),
      header,
      this.progress.el,
      this.statusEl,
      this.list,
      this.more,
    );
  }

  setBank(bankId) {
    if (bankId === this.bankId) return;
    this.bankId = bankId;
    this.offset = 0;
    this.progress.reset();
    this.consolidateButton.disabled = false;
    clear(this.list);
    this.count.textContent = "";
    this.more.hidden = true;
    setStatus(this.statusEl, "");
  }

  /** The list, and the consolidation running in this bank (followed live). */
  async load() {
    if (!this.bankId) return;
    await Promise.all([this.loadList(true), this.attach()]);
  }

  close() {
    this.progress.close();
  }

  async attach() {
    if (this.progress.resume()) this.consolidateButton.disabled = true;
    if (this.progress.running) return;
    const bankId = this.bankId;
    try {
      const [run] = await activeRuns(CONSOLIDATION_KIND, bankId);
      if (run && bankId === this.bankId && !this.progress.running) this.follow(run.id, run.phase);
    } catch {
      // no run listing: a consolidation started elsewhere is not shown, the list still is
    }
  }

  follow(runId, phase = "running") {
    this.consolidateButton.disabled = true;
    this.progress.follow(runId, { phase });
  }

  /** Reload the list at most once a second (a long consolidation reports every round). */
  reloadSoon() {
    if (this.reloadTimer) return;
    this.reloadTimer = setTimeout(() => {
      this.reloadTimer = null;
      this.loadList(true);
    }, RELOAD_EVERY_MS);
  }

  async loadList(reset) {
    const bankId = this.bankId;
    if (!bankId) return;
    const offset = reset ? 0 : this.offset;
    try {
      const body = await api.list(bankId, { limit: PAGE, offset });
      if (bankId !== this.bankId) return;
      const items = body?.items ?? [];
      // A reload keeps what the reader opened (a list's refresh while a consolidation runs).
      const opened = new Set(
        [...this.list.querySelectorAll("li.observation details[open]")].map((d) => `${d.closest("li").dataset.id} ${d.className}`),
      );
      if (reset) clear(this.list);
      for (const item of items) {
        const li = this.view(item);
        this.list.append(li);
        for (const details of li.querySelectorAll(":scope > details")) {
          if (opened.has(`${li.dataset.id} ${details.className}`)) details.open = true;
        }
      }
      this.offset = offset + items.length;
      const total = body?.total ?? this.offset;
      this.count.textContent = plural(total, "observation");
      this.more.hidden = this.offset >= total;
      setStatus(
        this.statusEl,
        total ? "" : "No observations yet: consolidation writes them from the memories (when the bank keeps observations).",
      );
    } catch (error) {
      if (bankId !== this.bankId) return;
      if (reset) clear(this.list);
      this.count.textContent = "";
      setStatus(this.statusEl, describeError(error), "error");
    }
  }

  view(observation) {
    const sources = Array.isArray(observation.source_memory_ids) ? observation.source_memory_ids : [];
    const proof = observation.proof_count ?? sources.length;
    const bankId = this.bankId;
    return factItem(
      { class: "fact observation", dataset: { id: observation.id ?? "" } },
      observation.text ?? "",
      [
        h("span", { class: "tag proof-count", title: "how many facts prove it" }, `proof count ${proof}`),
        observation.updated_at ? h("span", {}, `updated ${formatTime(observation.updated_at)}`) : null,
        ...(observation.tags ?? []).map((tag) => h("span", { class: "tag muted-tag" }, tag)),
      ],
      sources.length
        ? lazyDetails("sources", `Sources (${sources.length})`, async () => {
            const ids = sources.slice(0, MAX_SOURCES);
            const units = await Promise.all(
              ids.map((id) =>
                api.memory(bankId, id).catch((error) => ({ id, error: error.status === 404 ? "deleted" : describeError(error) })),
              ),
            );
            const shown = units.map(sourceView);
            if (sources.length > ids.length) shown.push(h("li", { class: "muted" }, `and ${sources.length - ids.length} more`));
            return shown;
          })
        : null,
      lazyDetails("history", "History", async () => {
        const body = await api.history(bankId, observation.id);
        return [...(body?.history ?? [])].reverse().map(versionView); // newest first
      }),
    );
  }

  async consolidate() {
    if (!this.bankId || this.progress.running) return;
    const bankId = this.bankId;
    this.consolidateButton.disabled = true;
    setStatus(this.statusEl, "Starting a consolidation…", "pending");
    try {
      const body = await api.consolidate(bankId);
      if (bankId !== this.bankId) return;
      if (!body?.operation_id) {
        this.consolidateButton.disabled = false;
        setStatus(this.statusEl, "No consolidation started: nothing is waiting.", "");
        return;
      }
      setStatus(this.statusEl, body.deduplicated ? "A consolidation was already running: following it." : "", "");
      this.follow(body.operation_id);
    } catch (error) {
      this.consolidateButton.disabled = this.progress.running;
      setStatus(this.statusEl, describeError(error), "error");
    }
  }

  async clearAll() {
    const bankId = this.bankId;
    try {
      const body = await api.clear(bankId);
      if (bankId !== this.bankId) return;
      await this.loadList(true);
      setStatus(this.statusEl, `Deleted ${plural(body?.deleted_count ?? 0, "observation")}.`, "ok");
    } catch (error) {
      setStatus(this.statusEl, describeError(error), "error");
    }
  }
}
