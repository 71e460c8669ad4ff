// memory.js: the memory page of a bank: banks, then tabs: Memories (retain, list, recall with its
// stage timings, reflect), Observations, Mental models and Directives (each in its own module).

import { memory } from "./api.js";
import { DirectivesSection } from "./directives.js";
import { EVENT, TERMINAL_EVENTS } from "./events.js";
import { MentalModelsSection } from "./mental_models.js";
import { ObservationsSection } from "./observations.js";
import { readSse } from "./stream.js";
import { card, clear, describeError, factItem, formatTime, h, setStatus as status, shorten } from "./ui.js";

const PAGE = 50;

/** The tabs of a bank, in order; the first is the default (#/memory/<bank>/<tab> picks one). */
export const TABS = Object.freeze([
  { name: "memories", label: "Memories" },
  { name: "observations", label: "Observations" },
  { name: "mental-models", label: "Mental models" },
  { name: "directives", label: "Directives" },
]);

/** The route of a bank's tab. */
export function bankHash(bankId, tab = TABS[0].name) {
  const base = `#/memory/${encodeURIComponent(bankId)}`;
  return tab && tab !== TABS[0].name ? `${base}/${tab}` : base;
}

/** Per-stage timings from a recall trace, as [{name, ms}] in pipeline order. */
export function stageTimings(trace) {
  if (!trace || typeof trace !== "object") return [];
  const ms = (entry) => {
    for (const key of ["ms", "duration_ms", "elapsed_ms", "time_ms"]) {
      if (typeof entry[key] === "number") return entry[key];
    }
    for (const key of ["seconds", "duration_s", "elapsed_s", "duration"]) {
      if (typeof entry[key] === "number") return entry[key] * 1000;
    }
    return null;
  };
  const fromList = (list) =>
    list
      .filter((e) => e && typeof e === "object")
      .map((e) => ({ name: String(e.name ?? e.stage ?? "?"), ms: ms(e), count: e.candidates ?? e.count }))
      .filter((e) => e.ms !== null);
  if (Array.isArray(trace.stages)) return fromList(trace.stages);
  for (const key of ["stage_ms", "timings_ms", "timings", "durations_ms", "stages_ms"]) {
    const table = trace[key];
    if (table && typeof table === "object" && !Array.isArray(table)) {
      return Object.entries(table)
        .filter(([, v]) => typeof v === "number" || (v && typeof v === "object"))
        .map(([name, v]) => ({ name, ms: typeof v === "number" ? v : ms(v) }))
        .filter((e) => e.ms !== null);
    }
  }
  if (trace.stages && typeof trace.stages === "object") {
    return Object.entries(trace.stages)
      .map(([name, v]) => ({ name, ms: typeof v === "number" ? v : ms(v ?? {}), count: v?.candidates }))
      .filter((e) => e.ms !== null);
  }
  return Object.entries(trace)
    .filter(([k, v]) => k.endsWith("_ms") && typeof v === "number" && !k.startsWith("total"))
    .map(([k, v]) => ({ name: k.slice(0, -3), ms: v }));
}

function totalMs(trace, stages) {
  for (const key of ["total_ms", "elapsed_ms", "duration_ms"]) {
    if (typeof trace?.[key] === "number") return trace[key];
  }
  return stages.reduce((sum, s) => sum + s.ms, 0);
}

/** A small horizontal bar chart of stage times (plain HTML, readable without colour). */
export function timingChart(trace) {
  const stages = stageTimings(trace);
  if (!stages.length) return h("p", { class: "muted" }, "No stage timings in the trace.");
  const max = Math.max(...stages.map((s) => s.ms), 0.001);
  const total = totalMs(trace, stages);
  return h(
    "figure",
    { class: "chart", "aria-label": "recall stage timings" },
    h("figcaption", {}, `Stage timings: ${total.toFixed(1)} ms in total`),
    h(
      "ul",
      { class: "bars" },
      stages.map((s) =>
        h(
          "li",
          { class: "bar-row", dataset: { stage: s.name } },
          h(
            "span",
            { class: "bar-label", title: s.count !== undefined ? `${s.count} candidates` : null },
            s.name.replaceAll("_", " "),
            s.count !== undefined ? h("span", { class: "muted" }, ` ${s.count}`) : null,
          ),
          h(
            "span",
            { class: "bar-track" },
            h("span", { class: "bar", style: `width: ${Math.max(1, (100 * s.ms) / max).toFixed(1)}%` }),
          ),
          h("span", { class: "bar-value" }, `${s.ms < 10 ? s.ms.toFixed(2) : s.ms.toFixed(1)} ms`),
        ),
      ),
    ),
  );
}

function factView(fact) {
  const when = fact.occurred_start || fact.mentioned_at || fact.date;
  const entities = Array.isArray(fact.entities) ? fact.entities.join(", ") : fact.entities;
  return factItem({ class: "fact", dataset: { id: fact.id ?? "" } }, fact.text ?? "", [
    fact.type || fact.fact_type ? h("span", { class: "tag" }, fact.type || fact.fact_type) : null,
    when ? h("span", {}, formatTime(when)) : null,
    entities ? h("span", {}, shorten(entities, 60)) : null,
    fact.context ? h("span", {}, shorten(fact.context, 40)) : null,
  ]);
}

/** The memory view: mount(root), show(bankId, tab), close(). */
export class MemoryPage {
  constructor(root, { navigate }) {
    this.root = root;
    this.navigate = navigate;
    this.bankId = null;
    this.tab = TABS[0].name;
    this.offset = 0;
    this.reflectAbort = null; // the AbortController of a streamed reflect in flight
    this.sections = {
      observations: new ObservationsSection(),
      "mental-models": new MentalModelsSection(),
      directives: new DirectivesSection(),
    };
    this.build();
  }

  build() {
    const bankForm = h(
      "form",
      { class: "bank-form", onsubmit: (e) => this.createBank(e) },
      h("label", { for: "bank-new" }, "New bank"),
      h("input", {
        id: "bank-new",
        name: "bank",
        placeholder: "bank id",
        pattern: "[A-Za-z0-9_.:\\-]+",
        required: true,
        autocomplete: "off",
      }),
      h("button", { type: "submit" }, "Create"),
    );
    this.bankList = h("ul", { class: "bank-list", id: "bank-list" });
    this.bankTitle = h("h2", { id: "bank-title" }, "Memory");
    this.bankMeta = h("p", { class: "muted", id: "bank-meta" });
    // The bank's LLM tokens by kind of work (its stats' llm_usage), shown once it has any.
    this.usageBody = h("tbody");
    this.usageTable = h(
      "table",
      { class: "usage-table", id: "bank-usage", hidden: true },
      h("caption", {}, "LLM tokens by kind of work (last 90 days)"),
      h(
        "thead",
        {},
        h("tr", {}, ...["kind", "calls", "prompt", "completion", "total"].map((c) => h("th", { scope: "col" }, c))),
      ),
      this.usageBody,
    );

    // retain
    this.retainText = h("textarea", {
      id: "retain-text",
      rows: 4,
      placeholder: "Text to remember, e.g. “Alice adopted a cat named Miso in March 2024.” (Ctrl+Enter)",
    });
    this.retainText.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        event.target.form.requestSubmit();
      }
    });
    this.retainContext = h("input", { id: "retain-context", placeholder: "context (optional)" });
    this.retainStatus = h("p", { class: "form-status", role: "status" });
    const retainForm = h(
      "form",
      { id: "retain-form", onsubmit: (e) => this.retain(e) },
      h("label", { for: "retain-text", class: "sr-only" }, "Text to retain"),
      this.retainText,
      h("label", { for: "retain-context", class: "sr-only" }, "Context"),
      h("div", { class: "row" }, this.retainContext, h("button", { type: "submit" }, "Retain")),
      this.retainStatus,
    );

    // recall
    this.recallQuery = h("input", { id: "recall-query", placeholder: "What do you want to find?" });
    this.recallBudget = h(
      "select",
      { id: "recall-budget", "aria-label": "budget" },
      ["low", "mid", "high"].map((b) => h("option", { value: b, selected: b === "mid" }, b)),
    );
    this.recallStatus = h("p", { class: "form-status", role: "status" });
    this.recallChart = h("div", { id: "recall-trace" });
    this.recallResults = h("ol", { class: "facts", id: "recall-results" });
    const recallForm = h(
      "form",
      { id: "recall-form", onsubmit: (e) => this.recall(e) },
      h("label", { for: "recall-query", class: "sr-only" }, "Recall query"),
      h("div", { class: "row" }, this.recallQuery, this.recallBudget, h("button", { type: "submit" }, "Recall")),
      this.recallStatus,
    );

    // reflect
    this.reflectQuery = h("input", { id: "reflect-query", placeholder: "Ask a question about this bank" });
    this.reflectStatus = h("p", { class: "form-status", role: "status" });
    this.reflectAnswer = h("div", { id: "reflect-answer", class: "answer", "aria-live": "polite" });
    this.reflectSteps = h("ol", { id: "reflect-steps", class: "steps" });
    this.reflectButton = h("button", { type: "submit", id: "reflect-submit" }, "Reflect");
    this.reflectFacts = h("ol", { class: "facts", id: "reflect-facts" });
    this.reflectUsed = h("h4", { class: "used", hidden: true }, "Memories used");
    const reflectForm = h(
      "form",
      { id: "reflect-form", onsubmit: (e) => this.reflect(e) },
      h("label", { for: "reflect-query", class: "sr-only" }, "Reflect question"),
      h("div", { class: "row" }, this.reflectQuery, this.reflectButton),
      this.reflectStatus,
    );

    // list
    this.listStatus = h("p", { class: "form-status", role: "status" });
    this.listItems = h("ol", { class: "facts", id: "memory-list" });
    this.listMore = h("button", { type: "button", hidden: true, onclick: () => this.loadList(false) }, "Load more");
    const listHeader = h(
      "div",
      { class: "row" },
      h("span", { id: "memory-count", class: "muted" }),
      h("button", { type: "button", class: "secondary", onclick: () => this.loadList(true) }, "Refresh"),
    );
    this.memoryCount = listHeader.querySelector("#memory-count");

    this.emptyHint = h("p", { class: "muted", id: "bank-empty" }, "Choose a bank, or create one.");
    const memoriesGrid = h(
      "div",
      { class: "memory-grid" },
      h(
        "div",
        { class: "memory-column" },
        card("Retain", retainForm),
        card("Memories", listHeader, this.listStatus, this.listItems, this.listMore),
      ),
      h(
        "div",
        { class: "memory-column" },
        card("Recall", recallForm, this.recallChart, this.recallResults),
        card("Reflect", reflectForm, this.reflectSteps, this.reflectAnswer, this.reflectUsed, this.reflectFacts),
      ),
    );
    this.panels = this.buildTabs({ memories: memoriesGrid });

    clear(this.root).append(
      h("aside", { class: "sidebar", id: "bank-sidebar", "aria-label": "banks" }, bankForm, this.bankList),
      h("section", { class: "content memory-content" }, this.bankTitle, this.bankMeta, this.usageTable, this.emptyHint, this.panels),
    );
  }

  /** The tab bar and one tab panel per tab (arrow keys move between tabs). */
  buildTabs(contents) {
    this.tabButtons = new Map();
    this.tabPanels = new Map();
    const bar = h("div", { class: "tabs", role: "tablist", "aria-label": "bank views", id: "bank-tabs" });
    const panels = [];
    for (const { name, label } of TABS) {
      const button = h(
        "button",
        {
          type: "button",
          role: "tab",
          id: `tab-${name}`,
          class: "tab",
          "aria-controls": `panel-${name}`,
          "aria-selected": "false",
          tabindex: "-1",
          dataset: { tab: name },
          onclick: () => this.selectTab(name),
        },
        label,
      );
      bar.append(button);
      this.tabButtons.set(name, button);
      const panel = h(
        "div",
        { role: "tabpanel", id: `panel-${name}`, class: "tab-panel", "aria-labelledby": `tab-${name}`, hidden: true },
        contents[name] ?? this.sections[name].el,
      );
      panels.push(panel);
      this.tabPanels.set(name, panel);
    }
    bar.addEventListener("keydown", (event) => {
      const names = TABS.map((t) => t.name);
      const at = names.indexOf(event.target.dataset?.tab);
      if (at < 0) return;
      const next = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: names.length - 1 }[event.key];
      if (next === undefined) return;
      event.preventDefault();
      const name = names[(next + names.length) % names.length];
      this.selectTab(name);
      this.tabButtons.get(name).focus();
    });
    return h("div", { class: "bank-panels", hidden: true }, bar, ...panels);
  }

  /** Show tab *name* (and load its section); the route follows without a new history entry. */
  selectTab(name, { updateRoute = true } = {}) {
    if (!this.tabButtons.has(name)) name = TABS[0].name;
    this.tab = name;
    for (const [tab, button] of this.tabButtons) {
      const current = tab === name;
      button.setAttribute("aria-selected", String(current));
      button.setAttribute("tabindex", current ? "0" : "-1");
      button.classList.toggle("current", current);
      this.tabPanels.get(tab).hidden = !current;
    }
    if (!this.bankId) return;
    if (updateRoute && location.hash !== bankHash(this.bankId, name)) {
      history.replaceState(null, "", bankHash(this.bankId, name));
    }
    for (const link of this.bankList.querySelectorAll("a[data-bank]")) {
      link.setAttribute("href", bankHash(link.dataset.bank, name));
    }
    this.sections[name]?.load();
  }

  /** "/" on the memory page: the recall query, or the current tab's first field. */
  focusInput() {
    const panel = this.tabPanels.get(this.tab);
    const field = this.tab === TABS[0].name ? this.recallQuery : panel?.querySelector("input, textarea");
    field?.focus();
  }

  /** Leaving the page: stop following runs (they go on; coming back attaches again). */
  close() {
    for (const section of Object.values(this.sections)) section.close();
  }

  /** A hidden browser tab holds no stream (docs/web-ui.md, rule 5); shown again, the current
   * tab reloads and attaches to what still runs. */
  setVisible(visible, { shown = true } = {}) {
    if (!visible) this.close();
    else if (shown && this.bankId) this.sections[this.tab]?.load();
  }

  async refreshBanks() {
    try {
      const body = await memory.listBanks();
      const banks = body?.banks ?? [];
      clear(this.bankList);
      for (const bank of banks) {
        const current = bank.bank_id === this.bankId;
        this.bankList.append(
          h(
            "li",
            {},
            h(
              "a",
              {
                href: bankHash(bank.bank_id, this.tab),
                class: current ? "current" : "",
                dataset: { bank: bank.bank_id },
                "aria-current": current ? "page" : null,
              },
              h("span", {}, bank.name || bank.bank_id),
              h("span", { class: "count" }, String(bank.fact_count ?? "")),
            ),
          ),
        );
      }
      if (!banks.length) this.bankList.append(h("li", { class: "muted" }, "No banks yet."));
      return banks;
    } catch (error) {
      clear(this.bankList).append(h("li", { class: "error" }, describeError(error)));
      return [];
    }
  }

  async show(bankId, tab = "") {
    this.bankId = bankId || null;
    for (const section of Object.values(this.sections)) section.setBank(this.bankId);
    this.panels.hidden = !this.bankId;
    this.emptyHint.hidden = Boolean(this.bankId);
    // Before any await: a tab chosen while the page loads is not overridden afterwards.
    this.selectTab(this.tabButtons.has(tab) ? tab : TABS[0].name, { updateRoute: false });
    await this.refreshBanks();
    if (!this.bankId) {
      this.bankTitle.textContent = "Memory";
      this.bankMeta.textContent = "";
      this.usageTable.hidden = true;
      return;
    }
    this.bankTitle.textContent = `Bank: ${this.bankId}`;
    try {
      const bank = await memory.getBank(this.bankId);
      const name = bank?.name && bank.name !== this.bankId ? bank.name : "";
      this.bankMeta.textContent = [name, bank?.mission].filter(Boolean).join(" · ");
    } catch (error) {
      this.bankMeta.textContent =
        error.status === 404 ? "This bank does not exist: create it with “New bank”." : describeError(error);
    }
    clear(this.recallResults);
    clear(this.recallChart);
    this.reflectAbort?.abort();
    clear(this.reflectSteps);
    clear(this.reflectAnswer);
    clear(this.reflectFacts);
    this.reflectUsed.hidden = true;
    await Promise.all([this.loadList(true), this.loadUsage()]);
  }

  /** The bank's LLM tokens by kind of work, from its stats; hidden while it has none. */
  async loadUsage() {
    const bankId = this.bankId;
    if (!bankId) return;
    let usage = null;
    try {
      usage = (await memory.stats(bankId))?.llm_usage ?? null;
    } catch {
      usage = null; // the bank's meta line already says what went wrong
    }
    if (bankId !== this.bankId) return; // another bank was chosen meanwhile
    const kinds = Object.entries(usage?.by_kind ?? {});
    clear(this.usageBody);
    for (const [kind, c] of kinds) {
      const cells = [kind, c.calls, c.prompt_tokens, c.completion_tokens, c.total_tokens];
      this.usageBody.append(h("tr", { dataset: { kind } }, ...cells.map((v) => h("td", {}, String(v)))));
    }
    this.usageTable.hidden = kinds.length === 0;
  }

  async createBank(event) {
    event.preventDefault();
    const input = event.target.elements.bank;
    const bankId = input.value.trim();
    if (!bankId) return;
    try {
      await memory.createBank(bankId, { name: bankId });
      input.value = "";
      this.navigate(`#/memory/${encodeURIComponent(bankId)}`);
    } catch (error) {
      input.setCustomValidity(describeError(error));
      input.reportValidity();
      input.setCustomValidity("");
    }
  }

  async retain(event) {
    event.preventDefault();
    const content = this.retainText.value.trim();
    if (!content) return status(this.retainStatus, "Write something to retain first.", "error");
    const context = this.retainContext.value.trim();
    status(this.retainStatus, "Retaining…", "pending");
    try {
      const body = await memory.retain(this.bankId, content, context ? { context } : {});
      this.retainText.value = "";
      status(this.retainStatus, `Retained ${body?.items_count ?? 1} item.`, "ok");
      await Promise.all([this.loadList(true), this.refreshBanks(), this.loadUsage()]);
    } catch (error) {
      status(this.retainStatus, describeError(error), "error");
    }
  }

  async loadList(reset) {
    if (!this.bankId) return;
    if (reset) this.offset = 0;
    try {
      const body = await memory.list(this.bankId, { limit: PAGE, offset: this.offset });
      const items = body?.items ?? [];
      if (reset) clear(this.listItems);
      for (const item of items) this.listItems.append(factView(item));
      this.offset += items.length;
      const total = body?.total ?? this.offset;
      this.memoryCount.textContent = `${total} ${total === 1 ? "memory" : "memories"}`;
      this.listMore.hidden = this.offset >= total;
      status(this.listStatus, total ? "" : "No memories yet: retain some text.", "");
    } catch (error) {
      if (reset) clear(this.listItems);
      this.memoryCount.textContent = "";
      status(this.listStatus, error.status === 404 ? "No memories yet: retain some text." : describeError(error), error.status === 404 ? "" : "error");
    }
  }

  async recall(event) {
    event.preventDefault();
    const query = this.recallQuery.value.trim();
    if (!query) return status(this.recallStatus, "Type a query first.", "error");
    status(this.recallStatus, "Recalling…", "pending");
    const started = performance.now();
    try {
      const body = await memory.recall(this.bankId, query, { budget: this.recallBudget.value });
      const results = body?.results ?? [];
      const took = performance.now() - started;
      status(this.recallStatus, `${results.length} result${results.length === 1 ? "" : "s"} in ${took.toFixed(0)} ms.`, "ok");
      clear(this.recallChart).append(timingChart(body?.trace));
      clear(this.recallResults);
      for (const result of results) this.recallResults.append(factView(result));
    } catch (error) {
      status(this.recallStatus, describeError(error), "error");
    }
  }

  /** Streamed reflect: tool steps and text as they come, then the answer and the memories
   * it used. The button turns into Stop, which aborts the request (the server stops). */
  async reflect(event) {
    event.preventDefault();
    if (this.reflectAbort) {
      this.reflectAbort.abort();
      return;
    }
    const query = this.reflectQuery.value.trim();
    if (!query) return status(this.reflectStatus, "Type a question first.", "error");
    status(this.reflectStatus, "Reflecting…", "pending");
    const started = performance.now();
    clear(this.reflectSteps);
    clear(this.reflectAnswer);
    clear(this.reflectFacts);
    this.reflectUsed.hidden = true;
    const abort = new AbortController();
    this.reflectAbort = abort;
    this.reflectButton.textContent = "Stop";
    this.reflectButton.classList.add("danger");
    let iteration = null;
    let settled = false;
    try {
      const response = await memory.reflectStream(this.bankId, query, { signal: abort.signal });
      await readSse(response, (message) => {
        // Each frame is a journal event of the reflect run: {run_id, seq, type, ts, data}.
        let data = {};
        try {
          data = JSON.parse(message.data).data ?? {};
        } catch {
          data = {};
        }
        if (message.event === EVENT.TOOL_CALL) {
          const input = data.arguments?.query ?? data.arguments?.memory_id ?? "";
          this.reflectSteps.append(
            h("li", { class: "step" }, h("span", { class: "tool-name" }, data.name ?? "tool"), input ? ` “${shorten(input, 60)}”` : ""),
          );
        } else if (message.event === EVENT.TOOL_RESULT) {
          const last = this.reflectSteps.lastElementChild;
          const output = data.output ?? {};
          const found = Array.isArray(output.memories) ? `${output.memories.length} memories` : output.error ? `error: ${output.error}` : "done";
          if (last) last.append(h("span", { class: "muted" }, ` → ${found}`));
        } else if (message.event === EVENT.TEXT_DELTA) {
          if (data.iteration !== iteration) {
            iteration = data.iteration;
            clear(this.reflectAnswer);
          }
          this.reflectAnswer.append(document.createTextNode(data.text ?? ""));
        } else if (message.event === EVENT.MESSAGE) {
          this.reflectAnswer.textContent = data.text ?? "";
        } else if (message.event === EVENT.COMPLETED) {
          settled = true;
          this.showReflectAnswer(data.result, started);
        } else if (message.event === EVENT.FAILED) {
          settled = true;
          status(this.reflectStatus, `${data.status ?? "error"}: ${data.error ?? "reflect failed"}`, "error");
        } else if (TERMINAL_EVENTS.has(message.event)) {
          settled = true;
          status(this.reflectStatus, `Stopped: ${data.reason ?? message.event}.`, "");
        }
      });
      if (!settled) status(this.reflectStatus, "The answer was cut off: the connection closed early.", "error");
    } catch (error) {
      if (error?.name === "AbortError") {
        status(this.reflectStatus, "Stopped: the server stopped reflecting.", "");
      } else {
        const missing = error.status === 404 && /not found/i.test(error.detail) && !/bank/i.test(error.detail);
        status(this.reflectStatus, missing ? "Reflect is not available on this server yet." : describeError(error), "error");
      }
    } finally {
      this.reflectAbort = null;
      this.reflectButton.textContent = "Reflect";
      this.reflectButton.classList.remove("danger");
      this.loadUsage(); // what the reflect cost
    }
  }

  showReflectAnswer(body, started) {
    this.reflectAnswer.textContent = body?.text ?? "";
    const used = body?.based_on?.memories ?? [];
    const ms = performance.now() - started;
    const took = ms < 1000 ? `${ms.toFixed(0)} ms` : `${(ms / 1000).toFixed(1)} s`;
    status(this.reflectStatus, `Answered in ${took}, based on ${used.length} ${used.length === 1 ? "memory" : "memories"}.`, "ok");
    this.reflectUsed.hidden = used.length === 0;
    this.reflectUsed.textContent = `Memories used (${used.length})`;
    clear(this.reflectFacts);
    for (const fact of used) this.reflectFacts.append(factView(fact));
  }

}
