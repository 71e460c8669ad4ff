// directives.js: the Directives tab of a bank: the rules reflect and the bank's chat turns say to
// the model, in the order they are said (priority first). Create, switch on and off, delete.

import { directives as api } from "./api.js";
import { FormListSection, askFirst, clear, describeError, h, setStatus } from "./ui.js";

const MAX_CONTENT = 5000; // heed.memory.directives.MAX_CONTENT_CHARS

/** "a, b ,, c" -> ["a", "b", "c"]; nothing -> null (the directive always applies). */
export function parseTags(text) {
  const tags = String(text ?? "")
    .split(",")
    .map((tag) => tag.trim())
    .filter(Boolean);
  return tags.length ? [...new Set(tags)] : null;
}

/** The directives tab: setBank(id), load(), close(). */
export class DirectivesSection extends FormListSection {
  build() {
    this.contentInput = h("textarea", {
      id: "directive-content",
      name: "content",
      rows: 3,
      required: true,
      maxlength: MAX_CONTENT,
      placeholder: "The rule, as the model is told it, e.g. “Answer in at most three sentences.”",
    });
    this.priorityInput = h("input", { id: "directive-priority", name: "priority", type: "number", step: 1, value: 0, inputmode: "numeric" });
    this.tagsInput = h("input", { id: "directive-tags", name: "tags", autocomplete: "off", placeholder: "tags, comma-separated (optional)" });
    const fields = [
      ...this.nameField("directive", "e.g. Be brief"),
      h("label", { for: "directive-content" }, "Rule"),
      this.contentInput,
      h(
        "div",
        { class: "row" },
        h("label", { for: "directive-priority" }, "Priority"),
        this.priorityInput,
        h("label", { for: "directive-tags", class: "sr-only" }, "Tags"),
        this.tagsInput,
      ),
    ];
    this.mount({
      formTitle: "New directive",
      hint: "Untagged directives always apply; tagged ones only to a reflect whose tags match them.",
      formName: "directive",
      fields,
      listTitle: "Directives",
      name: "directive",
      listClass: "directives",
      listLabel: "directives",
    });
  }

  async load() {
    const bankId = this.bankId;
    if (!bankId) return;
    try {
      const body = await api.list(bankId);
      if (bankId !== this.bankId) return;
      const items = body?.items ?? [];
      const total = body?.total ?? items.length;
      const active = items.filter((d) => d.is_active).length;
      this.count.textContent = `${total} ${total === 1 ? "directive" : "directives"}, ${active} active`;
      clear(this.list).append(...items.map((d) => this.view(d)));
      setStatus(this.statusEl, total ? "" : "No directives yet: reflect and chat turns follow none.", "");
    } catch (error) {
      if (bankId !== this.bankId) return;
      setStatus(this.statusEl, describeError(error), "error");
    }
  }

  view(directive) {
    const toggle = h("input", {
      type: "checkbox",
      class: "directive-active",
      checked: directive.is_active,
      "aria-label": `active: ${directive.name}`,
    });
    const li = h(
      "li",
      { class: "directive", dataset: { id: directive.id, active: String(directive.is_active) } },
      h(
        "div",
        { class: "mm-header" },
        h("h4", { class: "directive-name" }, directive.name),
        h(
          "div",
          { class: "row" },
          h("label", { class: "switch" }, toggle, " active"),
          askFirst({
            label: "Delete",
            ariaLabel: `delete ${directive.name}`,
            question: `Delete “${directive.name}”?`,
            onConfirm: () => this.remove(directive),
          }),
        ),
      ),
      h("p", { class: "directive-content" }, directive.content),
      h(
        "div",
        { class: "fact-meta" },
        h("span", { class: "tag", title: "higher priorities are said first" }, `priority ${directive.priority ?? 0}`),
        directive.tags?.length
          ? directive.tags.map((tag) => h("span", { class: "tag muted-tag" }, tag))
          : h("span", {}, "always applies"),
      ),
    );
    toggle.addEventListener("change", () => this.setActive(li, directive, toggle));
    return li;
  }

  async setActive(li, directive, toggle) {
    const wanted = toggle.checked;
    toggle.disabled = true;
    try {
      const updated = await api.update(this.bankId, directive.id, { is_active: wanted });
      directive.is_active = updated?.is_active ?? wanted;
      toggle.checked = directive.is_active;
      li.dataset.active = String(directive.is_active);
      setStatus(this.statusEl, `“${directive.name}” is ${directive.is_active ? "active" : "inactive"}.`, "ok");
      const active = this.list.querySelectorAll('li.directive[data-active="true"]').length;
      const total = this.list.querySelectorAll("li.directive").length;
      this.count.textContent = `${total} ${total === 1 ? "directive" : "directives"}, ${active} active`;
    } catch (error) {
      toggle.checked = !wanted;
      setStatus(this.statusEl, describeError(error), "error");
    } finally {
      toggle.disabled = false;
    }
  }

  async create(event) {
    event.preventDefault();
    const name = this.nameInput.value.trim();
    const content = this.contentInput.value.trim();
    if (!name || !content) return setStatus(this.formStatus, "Give it a name and a rule.", "error");
    const priority = Number(this.priorityInput.value || 0);
    if (!Number.isInteger(priority)) return setStatus(this.formStatus, "The priority is a whole number.", "error");
    const tags = parseTags(this.tagsInput.value);
    await this.createWith(
      (bankId) => api.create(bankId, { name, content, priority, tags }),
      [this.nameInput, this.contentInput, this.tagsInput, this.priorityInput],
      `Created “${name}”.`,
    );
  }

  async remove(directive) {
    await this.removeWith((bankId) => api.remove(bankId, directive.id), directive.name);
  }
}
