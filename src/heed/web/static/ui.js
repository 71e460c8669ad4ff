// ui.js: tiny DOM helpers, the learning tabs' base (FormListSection) and the page-wide notice
// banner. No state of its own beyond the banner.

/** Build an element: h("button", {class: "x", onclick: fn}, "text", child). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/**
 * A list item of the fact lists (facts, observations, their sources and earlier versions):
 * li(attrs) holding the text (div.fact-text), the meta line (div.fact-meta of the *meta*
 * elements; null ones are left out, as by h) and then *rest*.
 */
export function factItem(attrs, text, meta, ...rest) {
  return h("li", attrs, h("div", { class: "fact-text" }, text), h("div", { class: "fact-meta" }, meta), ...rest);
}

/** A titled card section (the memory page's panels); its heading labels it. */
export function card(title, ...body) {
  const id = `card-${title.toLowerCase().replaceAll(" ", "-")}`;
  return h("section", { class: "card", "aria-labelledby": id }, h("h3", { id }, title), ...body);
}

/**
 * A learning tab's layout: a form card ("New …", a hint, the form) beside a list card (its
 * count and a Reload button, a status line, the list). The form (id `${formName}-form`)
 * holds *fields*, then a Create button (`${formName}-create`) and its status line
 * (`${formName}-form-status`); submitting it calls onCreate(event). The list card's parts
 * have the ids `${name}-count`, `${name}-status` and `${name}-list` (the list of class
 * listClass, labelled listLabel). Returns { el: the tab's element, formStatus, count,
 * statusEl, list, reset: empties the list and blanks the count and both status lines
 * (another bank chosen) }.
 */
export function formBesideList({ formTitle, hint, formName, fields, onCreate, listTitle, name, listClass, listLabel, onReload }) {
  const formStatus = h("p", { class: "form-status", role: "status", id: `${formName}-form-status` });
  const form = h(
    "form",
    { id: `${formName}-form`, onsubmit: onCreate },
    ...fields,
    h("div", { class: "row" }, h("button", { type: "submit", id: `${formName}-create` }, "Create")),
    formStatus,
  );
  const count = h("span", { id: `${name}-count`, class: "muted" });
  const statusEl = h("p", { class: "form-status", role: "status", id: `${name}-status` });
  const list = h("ol", { class: listClass, id: `${name}-list`, "aria-label": listLabel });
  const header = h("div", { class: "row" }, count, h("span", { class: "spacer" }), h("button", { type: "button", class: "secondary", onclick: onReload }, "Reload"));
  const el = h(
    "div",
    { class: "memory-grid learning-grid" },
    h("div", { class: "memory-column" }, card(formTitle, h("p", { class: "muted hint" }, hint), form)),
    h("div", { class: "memory-column wide" }, card(listTitle, header, statusEl, list)),
  );
  const reset = () => {
    clear(list);
    count.textContent = "";
    setStatus(statusEl, "");
    setStatus(formStatus, "");
  };
  return { el, formStatus, count, statusEl, list, reset };
}

/**
 * A bank's learning tab built by formBesideList (the directives and mental models tabs): a
 * subclass builds its fields in build() and hands them to mount() with the layout's other
 * options; submitting the form calls its create(event), Reload its load(). setBank(id) empties
 * the tab for another bank, after forget() (what the subclass holds of the last one).
 */
export class FormListSection {
  constructor() {
    this.bankId = null;
    this.build();
  }

  /** Lay the tab out (formBesideList's options but onCreate and onReload) and keep its parts. */
  mount(options) {
    this.panel = formBesideList({ ...options, onCreate: (e) => this.create(e), onReload: () => this.load() });
    ({ el: this.el, formStatus: this.formStatus, count: this.count, statusEl: this.statusEl, list: this.list } = this.panel);
  }

  setBank(bankId) {
    if (bankId === this.bankId) return;
    this.bankId = bankId;
    this.forget();
    this.panel.reset();
  }

  forget() {}

  close() {}

  /** The form's Name field, its label and its input (id `${formName}-name`, required, at
   * most 256 characters), the input kept as this.nameInput. */
  nameField(formName, placeholder) {
    const id = `${formName}-name`;
    this.nameInput = h("input", { id, name: "name", required: true, maxlength: 256, autocomplete: "off", placeholder });
    return [h("label", { for: id }, "Name"), this.nameInput];
  }

  /** The form's create: send(bankId) (the API call); unless another bank was chosen
   * meanwhile, *inputs* back to their defaults, *okText* in the form's status line, the list
   * reloaded and after(the answer). An error is said in the form's status line. */
  async createWith(send, inputs, okText, after = () => {}) {
    const bankId = this.bankId;
    setStatus(this.formStatus, "Creating…", "pending");
    try {
      const body = await send(bankId);
      if (bankId !== this.bankId) return;
      for (const input of inputs) input.value = input.defaultValue;
      setStatus(this.formStatus, okText, "ok");
      await this.load();
      after(body);
    } catch (error) {
      setStatus(this.formStatus, describeError(error), "error");
    }
  }

  /** An item's delete: send(bankId) (the API call); unless another bank was chosen
   * meanwhile, drop() (what the tab holds of it), the list reloaded and “Deleted name” said
   * in the list's status line, as an error is. */
  async removeWith(send, name, drop = () => {}) {
    const bankId = this.bankId;
    try {
      await send(bankId);
      if (bankId !== this.bankId) return;
      drop();
      await this.load();
      setStatus(this.statusEl, `Deleted “${name}”.`, "ok");
    } catch (error) {
      setStatus(this.statusEl, describeError(error), "error");
    }
  }
}

/** Set a status line (class form-status; its other classes stay): kind is "", "pending", "ok" or "error". */
export function setStatus(el, text, kind = "") {
  el.textContent = text;
  el.classList.remove("pending", "ok", "error");
  el.classList.add("form-status");
  if (kind) el.classList.add(kind);
}

/**
 * A button that asks first, inline: a click shows *question* with a confirming button and
 * Cancel; the confirming button runs onConfirm (errors are the caller's to show).
 */
export function askFirst({ label, ariaLabel, question, confirmLabel = label, onConfirm, className = "secondary" }) {
  const wrap = h("span", { class: "ask-first" });
  const button = h("button", { type: "button", class: className, "aria-label": ariaLabel, onclick: () => ask() }, label);
  const reset = () => wrap.replaceChildren(button);
  const ask = () => {
    const yes = h("button", { type: "button", class: "danger confirm-yes" }, confirmLabel);
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      try {
        await onConfirm();
      } finally {
        reset();
      }
    });
    const no = h("button", { type: "button", class: "secondary", onclick: () => (reset(), button.focus()) }, "Cancel");
    wrap.replaceChildren(h("span", { class: "confirm" }, question), yes, no);
    yes.focus();
  };
  wrap.append(button);
  return wrap;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

export function formatTime(value) {
  if (value === undefined || value === null || value === "") return "";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" });
}

export function shorten(text, max = 80) {
  const s = typeof text === "string" ? text : JSON.stringify(text);
  if (s === undefined) return "";
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

// --- The banner: one notice at a time per key (network, busy, overloaded, error). ---

const notices = new Map();

function renderBanner() {
  const banner = document.getElementById("banner");
  if (!banner) return;
  clear(banner);
  for (const [key, { text, kind }] of notices) {
    banner.append(
      h(
        "div",
        { class: `notice ${kind}`, dataset: { key } },
        h("span", {}, text),
        h("button", {
          type: "button",
          class: "link",
          "aria-label": "dismiss",
          onclick: () => hideNotice(key),
        }, "×"),
      ),
    );
  }
  banner.hidden = notices.size === 0;
}

/** Show (or replace) the notice *key*; kind is "error", "warn" or "info". */
export function showNotice(key, text, kind = "error") {
  notices.set(key, { text, kind });
  renderBanner();
}

export function hideNotice(key) {
  if (notices.delete(key)) renderBanner();
}

/** A human message for an ApiError (409 busy, 503 overloaded, network lost, ...). */
export function describeError(error) {
  if (!error) return "unknown error";
  if (error.status === 0) return "Network lost: the server cannot be reached.";
  if (error.status === 409) return `Busy: ${error.detail || "the session is running a turn"}.`;
  if (error.status === 503) {
    const wait = error.retryAfter ? ` Retrying in ${error.retryAfter} s.` : "";
    return `Server overloaded (503).${wait}`;
  }
  if (error.status) return `${error.status}: ${error.detail || error.message}`;
  return error.message || String(error);
}
