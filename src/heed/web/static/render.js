// render.js: THE renderer of a turn. Stored transcript messages, replayed journal events and live
// journal events all go through TurnView, so a replay and a live stream draw the same thing.

import { EVENT, TERMINAL_EVENTS } from "./events.js";
import { h, shorten } from "./ui.js";

const STATUS_LABELS = {
  running: "streaming…",
  queued: "waiting…",
  completed: "",
  cancelled: "stopped",
  cancelling: "stopping…",
  failed: "failed",
  interrupted: "interrupted",
};

function textOf(data) {
  return typeof data?.text === "string" ? data.text : "";
}

function argsSummary(args) {
  if (args === undefined || args === null) return "";
  if (typeof args === "string") return shorten(args, 60);
  const parts = Object.entries(args).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`);
  return shorten(parts.join(", "), 60);
}

function resultSummary(result) {
  if (result === undefined || result === null) return "";
  if (Array.isArray(result)) return `${result.length} item${result.length === 1 ? "" : "s"}`;
  if (typeof result === "object") {
    for (const key of ["results", "items", "memories"]) {
      if (Array.isArray(result[key])) return `${result[key].length} ${key}`;
    }
    if (typeof result.text === "string") return shorten(result.text, 60);
    if (typeof result.error === "string") return `error: ${shorten(result.error, 50)}`;
    return shorten(JSON.stringify(result), 60);
  }
  return shorten(String(result), 60);
}

function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** A compact, expandable tool call; its result is filled in when it arrives. */
function toolView(call) {
  const result = h("span", { class: "tool-result-summary" }, "…");
  const detail = h("pre", { class: "tool-detail" }, pretty(call.arguments ?? {}));
  const el = h(
    "details",
    { class: "tool", dataset: { callId: call.id ?? "" } },
    h(
      "summary",
      {},
      h("span", { class: "tool-name" }, call.name ?? "tool"),
      h("span", { class: "tool-args" }, `(${argsSummary(call.arguments)})`),
      h("span", { class: "tool-arrow", "aria-hidden": "true" }, " → "),
      result,
    ),
    detail,
  );
  el.setResult = (value, isError) => {
    result.textContent = isError ? `error: ${shorten(String(value), 50)}` : resultSummary(value) || "done";
    el.classList.toggle("tool-error", Boolean(isError));
    detail.textContent = `${pretty(call.arguments ?? {})}\n\n→ ${pretty(value)}`;
  };
  return el;
}

/**
 * One turn (one run): the user's message, then the assistant's text, tool calls and results, and
 * the turn's state. Keyed by run id in the transcript, so a turn is never drawn twice.
 */
export class TurnView {
  constructor(runId) {
    this.runId = runId;
    this.user = h("div", { class: "msg user", hidden: true });
    this.body = h("div", { class: "msg-body" });
    this.state = h("span", { class: "turn-state", "aria-live": "polite" });
    this.assistant = h(
      "div",
      { class: "msg assistant", hidden: true },
      h("div", { class: "msg-role" }, "agent ", this.state),
      this.body,
    );
    this.el = h("li", { class: "turn", dataset: { runId: runId ?? "" } }, this.user, this.assistant);
    this.tools = new Map();
    this.textNode = null;
    this.phase = null;
    this.source = null;
  }

  setUser(text, source) {
    if (!text && source !== "wakeup") return;
    this.user.hidden = false;
    this.user.textContent = "";
    if (source === "wakeup") {
      this.el.classList.add("wakeup");
      const note = (text || "").replace(/^\[wakeup\]\s*/, "") || "background work finished";
      this.user.append(h("span", { class: "msg-role" }, "wakeup"), " ", note);
    } else {
      this.user.append(text);
    }
  }

  showAssistant() {
    this.assistant.hidden = false;
  }

  appendText(text) {
    if (!text) return;
    this.showAssistant();
    if (!this.textNode) {
      this.textNode = h("div", { class: "text" });
      this.body.append(this.textNode);
    }
    this.textNode.append(document.createTextNode(text));
  }

  setText(text) {
    this.textNode = null;
    this.appendText(text);
  }

  markGap() {
    this.showAssistant();
    this.body.append(h("div", { class: "turn-gap" }, "… earlier output is no longer available …"));
    this.textNode = null;
  }

  addTool(call) {
    this.showAssistant();
    const view = toolView(call);
    this.tools.set(call.id ?? `#${this.tools.size}`, view);
    this.body.append(view);
    this.textNode = null; // text after a tool call starts a new paragraph
  }

  setToolResult(id, value, isError) {
    let view = this.tools.get(id);
    if (!view) {
      view = toolView({ id, name: "tool", arguments: {} });
      this.tools.set(id, view);
      this.body.append(view);
    }
    view.setResult(value, isError);
  }

  setPhase(phase, detail) {
    this.phase = phase;
    this.el.dataset.phase = phase;
    this.state.textContent = STATUS_LABELS[phase] ?? phase;
    this.el.classList.toggle("streaming", phase === "running" || phase === "queued");
    if (phase === "failed" || phase === "interrupted" || phase === "cancelled") {
      this.showAssistant();
      if (!this.body.firstChild) {
        this.body.append(h("div", { class: "muted turn-empty" }, "(no output)"));
      }
      if (detail && phase !== "cancelled") {
        this.body.append(h("div", { class: "turn-error" }, detail));
      }
    }
  }

  /** Apply one journal event (replayed or live: the same code path). */
  apply(event) {
    const type = event.type;
    const data = event.data ?? {};
    if (type === EVENT.TEXT_DELTA) {
      if (this.phase === null) this.setPhase("running");
      this.appendText(textOf(data));
    } else if (type === EVENT.STARTED) {
      this.setPhase("running");
    } else if (type === EVENT.USER_MESSAGE) {
      if (this.user.hidden) this.setUser(textOf(data), data.source);
    } else if (type === EVENT.TOOL_CALL) {
      this.addTool({ id: data.id, name: data.name, arguments: data.arguments });
    } else if (type === EVENT.TOOL_RESULT) {
      this.setToolResult(data.id, data.content ?? data.output, data.ok === false);
    } else if (type === EVENT.MESSAGE) {
      // The final message repeats the streamed text; only use it when nothing streamed.
      if (!this.body.querySelector(".text")) this.appendText(textOf(data));
    } else if (TERMINAL_EVENTS.has(type)) {
      this.setPhase(type, data.error ?? data.reason);
    }
  }

  /** Draw a stored message of this turn (from the session's transcript). */
  applyMessage(message) {
    if (message.role === "user") {
      this.setUser(message.content ?? "", message.source);
      return;
    }
    if (message.role === "tool") {
      this.setToolResult(message.tool_call_id ?? message.id, message.content, false);
      return;
    }
    if (message.role === "assistant") {
      // A model step streams its text first, then its tool calls.
      if (message.content) this.appendText(message.content);
      for (const call of message.tool_calls ?? []) {
        this.addTool({ id: call.id, name: call.name ?? call.function?.name, arguments: call.arguments ?? call.function?.arguments });
      }
      const status = message.status ?? "complete";
      const phase = { complete: "completed", stopped: "cancelled" }[status] ?? status;
      this.setPhase(phase);
      if (!message.content && !(message.tool_calls ?? []).length) this.showAssistant();
    }
  }
}
