// chat.js: one session's chat: transcript, live turns, Stop, the queue of messages typed while busy,
// and the visible/hidden lifecycle (a hidden tab holds no stream and polls the status instead).
//
// Sources of truth: the transcript (GET /v1/sessions/{id}) for finished turns, each run's journal
// for the turn in progress (drawn by TurnView, deduped by seq), and GET .../status for "busy" and
// for which run a client may attach to (never a cancelling one).

import { runs, sessions } from "./api.js";
import { EVENT } from "./events.js";
import { queue, runCache } from "./queue.js";
import { TurnView } from "./render.js";
import { followRun, followSession } from "./stream.js";
import { clear, describeError, h, hideNotice, showNotice, sleep } from "./ui.js";

export const config = {
  hiddenPollMs: 3000, // a hidden tab's status polling period
  visiblePollMs: 5000, // the busy indicator's refresh while visible
  cacheEveryMs: 250, // how often a streamed run's events are saved for a reload
};

function runIdOf(body) {
  return body?.run?.id ?? body?.run_id ?? body?.id ?? null;
}

function signatureOf(messages) {
  return JSON.stringify(
    messages.map((m) => [m.id ?? null, m.run_id ?? null, m.role, (m.content ?? "").length, m.status ?? null]),
  );
}

export class ChatView {
  constructor(root, { onStatus, onDeleted }) {
    this.root = root;
    this.onStatus = onStatus || (() => {});
    this.onDeleted = onDeleted || (() => {});
    this.sessionId = null;
    this.visible = document.visibilityState !== "hidden";
    this.turns = new Map(); // runId -> TurnView
    this.followers = new Map(); // runId -> follower (open run streams)
    this.finished = new Set(); // runs this tab saw end: never attached again
    this.logs = new Map(); // runId -> the journal events drawn so far (deduped by seq)
    this.savers = new Map(); // runId -> writes its events to the reload cache now
    this.channel = null;
    this.pollTimer = null;
    this.drainTimer = null;
    this.sending = null; // the queued message whose POST is in flight
    this.status = { busy: false, active_run_id: null };
    this.statusEpoch = 0; // bumped by every applied status snapshot
    this.signature = null;
    this.generation = 0; // bumped on every open(): late answers for an old session are dropped
    this.build();
    window.addEventListener("pagehide", () => {
      for (const save of this.savers.values()) save();
    });
    queue.watch((sessionId) => {
      if (sessionId === this.sessionId) {
        this.renderQueue();
        this.scheduleDrain(0);
      }
    });
  }

  build() {
    this.title = h("h2", { id: "session-title" }, "No session");
    this.badge = h("span", { id: "session-state", class: "badge", role: "status" });
    this.bankLabel = h("span", { id: "session-bank", class: "muted" });
    // No aria-live on the transcript (a screen reader would read every token); each turn's
    // state ("streaming…", "stopped") is a polite live region instead.
    this.transcript = h("ol", { id: "transcript", class: "transcript", "aria-label": "transcript" });
    this.empty = h("p", { id: "transcript-empty", class: "muted" }, "Send a message to start.");
    this.queueList = h("ol", { id: "queue", class: "queue", "aria-label": "queued messages", hidden: true });
    this.input = h("textarea", {
      id: "message-input",
      rows: 2,
      placeholder: matchMedia("(max-width: 760px)").matches
        ? "Message the agent"
        : "Message the agent (Enter to send, Shift+Enter for a new line, Esc to stop)",
      title: "Enter to send, Shift+Enter for a new line, Esc to stop",
      "aria-label": "message",
      disabled: true,
    });
    this.sendButton = h("button", { type: "submit", id: "send", disabled: true }, "Send");
    this.stopButton = h("button", { type: "button", id: "stop", class: "danger", hidden: true, onclick: () => this.stop() }, "Stop");
    this.form = h(
      "form",
      { id: "composer", class: "composer", onsubmit: (e) => this.submit(e) },
      this.input,
      h("div", { class: "composer-buttons" }, this.stopButton, this.sendButton),
    );
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.form.requestSubmit();
      } else if (event.key === "Escape" && !this.stopButton.hidden) {
        event.preventDefault();
        this.stop();
      }
    });
    clear(this.root).append(
      h("header", { class: "chat-header" }, this.title, this.badge, this.bankLabel),
      h("div", { class: "scroller", id: "scroller" }, this.empty, this.transcript),
      this.queueList,
      this.form,
    );
    this.scroller = this.root.querySelector("#scroller");
  }

  // --- opening and closing a session ---

  async open(sessionId) {
    this.close();
    const generation = ++this.generation;
    this.sessionId = sessionId;
    // Enabled once the session has loaded (below): nothing is typed into a session that
    // may turn out not to exist, and "enabled" means the header shows it.
    this.input.disabled = true;
    this.sendButton.disabled = true;
    this.renderQueue();
    if (!sessionId) {
      this.title.textContent = "No session";
      this.badge.textContent = "";
      this.bankLabel.textContent = "";
      clear(this.transcript);
      this.empty.hidden = false;
      this.empty.textContent = "Create a session to start.";
      return;
    }
    this.empty.textContent = "Send a message to start.";
    let session;
    try {
      session = await sessions.get(sessionId);
    } catch (error) {
      if (generation !== this.generation) return;
      this.title.textContent = error.status === 404 ? "Session not found" : "Session unavailable";
      showNotice("error", describeError(error));
      return;
    }
    if (generation !== this.generation) return;
    this.renderSession(session);
    this.input.disabled = false;
    this.sendButton.disabled = false;
    this.visible = document.visibilityState !== "hidden";
    await this.pollStatus(); // attaches to the attachable run, if any
    if (generation !== this.generation) return;
    runCache.prune(new Set(this.followers.keys()));
    if (this.visible) this.openChannel();
    this.schedulePoll(this.visible ? config.visiblePollMs : config.hiddenPollMs);
    this.input.focus();
    this.scheduleDrain(0);
  }

  close() {
    this.generation += 1;
    this.closeStreams();
    clearTimeout(this.pollTimer);
    clearTimeout(this.drainTimer);
    this.pollTimer = null;
    this.sending = null;
    this.turns.clear();
    this.finished.clear();
    this.logs.clear();
    this.savers.clear();
    this.signature = null;
    this.status = { busy: false, active_run_id: null };
    hideNotice("send");
  }

  closeStreams() {
    this.channel?.close();
    this.channel = null;
    for (const follower of this.followers.values()) follower.close();
    this.followers.clear();
  }

  // --- visible / hidden ---

  setVisible(visible) {
    this.visible = visible;
    if (!this.sessionId) return;
    clearTimeout(this.pollTimer);
    if (!visible) {
      this.closeStreams(); // a hidden tab holds no event stream...
      this.schedulePoll(config.hiddenPollMs); // ...and polls the status instead
      this.updateControls();
      return;
    }
    this.openChannel();
    this.pollStatus().then(() => this.refreshTranscriptIfChanged());
    this.schedulePoll(config.visiblePollMs);
  }

  openChannel() {
    if (this.channel || !this.sessionId) return;
    const sessionId = this.sessionId;
    this.channel = followSession(sessions, sessionId, {
      onEvent: (event) => this.onChannelEvent(event),
      onState: (state, error) => this.onStreamState(state, error),
    });
  }

  onChannelEvent(event) {
    const data = event.data ?? {};
    if (event.type === "turn_started") {
      // Replayed on subscribe only for attachable runs (never a cancelling one).
      const runId = data.run_id ?? data.run?.id;
      if (runId) this.attach(runId, { source: data.source ?? null });
    } else if (event.type === "session_updated") {
      // A status snapshot: the same fields as GET .../status.
      if ("busy" in data) this.applyStatus(data);
      const finished = data.run_id;
      if (finished && !this.followers.has(finished) && !this.finished.has(finished) && !data.active_run_id) {
        this.refreshTranscriptIfChanged(); // a turn we never saw live (e.g. very short)
      }
    } else if (event.type === "task_complete") {
      const title = data.title ?? data.task_run_id ?? "task";
      showNotice("task", `Background ${title} finished (${data.phase ?? "done"}).`, "info");
      setTimeout(() => hideNotice("task"), 6000);
    } else if (event.type === "session_deleted") {
      showNotice("error", "This session was deleted.");
      this.channel?.close();
      this.channel = null;
      this.onDeleted(this.sessionId);
    }
  }

  onStreamState(state, error) {
    if (state === "retrying" && error?.network) {
      showNotice("network", "Network lost: reconnecting…", "warn");
    } else if (state === "retrying" && error?.status === 503) {
      const wait = error.retryAfter ? ` in ${error.retryAfter} s` : "";
      showNotice("network", `Server overloaded (503): reconnecting${wait}.`, "warn");
    } else if (state === "open") {
      hideNotice("network");
    }
  }

  /** The status polling loop: every few seconds, faster while hidden (no streams then). */
  schedulePoll(ms) {
    clearTimeout(this.pollTimer);
    const generation = this.generation;
    this.pollTimer = setTimeout(async () => {
      this.pollTimer = null;
      await this.pollStatus();
      if (!this.visible) await this.refreshTranscriptIfChanged();
      if (generation === this.generation && !this.pollTimer) {
        this.schedulePoll(this.visible ? config.visiblePollMs : config.hiddenPollMs);
      }
    }, ms);
  }

  /** GET .../status: drives the busy indicator, and attaches to an attachable run we missed. */
  async pollStatus() {
    const sessionId = this.sessionId;
    if (!sessionId) return;
    const generation = this.generation;
    const epoch = this.statusEpoch;
    let status;
    try {
      status = await sessions.status(sessionId);
      hideNotice("network");
    } catch (error) {
      if (generation !== this.generation) return;
      if (error.status === 0) showNotice("network", "Network lost: the server cannot be reached.", "warn");
      return;
    }
    if (generation !== this.generation) return;
    // A snapshot from the channel that arrived while this request was in flight is newer.
    if (epoch !== this.statusEpoch) return;
    this.applyStatus(status);
  }

  /** Apply a status snapshot (from the poll or the channel): busy, and the attachable run. */
  applyStatus(status) {
    this.statusEpoch += 1;
    this.status = { busy: Boolean(status?.busy), active_run_id: status?.active_run_id ?? null, raw: status };
    const active = this.status.active_run_id;
    if (active && !this.finished.has(active) && !this.followers.has(active)) {
      this.attach(active, {});
    }
    this.updateControls();
    if (!this.status.busy) this.scheduleDrain(0);
  }

  // --- the transcript ---

  renderSession(session) {
    this.setTitle(session?.title || session?.name || "Untitled session");
    const bank = session?.bank_id;
    clear(this.bankLabel);
    if (bank) {
      this.bankLabel.append(
        "memory bank: ",
        h("a", { href: `#/memory/${encodeURIComponent(bank)}`, title: "open the bank's memory page" }, bank),
      );
    }
    this.renderTranscript(session?.messages ?? session?.transcript ?? []);
  }

  setTitle(title) {
    this.title.textContent = title || "Untitled session";
  }

  turnFor(runId) {
    if (runId && this.turns.has(runId)) return this.turns.get(runId);
    const turn = new TurnView(runId);
    if (runId) this.turns.set(runId, turn);
    this.transcript.append(turn.el);
    this.empty.hidden = true;
    return turn;
  }

  renderTranscript(messages) {
    const live = [...this.followers.keys()].map((id) => this.turns.get(id)).filter(Boolean);
    clear(this.transcript);
    this.turns.clear();
    let loose = null; // a turn without run id (user message, then its answer)
    for (const message of messages) {
      const runId = message.run_id ?? null;
      if (runId && this.followers.has(runId)) continue; // the journal draws the live turn
      let turn;
      if (runId) {
        turn = this.turnFor(runId);
        turn.fromTranscript = true;
      } else if (message.role === "user" || !loose) {
        turn = loose = this.turnFor(null);
      } else {
        turn = loose;
      }
      turn.applyMessage(message);
    }
    for (const turn of live) {
      this.turns.set(turn.runId, turn);
      this.transcript.append(turn.el);
    }
    this.signature = signatureOf(messages);
    this.empty.hidden = this.transcript.children.length > 0;
    this.scrollToEnd(true);
  }

  async refreshTranscriptIfChanged(force = false) {
    const sessionId = this.sessionId;
    if (!sessionId || this.followers.size) return;
    const generation = this.generation;
    try {
      const session = await sessions.get(sessionId);
      if (generation !== this.generation) return;
      const messages = session?.messages ?? session?.transcript ?? [];
      if (force || signatureOf(messages) !== this.signature) this.renderSession(session);
    } catch {
      // the next poll tries again
    }
  }

  scrollToEnd(force = false) {
    const s = this.scroller;
    const near = s.scrollHeight - s.scrollTop - s.clientHeight < 120;
    if (force || near) s.scrollTop = s.scrollHeight;
  }

  // --- attaching to a run ---

  /** Draw run *runId* from its journal: events already drawn first, then the stream after them. */
  attach(runId, { source = null, userText = null } = {}) {
    if (!this.sessionId || this.followers.has(runId) || this.finished.has(runId)) return;
    const existing = this.turns.get(runId);
    let turn;
    let events = this.logs.get(runId);
    if (existing && !existing.fromTranscript && events) {
      turn = existing; // drawn by this page up to the end of its log: continue after it
    } else {
      if (existing) existing.el.remove();
      this.turns.delete(runId);
      turn = this.turnFor(runId);
      if (userText) turn.setUser(userText, source);
      else if (source === "wakeup") turn.setUser("", "wakeup");
      events = runCache.load(runId); // a reload resumes after what it had drawn
      for (const event of events) turn.apply(event);
      this.logs.set(runId, events);
    }
    const after = events.length ? events[events.length - 1].seq : 0;
    let saveTimer = null;
    let gapped = false;
    const save = () => {
      clearTimeout(saveTimer);
      saveTimer = null;
      if (!this.finished.has(runId)) runCache.save(runId, events);
    };
    this.savers.set(runId, save); // flushed on pagehide, so a reload resumes exactly here
    const follower = followRun(runs, runId, {
      after,
      onEvent: (event) => {
        turn.apply(event);
        events.push(event);
        if (!saveTimer) saveTimer = setTimeout(save, config.cacheEveryMs);
        this.scrollToEnd();
      },
      onTerminal: (event) => {
        clearTimeout(saveTimer);
        this.savers.delete(runId);
        this.followers.delete(runId);
        this.finished.add(runId);
        this.logs.delete(runId);
        runCache.drop(runId);
        if (event.type === EVENT.FAILED) showNotice("error", `The turn failed: ${event.data?.error ?? "error"}`);
        this.updateControls();
        this.pollStatus();
        if (gapped) {
          turn.fromTranscript = true;
          this.refreshTranscriptIfChanged(true);
        }
      },
      onGap: () => {
        // Events before the retained range are gone: mark the hole, keep following, and let the
        // stored transcript (complete once the run ends) replace this turn at the end.
        turn.markGap();
        gapped = true;
      },
      onState: (state, error) => {
        if (state === "closed" && error) {
          // 404 and friends: the run is gone; stop following it.
          this.followers.delete(runId);
          this.finished.add(runId);
          turn.setPhase(turn.phase === "running" ? "interrupted" : turn.phase || "interrupted", describeError(error));
          this.updateControls();
        } else {
          this.onStreamState(state, error);
        }
      },
    });
    this.followers.set(runId, follower);
    this.status.busy = true;
    if (turn.phase === null) turn.setPhase("running");
    this.updateControls();
    this.scrollToEnd(true);
  }

  // --- the composer, the queue and Stop ---

  submit(event) {
    event.preventDefault();
    const text = this.input.value.trim();
    if (!text || !this.sessionId) return;
    this.input.value = "";
    queue.push(this.sessionId, text);
    this.renderQueue();
    this.scheduleDrain(0);
  }

  busy() {
    return this.followers.size > 0 || this.status.busy;
  }

  scheduleDrain(ms) {
    clearTimeout(this.drainTimer);
    this.drainTimer = setTimeout(() => this.drain(), ms);
  }

  /** Send the oldest queued message when the session is idle (one tab at a time). */
  async drain() {
    const sessionId = this.sessionId;
    if (!sessionId || this.busy() || !queue.items(sessionId).length) return;
    const generation = this.generation;
    await queue.exclusive(sessionId, async () => {
      if (generation !== this.generation || this.busy()) return;
      const item = queue.take(sessionId);
      if (!item) return;
      this.sending = item; // shown as "sending" until the server answers
      this.renderQueue();
      try {
        const body = await sessions.startTurn(sessionId, item.text, "reject");
        this.sending = null;
        this.renderQueue();
        hideNotice("send");
        hideNotice("network");
        const runId = runIdOf(body);
        if (generation === this.generation && runId) this.attach(runId, { userText: item.text, source: "user" });
      } catch (error) {
        this.sending = null;
        queue.unshift(sessionId, item);
        if (generation !== this.generation) return;
        this.renderQueue();
        const wait = Math.max(1, Number(error.retryAfter) || 2);
        if (error.status === 409) {
          this.status.busy = true;
          showNotice("send", "Session busy (409): your message is queued and will be sent when it is free.", "warn");
          this.updateControls();
          // Ask the status endpoint again after Retry-After; an idle answer drains the queue.
          setTimeout(() => generation === this.generation && this.pollStatus(), wait * 1000);
        } else if (error.status === 503 || error.status === 429) {
          // 429: a bound of this session or tenant (its detail names it); it frees up as work ends.
          const why = error.status === 503 ? "Server overloaded (503)" : `Too many requests (429: ${error.detail})`;
          showNotice("send", `${why}: your message is queued; retrying in ${wait} s.`, "warn");
          this.scheduleDrain(wait * 1000);
        } else if (error.status === 0) {
          showNotice("send", "Network lost: your message is queued and will be sent when it is back.", "warn");
          this.scheduleDrain(3000);
        } else if (error.status === 404) {
          showNotice("error", "This session no longer exists.");
        } else {
          showNotice("error", describeError(error));
        }
      }
    });
    if (generation === this.generation && !this.busy() && queue.items(sessionId).length) {
      this.scheduleDrain(500);
    }
  }

  renderQueue() {
    const s = this.scroller;
    const atEnd = s ? s.scrollHeight - s.scrollTop - s.clientHeight < 120 : false;
    clear(this.queueList);
    const items = this.sessionId ? queue.items(this.sessionId) : [];
    if (this.sending) {
      this.queueList.append(
        h(
          "li",
          { class: "queued sending", dataset: { id: this.sending.id } },
          h("span", { class: "badge" }, "sending"),
          h("span", { class: "queued-text" }, this.sending.text),
        ),
      );
    }
    for (const item of items) {
      this.queueList.append(
        h(
          "li",
          { class: "queued", dataset: { id: item.id } },
          h("span", { class: "badge" }, "queued"),
          h("span", { class: "queued-text" }, item.text),
          h(
            "button",
            {
              type: "button",
              class: "link",
              "aria-label": "remove queued message",
              onclick: () => {
                queue.remove(this.sessionId, item.id);
                this.renderQueue();
                if (!queue.items(this.sessionId).length && !this.sending) hideNotice("send");
              },
            },
            "×",
          ),
        ),
      );
    }
    this.queueList.hidden = items.length === 0 && !this.sending;
    if (atEnd) this.scrollToEnd(true); // the queue took room from the transcript: keep the end in view
  }

  async stop() {
    const runId = [...this.followers.keys()].at(-1) ?? this.status.active_run_id;
    if (!runId) return;
    this.stopButton.disabled = true;
    this.stopButton.textContent = "Stopping…";
    const turn = this.turns.get(runId);
    if (turn && turn.phase === "running") turn.setPhase("cancelling");
    try {
      await runs.cancel(runId);
      // The stream stays open: its terminal "cancelled" event settles the turn.
    } catch (error) {
      showNotice("error", `Stop failed: ${describeError(error)}`);
      this.stopButton.disabled = false;
      this.stopButton.textContent = "Stop";
    }
    this.input.focus();
  }

  updateControls() {
    const live = this.followers.size > 0;
    const busy = this.busy();
    this.stopButton.hidden = !live;
    if (!live) {
      this.stopButton.disabled = false;
      this.stopButton.textContent = "Stop";
    }
    this.sendButton.textContent = busy ? "Queue" : "Send";
    let label = "idle";
    if (live) label = this.stopButton.disabled ? "stopping…" : "running";
    else if (busy) label = "busy";
    this.badge.textContent = label;
    this.badge.dataset.state = label.replace("…", "");
    this.onStatus(this.sessionId, { busy, live });
  }
}

export { sleep };
