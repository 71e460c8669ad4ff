// sessions.js: the sessions sidebar: list, create (optionally bound to a memory bank), rename,
// delete, and a busy dot per session driven by GET /v1/sessions/{id}/status.

import { memory, sessions } from "./api.js";
import { queue } from "./queue.js";
import { clear, describeError, h, showNotice } from "./ui.js";

const PENCIL = "M3 17.3V21h3.7L17.8 9.9l-3.7-3.7L3 17.3zm17.7-10.2a1 1 0 0 0 0-1.4l-2.4-2.4a1 1 0 0 0-1.4 0l-1.8 1.8 3.7 3.7 1.9-1.7z";
const TRASH = "M6 19a2 2 0 0 0 2 2h8a2 2 0 0 0 2-2V7H6v12zM19 4h-3.5l-1-1h-5l-1 1H5v2h14V4z";

function icon(path) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("width", "16");
  svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true");
  const p = document.createElementNS("http://www.w3.org/2000/svg", "path");
  p.setAttribute("d", path);
  p.setAttribute("fill", "currentColor");
  svg.append(p);
  return svg;
}

const STATUS_EVERY_MS = 10_000; // other sessions' busy dots, while the tab is visible
const MAX_STATUS_POLLS = 25;

function listOf(body) {
  if (Array.isArray(body)) return body;
  return body?.sessions ?? body?.items ?? body?.data ?? [];
}

export class SessionsPanel {
  constructor(root, { navigate }) {
    this.root = root;
    this.navigate = navigate;
    this.currentId = null;
    this.items = [];
    this.busy = new Map(); // sessionId -> bool
    this.timer = null;
    this.build();
  }

  build() {
    this.bankSelect = h("select", { id: "new-session-bank", name: "bank", "aria-label": "memory bank" });
    this.titleInput = h("input", {
      id: "new-session-title",
      name: "title",
      placeholder: "New session title",
      "aria-label": "new session title",
      autocomplete: "off",
    });
    this.list = h("ul", { id: "session-list", class: "session-list", "aria-label": "sessions" });
    const form = h(
      "form",
      { id: "new-session", class: "new-session", onsubmit: (e) => this.create(e) },
      this.titleInput,
      h("div", { class: "row" }, this.bankSelect, h("button", { type: "submit", id: "create-session" }, "New")),
    );
    clear(this.root).append(h("h2", { class: "sr-only" }, "Sessions"), form, this.list);
    this.loadBanks();
  }

  async loadBanks() {
    clear(this.bankSelect).append(h("option", { value: "" }, "no memory bank"));
    try {
      const body = await memory.listBanks();
      for (const bank of body?.banks ?? []) {
        this.bankSelect.append(h("option", { value: bank.bank_id }, `bank: ${bank.name || bank.bank_id}`));
      }
    } catch {
      // memory routes missing or unreachable: sessions work without a bank
    }
  }

  async refresh() {
    try {
      this.items = listOf(await sessions.list());
    } catch (error) {
      clear(this.list).append(h("li", { class: "error" }, describeError(error)));
      return this.items;
    }
    this.render();
    this.pollStatuses({ list: false });
    return this.items;
  }

  render() {
    clear(this.list);
    for (const session of this.items) this.list.append(this.row(session));
    if (!this.items.length) this.list.append(h("li", { class: "muted empty" }, "No sessions yet."));
  }

  row(session) {
    const id = session.id;
    const current = id === this.currentId;
    const title = session.title || session.name || "Untitled session";
    const busy = this.busy.get(id) ?? Boolean(session.busy);
    const queued = queue.items(id).length;
    const link = h(
      "a",
      {
        href: `#/chat/${encodeURIComponent(id)}`,
        class: "session-link",
        "aria-current": current ? "page" : null,
      },
      h("span", { class: `dot ${busy ? "busy" : ""}`, title: busy ? "busy" : "idle", "aria-label": busy ? "busy" : "idle" }),
      h("span", { class: "session-title" }, title),
      queued ? h("span", { class: "count", title: "queued messages" }, String(queued)) : null,
    );
    const rename = h("button", { type: "button", class: "icon", title: "Rename", "aria-label": `rename ${title}`, onclick: () => this.startRename(li, session) }, icon(PENCIL));
    const remove = h("button", { type: "button", class: "icon", title: "Delete", "aria-label": `delete ${title}`, onclick: () => this.confirmDelete(li, session) }, icon(TRASH));
    const li = h(
      "li",
      { class: `session ${current ? "current" : ""} ${busy ? "busy" : ""}`, dataset: { id } },
      link,
      h("span", { class: "session-actions" }, rename, remove),
    );
    return li;
  }

  setCurrent(id) {
    this.currentId = id;
    for (const li of this.list.querySelectorAll("li.session")) {
      const current = li.dataset.id === id;
      li.classList.toggle("current", current);
      const link = li.querySelector("a");
      if (current) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  setBusy(id, busy) {
    if (!id) return;
    this.busy.set(id, busy);
    const li = this.list.querySelector(`li.session[data-id="${CSS.escape(id)}"]`);
    if (!li) return;
    li.classList.toggle("busy", busy);
    const dot = li.querySelector(".dot");
    dot.classList.toggle("busy", busy);
    dot.title = busy ? "busy" : "idle";
    dot.setAttribute("aria-label", busy ? "busy" : "idle");
  }

  setTitle(id, title) {
    const session = this.items.find((s) => s.id === id);
    if (session && typeof title === "string" && session.title !== title) {
      session.title = title;
      this.render();
    }
  }

  /** Refresh the list (sessions made or renamed in other tabs) and the other sessions' busy
   * dots (the current one is kept fresh by the chat); only while the tab is visible. */
  async pollStatuses({ list = true } = {}) {
    clearTimeout(this.timer);
    if (document.visibilityState === "hidden") return;
    if (list) {
      try {
        const fresh = listOf(await sessions.list());
        const key = (items) => JSON.stringify(items.map((s) => [s.id, s.title]));
        const editing = this.list.querySelector(".rename-input, .confirm");
        if (!editing && key(fresh) !== key(this.items)) {
          this.items = fresh;
          this.render();
          const current = fresh.find((s) => s.id === this.currentId);
          const header = document.getElementById("session-title");
          if (current && header) header.textContent = current.title || "Untitled session";
        }
      } catch {
        // keep the list we have; the next round tries again
      }
    }
    const others = this.items.filter((s) => s.id !== this.currentId).slice(0, MAX_STATUS_POLLS);
    Promise.all(
      others.map((s) =>
        sessions
          .status(s.id)
          .then((st) => this.setBusy(s.id, Boolean(st?.busy)))
          .catch(() => {}),
      ),
    ).finally(() => {
      this.timer = setTimeout(() => this.pollStatuses(), STATUS_EVERY_MS);
    });
  }

  async create(event) {
    event.preventDefault();
    const title = this.titleInput.value.trim() || undefined;
    const bank_id = this.bankSelect.value || undefined;
    try {
      const session = await sessions.create({ title, bank_id });
      this.titleInput.value = "";
      await this.refresh();
      this.navigate(`#/chat/${encodeURIComponent(session.id)}`);
    } catch (error) {
      showNotice("error", `Could not create the session: ${describeError(error)}`);
    }
  }

  startRename(li, session) {
    const input = h("input", {
      class: "rename-input",
      value: session.title || "",
      "aria-label": "new title",
    });
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== session.title) {
        try {
          await sessions.rename(session.id, title);
          session.title = title;
        } catch (error) {
          showNotice("error", `Rename failed: ${describeError(error)}`);
        }
      }
      this.render();
      if (session.id === this.currentId) document.getElementById("session-title").textContent = session.title;
      this.list.querySelector(`li.session[data-id="${CSS.escape(session.id)}"] a`)?.focus();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        finish(true);
      } else if (e.key === "Escape") {
        e.preventDefault();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true), { once: true });
    li.replaceChildren(input);
    input.focus();
    input.select();
  }

  confirmDelete(li, session) {
    const yes = h("button", { type: "button", class: "danger", onclick: () => this.remove(session) }, "Delete");
    const no = h("button", { type: "button", class: "secondary", onclick: () => this.render() }, "Keep");
    li.replaceChildren(h("span", { class: "confirm" }, `Delete “${session.title || "Untitled session"}”?`), yes, no);
    li.addEventListener("keydown", (e) => {
      if (e.key === "Escape") this.render();
    });
    no.focus();
  }

  async remove(session) {
    try {
      await sessions.remove(session.id);
      queue.drop(session.id);
    } catch (error) {
      if (error.status !== 404) {
        showNotice("error", `Delete failed: ${describeError(error)}`);
        this.render();
        return;
      }
    }
    this.items = this.items.filter((s) => s.id !== session.id);
    this.render();
    if (session.id === this.currentId) this.navigate(this.items.length ? `#/chat/${encodeURIComponent(this.items[0].id)}` : "#/chat");
  }
}
