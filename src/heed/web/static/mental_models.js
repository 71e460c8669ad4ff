// mental_models.js: the Mental models tab of a bank: named questions whose answers heed writes
// (with a reflect) and keeps fresh. Create one, Refresh it while watching the refresh run's
// journal live, Stop it (the content stays as it was), read its earlier contents.

import { mentalModels as api } from "./api.js";
import { EVENT } from "./events.js";
import { RunProgress, activeRuns } from "./progress.js";
import { FormListSection, askFirst, clear, describeError, factItem, formatTime, h, setStatus } from "./ui.js";

const REFRESH_KIND = "mental_model_refresh";

/** The line shown when a refresh completed, from its result's outcome. */
export function refreshSummary(result = {}) {
  switch (result.outcome) {
    case "content_written":
      return "Refreshed: new content written.";
    case "content_unchanged":
      return "Refreshed: the answer is the same as before.";
    case "refresh_failed_empty_candidate":
      return "Refresh gave no answer: the content is unchanged.";
    default:
      return "Refresh completed.";
  }
}

function laterThan(a, b) {
  if (!a) return false;
  if (!b) return true;
  return new Date(a).getTime() > new Date(b).getTime();
}

/** One mental model in the list: its content, Refresh with its progress and Stop, history. */
class ModelView {
  constructor(section, model) {
    this.section = section;
    this.id = model.id;
    this.model = model;
    this.name = h("h4", { class: "mm-name" });
    this.query = h("p", { class: "mm-query" });
    this.meta = h("div", { class: "fact-meta mm-meta" });
    this.content = h("div", { class: "answer mm-content", "aria-live": "polite" });
    this.refreshButton = h("button", { type: "button", class: "secondary mm-refresh", onclick: () => this.refresh() }, "Refresh");
    this.progress = new RunProgress({
      label: "Refresh",
      summarize: refreshSummary,
      stoppedNote: "The content is unchanged.",
      onSettled: (event) => this.settled(event),
    });
    this.historyList = h("ol", { class: "facts nested mm-history-list" });
    this.historyState = h("p", { class: "form-status", role: "status" });
    this.history = h("details", { class: "history mm-history" }, h("summary", {}, "History"), this.historyState, this.historyList);
    this.history.addEventListener("toggle", () => {
      if (this.history.open) this.loadHistory();
    });
    this.remove = askFirst({
      label: "Delete",
      ariaLabel: `delete ${model.name}`,
      question: `Delete “${model.name}” and its history?`,
      onConfirm: () => this.section.remove(this),
    });
    this.el = h(
      "li",
      { class: "mental-model", dataset: { id: model.id } },
      h("div", { class: "mm-header" }, this.name, h("div", { class: "row mm-actions" }, this.refreshButton, this.remove)),
      this.query,
      this.meta,
      this.content,
      this.progress.el,
      this.history,
    );
    this.update(model);
  }

  update(model) {
    this.model = model;
    this.name.textContent = model.name;
    this.refreshButton.setAttribute("aria-label", `refresh ${model.name}`);
    this.query.textContent = model.source_query ? `Question: ${model.source_query}` : "";
    const failed = laterThan(model.last_refresh_failed_at, model.last_refreshed_at);
    clear(this.meta).append(
      ...[
        model.is_knowledge_page ? h("span", { class: "tag" }, "knowledge page") : null,
        model.last_refreshed_at ? h("span", {}, `refreshed ${formatTime(model.last_refreshed_at)}`) : h("span", {}, "never refreshed"),
        model.is_stale ? h("span", { class: "tag warn-tag" }, "stale") : null,
        failed ? h("span", { class: "tag warn-tag" }, `last refresh failed ${formatTime(model.last_refresh_failed_at)}`) : null,
        ...(model.tags ?? []).map((tag) => h("span", { class: "tag muted-tag" }, tag)),
      ].filter(Boolean),
    );
    const text = model.content ?? "";
    this.content.textContent = text || "No content yet: a refresh writes it.";
    this.content.classList.toggle("empty", !text);
    this.el.dataset.empty = text ? "false" : "true";
  }

  follow(runId, phase = "running") {
    this.refreshButton.disabled = true;
    this.progress.follow(runId, { phase });
  }

  async refresh() {
    if (this.progress.running) return;
    const bankId = this.section.bankId;
    this.refreshButton.disabled = true;
    this.progress.note("Starting a refresh…", "pending");
    try {
      const body = await api.refresh(bankId, this.id);
      if (bankId !== this.section.bankId) return;
      this.follow(body.operation_id);
      if (body.deduplicated) this.progress.note("A refresh was already running: following it.", "pending");
    } catch (error) {
      this.refreshButton.disabled = this.progress.running;
      // 409: sooner than the model's minimum refresh interval (the detail says when to retry)
      this.progress.note(error.status === 409 ? `Not yet: ${error.detail}` : describeError(error), "error");
    }
  }

  async settled(event) {
    this.refreshButton.disabled = false;
    const bankId = this.section.bankId;
    try {
      const model = await api.get(bankId, this.id);
      if (bankId !== this.section.bankId) return;
      this.update(model);
      if (event?.type === EVENT.COMPLETED && this.history.open) this.loadHistory();
    } catch (error) {
      if (error.status === 404) this.section.load(); // deleted meanwhile
    }
  }

  async loadHistory() {
    const bankId = this.section.bankId;
    setStatus(this.historyState, "Loading…", "pending");
    try {
      const entries = await api.history(bankId, this.id);
      clear(this.historyList);
      for (const entry of entries ?? []) {
        this.historyList.append(
          factItem({ class: "version", dataset: { version: String(entry.version) } }, entry.previous_content || "(empty)", [
            h("span", { class: "tag" }, entry.reason || "changed"),
            entry.changed_at ? h("span", {}, `replaced ${formatTime(entry.changed_at)}`) : null,
          ]),
        );
      }
      setStatus(this.historyState, entries?.length ? "" : "No earlier contents yet.", "");
    } catch (error) {
      setStatus(this.historyState, describeError(error), "error");
    }
  }

  close() {
    this.progress.close();
  }
}

/** The mental models tab: setBank(id), load(), close(). */
export class MentalModelsSection extends FormListSection {
  constructor() {
    super();
    this.views = new Map(); // model id -> ModelView
  }

  build() {
    this.queryInput = h("textarea", {
      id: "mm-query",
      name: "source_query",
      rows: 2,
      required: true,
      placeholder: "The question whose answer this model keeps, e.g. “What pets does Alice have?”",
    });
    const fields = [
      ...this.nameField("mm", "e.g. Alice's pets"),
      h("label", { for: "mm-query" }, "Source query"),
      this.queryInput,
    ];
    this.mount({
      formTitle: "New mental model",
      hint: "heed answers the question from the bank's memories and keeps the answer as the model's content; Refresh asks again.",
      formName: "mm",
      fields,
      listTitle: "Mental models",
      name: "mental-model",
      listClass: "mental-models",
      listLabel: "mental models",
    });
  }

  forget() {
    for (const view of this.views.values()) view.close();
    this.views.clear();
  }

  close() {
    for (const view of this.views.values()) view.close();
  }

  /** The models (views kept, so a refresh being followed keeps its progress), then the
   * refreshes running in this bank, followed live. */
  async load() {
    const bankId = this.bankId;
    if (!bankId) return;
    let items;
    try {
      const body = await api.list(bankId);
      if (bankId !== this.bankId) return;
      items = body?.items ?? [];
      this.count.textContent = `${items.length} ${items.length === 1 ? "mental model" : "mental models"}`;
      setStatus(this.statusEl, items.length ? "" : "No mental models yet: create one.", "");
    } catch (error) {
      if (bankId !== this.bankId) return;
      setStatus(this.statusEl, describeError(error), "error");
      return;
    }
    const seen = new Set();
    for (const model of items) {
      seen.add(model.id);
      let view = this.views.get(model.id);
      if (view) view.update(model);
      else this.views.set(model.id, (view = new ModelView(this, model)));
      this.list.append(view.el); // in the server's order (moves an existing element)
    }
    for (const [id, view] of this.views) {
      if (seen.has(id)) continue;
      view.close();
      view.el.remove();
      this.views.delete(id);
    }
    await this.attach();
  }

  async attach() {
    for (const view of this.views.values()) {
      if (view.progress.resume()) view.refreshButton.disabled = true;
    }
    const bankId = this.bankId;
    try {
      const running = await activeRuns(REFRESH_KIND, bankId);
      if (bankId !== this.bankId) return;
      for (const run of running) {
        const view = this.views.get(run.summary?.mental_model_id);
        if (view && !view.progress.running) view.follow(run.id, run.phase);
      }
    } catch {
      // no run listing: a refresh started elsewhere is not shown live; the content still is
    }
  }

  async create(event) {
    event.preventDefault();
    const name = this.nameInput.value.trim();
    const source_query = this.queryInput.value.trim();
    if (!name || !source_query) return setStatus(this.formStatus, "Give it a name and a question.", "error");
    await this.createWith(
      (bankId) => api.create(bankId, { name, source_query }),
      [this.nameInput, this.queryInput],
      `Created “${name}”: its first refresh is running.`,
      (body) => {
        const view = this.views.get(body.mental_model_id);
        if (view && body.operation_id) view.follow(body.operation_id);
      },
    );
  }

  async remove(view) {
    await this.removeWith(
      (bankId) => api.remove(bankId, view.id),
      view.model.name,
      () => {
        view.close();
        view.el.remove();
        this.views.delete(view.id);
      },
    );
  }
}
