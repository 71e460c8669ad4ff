// progress.js: a background run followed live (a consolidation, a mental model's refresh): its
// journal as short lines, the latest progress, Stop (POST /v1/runs/{id}/cancel), and how it ended.

import { runs } from "./api.js";
import { EVENT, TERMINAL_EVENTS } from "./events.js";
import { followRun } from "./stream.js";
import { clear, describeError, h, setStatus, shorten } from "./ui.js";

const MAX_STEPS = 40; // the lines kept per run: the newest

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** A progress event's data as a line: a staged run ("reflecting (0/2)") or a consolidation round. */
export function describeProgress(data = {}) {
  if (typeof data.stage === "string") {
    const of = typeof data.total === "number" ? ` (${data.processed ?? 0}/${data.total})` : "";
    return `${data.stage.replaceAll("_", " ")}${of}`;
  }
  if (typeof data.rounds === "number") {
    const parts = [`${plural(data.facts_consolidated ?? 0, "fact")} consolidated`];
    if (data.observations_created) parts.push(`${data.observations_created} created`);
    if (data.observations_updated) parts.push(`${data.observations_updated} updated`);
    if (data.observations_merged) parts.push(`${data.observations_merged} merged`);
    if (data.facts_failed) parts.push(`${data.facts_failed} failed`);
    return `round ${data.rounds}: ${parts.join(", ")}`;
  }
  if (typeof data.processed === "number") {
    return `${data.processed}${typeof data.total === "number" ? ` of ${data.total}` : ""} processed`;
  }
  return "progress";
}

/** One journal event of a background run as a short line (null: nothing to show). */
export function describeEvent(event) {
  const data = event?.data ?? {};
  switch (event?.type) {
    case EVENT.STARTED:
      return "started";
    case EVENT.REQUEUED:
      return "requeued: its worker stopped, another one takes over";
    case EVENT.PROGRESS:
      return describeProgress(data);
    case EVENT.TOOL_CALL: {
      const input = data.arguments?.query ?? data.arguments?.memory_id ?? "";
      return `${data.name ?? "tool"}${input ? ` “${shorten(String(input), 60)}”` : ""}`;
    }
    case EVENT.TOOL_RESULT: {
      const output = data.output ?? {};
      if (Array.isArray(output.memories)) return `→ ${plural(output.memories.length, "memory", "memories")}`;
      if (output.error) return `→ error: ${shorten(String(output.error), 80)}`;
      return "→ done";
    }
    case EVENT.MESSAGE:
      return typeof data.text === "string" ? `answer drafted (${plural(data.text.length, "character")})` : null;
    case EVENT.COMPLETED:
      return "completed";
    case EVENT.FAILED:
      return `failed: ${data.error ?? "error"}`;
    case EVENT.CANCELLED:
      return `stopped: ${data.reason ?? "cancelled"}`;
    case EVENT.INTERRUPTED:
      return `interrupted: ${data.reason ?? "the server stopped"}`;
    default:
      return null;
  }
}

/** The unfinished runs of *kind* working on bank *bankId* (from GET /v1/runs?active=true). */
export async function activeRuns(kind, bankId) {
  const body = await runs.active();
  return (body?.runs ?? []).filter((run) => run.kind === kind && run.summary?.bank_id === bankId);
}

/**
 * One run at a time, followed live. Options: label ("Consolidation"), id (of the element),
 * summarize(result) -> the line shown on completion, stoppedNote (added to the line shown when
 * it was stopped), onProgress(event) on each progress event, onSettled(event) after its
 * terminal event (null when the stream failed for good).
 *
 * The element carries data-run-id and data-phase (running, cancelling, then the terminal
 * event's type) for tests and styles.
 */
export class RunProgress {
  constructor({
    label,
    id = null,
    summarize = () => `${label} completed.`,
    stoppedNote = "",
    onProgress = () => {},
    onSettled = () => {},
  }) {
    this.label = label;
    this.summarize = summarize;
    this.stoppedNote = stoppedNote;
    this.onProgress = onProgress;
    this.onSettled = onSettled;
    this.runId = null;
    this.follower = null;
    this.finished = false; // the followed run's terminal event was seen
    this.generation = 0;
    this.state = h("p", { class: "form-status run-state", role: "status" });
    this.stopButton = h(
      "button",
      { type: "button", class: "danger run-stop", hidden: true, "aria-label": `stop the ${label.toLowerCase()}`, onclick: () => this.stop() },
      "Stop",
    );
    this.steps = h("ol", { class: "steps run-steps", "aria-label": `${label.toLowerCase()} steps` });
    this.el = h(
      "div",
      { class: "run-progress", id, hidden: true },
      h("div", { class: "row" }, this.state, this.stopButton),
      this.steps,
    );
  }

  /** True while a run is being followed (its terminal event not seen yet). */
  get running() {
    return this.follower !== null;
  }

  /** Show a line without a run (a refused start, say). */
  note(text, kind = "") {
    this.el.hidden = false;
    setStatus(this.state, text, kind);
  }

  follow(runId, { phase = "running" } = {}) {
    if (this.runId === runId && this.follower) return;
    this.close();
    this.runId = runId;
    this.finished = false;
    this.el.hidden = false;
    this.el.dataset.runId = runId;
    this.el.dataset.phase = phase;
    clear(this.steps);
    const stopping = phase === "cancelling";
    setStatus(this.state, stopping ? `${this.label}: stopping…` : `${this.label}: running…`, "pending");
    this.stopButton.hidden = false;
    this.stopButton.disabled = stopping;
    this.stopButton.textContent = stopping ? "Stopping…" : "Stop";
    // onState runs synchronously inside followRun too: compare generations, not the follower.
    const generation = ++this.generation;
    this.follower = followRun(runs, runId, {
      onEvent: (event) => this.draw(event),
      onTerminal: (event) => this.settle(event),
      onGap: () => this.steps.append(h("li", { class: "step muted" }, "… earlier steps are no longer kept")),
      onState: (state, error) => {
        if (this.generation !== generation || !this.follower) return;
        if (state === "closed" && error) {
          this.follower = null;
          this.stopButton.hidden = true;
          this.el.dataset.phase = "lost";
          setStatus(this.state, `${this.label}: ${describeError(error)}`, "error");
          this.onSettled(null);
        } else if (state === "retrying" && error?.network) {
          setStatus(this.state, `${this.label}: reconnecting…`, "pending");
        }
      },
    });
  }

  draw(event) {
    if (TERMINAL_EVENTS.has(event.type)) return; // settle() says how it ended
    if (event.type === EVENT.PROGRESS) {
      if (this.el.dataset.phase === "running") {
        setStatus(this.state, `${this.label}: ${describeProgress(event.data)}`, "pending");
      }
      this.onProgress(event);
    }
    const text = describeEvent(event);
    if (!text) return;
    const last = this.steps.lastElementChild;
    if (event.type === EVENT.TOOL_RESULT && last?.dataset.type === EVENT.TOOL_CALL) {
      last.append(h("span", { class: "muted" }, ` ${text}`));
      last.dataset.type = EVENT.TOOL_RESULT;
      return;
    }
    this.steps.append(h("li", { class: "step", dataset: { type: event.type, seq: String(event.seq) } }, text));
    while (this.steps.children.length > MAX_STEPS) this.steps.firstElementChild.remove();
  }

  async stop() {
    const runId = this.runId;
    if (!runId || !this.follower) return;
    this.stopButton.disabled = true;
    this.stopButton.textContent = "Stopping…";
    this.el.dataset.phase = "cancelling";
    setStatus(this.state, `${this.label}: stopping…`, "pending");
    try {
      await runs.cancel(runId); // the journal's terminal event settles it
    } catch (error) {
      if (this.runId !== runId || !this.follower) return;
      this.stopButton.disabled = false;
      this.stopButton.textContent = "Stop";
      this.el.dataset.phase = "running";
      setStatus(this.state, `${this.label}: could not stop: ${describeError(error)}`, "error");
    }
  }

  settle(event) {
    this.follower = null;
    this.finished = true;
    this.stopButton.hidden = true;
    this.el.dataset.phase = event.type;
    const data = event.data ?? {};
    if (event.type === EVENT.COMPLETED) {
      setStatus(this.state, this.summarize(data.result ?? {}), "ok");
    } else if (event.type === EVENT.CANCELLED) {
      const note = this.stoppedNote ? ` ${this.stoppedNote}` : "";
      setStatus(this.state, `${this.label} stopped (${data.reason ?? "cancelled"}).${note}`, "");
    } else {
      const why = data.error ?? data.reason ?? "";
      setStatus(this.state, `${this.label} ${event.type}${why ? `: ${why}` : ""}.`, "error");
    }
    this.onSettled(event);
  }

  /** Follow again the run that close() left unfinished (true if it did). */
  resume() {
    if (!this.runId || this.follower || this.finished) return false;
    this.follow(this.runId, { phase: this.el.dataset.phase === "cancelling" ? "cancelling" : "running" });
    return true;
  }

  /** Stop following (the run goes on; resume() or follow() replays its journal). */
  close() {
    const follower = this.follower;
    this.follower = null;
    follower?.close();
  }

  /** Stop following and forget the run (another bank). */
  reset() {
    this.close();
    this.runId = null;
    this.finished = false;
    this.el.hidden = true;
    delete this.el.dataset.runId;
    delete this.el.dataset.phase;
    clear(this.steps);
    setStatus(this.state, "");
  }
}
