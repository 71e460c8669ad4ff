// stream.js: Server-Sent Events read over fetch, resumed from the last event id, deduped by seq.
//
// fetch instead of EventSource: the UI decides when (and whether) to reconnect, sees the HTTP
// status (404 ends, 503 waits), sends Last-Event-ID itself, and can count its connections. Every
// connection is closed on purpose: by close(), by a terminal event, or by the watchdog when the
// server has been silent for longer than its heartbeats allow (a lost network).

import { TERMINAL_EVENTS } from "./events.js";
import { errorFrom } from "./api.js";
import { sleep } from "./ui.js";

const WATCHDOG_MS = 35_000; // the server sends a heartbeat comment every ~10 s
const MIN_DELAY_MS = 500;
const MAX_DELAY_MS = 10_000;
const HEALTHY_MS = 5_000; // a connection that lived this long resets the backoff

/** Incremental SSE parser: feed() text chunks, get complete events ({event, id, data}). */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.id = null;
  }

  feed(chunk) {
    this.buffer += chunk;
    const out = [];
    let match;
    const lineEnd = /\r\n|\r|\n/g;
    let start = 0;
    while ((match = lineEnd.exec(this.buffer)) !== null) {
      // A lone \r at the very end may be the first half of \r\n: wait for more.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(start, match.index);
      start = match.index + match[0].length;
      if (line === "") {
        if (this.data.length || this.event) {
          out.push({ event: this.event || "message", id: this.id, data: this.data.join("\n") });
        }
        this.reset();
        continue;
      }
      if (line.startsWith(":")) continue; // comment (heartbeat)
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") this.event = value;
      else if (field === "data") this.data.push(value);
      else if (field === "id") this.id = value;
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }
}

/**
 * One logical SSE subscription that reconnects with backoff until closed.
 *
 * options: url(lastId) -> string; onEvent({event, id, data}); onState(state, error) with state in
 * "connecting" | "open" | "retrying" | "closed"; fatal(error) -> true to stop on an HTTP error.
 * lastId is the last `id:` seen (the caller may move it, e.g. after a dedupe decision).
 */
export class SseClient {
  constructor({ url, onEvent, onState = () => {}, fatal = defaultFatal, lastId = null }) {
    this.url = url;
    this.onEvent = onEvent;
    this.onState = onState;
    this.fatal = fatal;
    this.lastId = lastId;
    this.closed = false;
    this.connections = 0;
    this.controller = null;
    this.stopper = new AbortController();
  }

  start() {
    this.loop();
    return this;
  }

  /** Drop the current connection as a network failure would (it reconnects after a backoff). */
  drop() {
    this.controller?.abort();
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.stopper.abort();
    this.controller?.abort();
    this.onState("closed");
  }

  async loop() {
    let attempt = 0;
    while (!this.closed) {
      this.onState(attempt ? "retrying" : "connecting");
      const opened = Date.now();
      let received = false;
      let failure = null;
      try {
        received = await this.connectOnce();
      } catch (error) {
        failure = error;
      }
      if (this.closed) return;
      if (failure && failure.status && this.fatal(failure)) {
        this.onState("closed", failure);
        this.closed = true;
        return;
      }
      // Only a connection that delivered events *and* lived a while resets the backoff: a server
      // that answers and hangs up at once must not turn into a reconnect loop.
      attempt = received && Date.now() - opened >= HEALTHY_MS ? 1 : attempt + 1;
      const retryAfter = failure?.retryAfter ? failure.retryAfter * 1000 : 0;
      const backoff = Math.min(MAX_DELAY_MS, MIN_DELAY_MS * 2 ** (attempt - 1));
      this.onState("retrying", failure || new Error("stream ended"));
      await sleep(Math.max(backoff, retryAfter), this.stopper.signal);
    }
  }

  /** One connection; resolves true if any event arrived, throws on HTTP or network errors. */
  async connectOnce() {
    const controller = new AbortController();
    this.controller = controller;
    const headers = { Accept: "text/event-stream" };
    if (this.lastId !== null && this.lastId !== undefined) headers["Last-Event-ID"] = String(this.lastId);
    let watchdog = setTimeout(() => controller.abort(), WATCHDOG_MS);
    const kick = () => {
      clearTimeout(watchdog);
      watchdog = setTimeout(() => controller.abort(), WATCHDOG_MS);
    };
    let received = false;
    try {
      this.connections += 1;
      const response = await fetch(this.url(this.lastId), {
        headers,
        signal: controller.signal,
        cache: "no-store",
      });
      if (!response.ok) throw await errorFrom(response);
      this.onState("open");
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const parser = new SseParser();
      for (;;) {
        const { value, done } = await reader.read();
        if (done || this.closed) break;
        kick();
        for (const message of parser.feed(decoder.decode(value, { stream: true }))) {
          if (this.closed) break;
          received = true;
          if (message.id !== null && message.id !== "") this.lastId = message.id;
          this.onEvent(message);
        }
      }
    } catch (error) {
      if (this.closed) return received;
      if (error?.name === "AbortError" || error instanceof TypeError) {
        const lost = new Error("network lost");
        lost.network = true;
        throw lost;
      }
      throw error;
    } finally {
      clearTimeout(watchdog);
      controller.abort();
    }
    return received;
  }
}

function defaultFatal(error) {
  // 503 (overloaded) and 5xx are worth waiting for; 4xx will not get better by retrying.
  return error.status >= 400 && error.status < 500 && error.status !== 408 && error.status !== 429;
}

/** Read a whole SSE response (one request, no reconnect): onMessage({event, id, data}). */
export async function readSse(response, onMessage) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    for (const message of parser.feed(decoder.decode(value, { stream: true }))) onMessage(message);
  }
}


function parseData(text) {
  try {
    return JSON.parse(text);
  } catch {
    return { text };
  }
}

/**
 * Follow a run's journal: replay after `after`, then live, each event exactly once (by seq),
 * until its terminal event. handlers: onEvent(event), onTerminal(event), onGap(gap),
 * onState(state, error). Events are {run_id, seq, type, ts, data}.
 */
export function followRun(runs, runId, { after = 0, onEvent, onTerminal, onGap, onState }) {
  let lastSeq = after;
  const client = new SseClient({
    url: () => runs.streamUrl(runId, lastSeq),
    lastId: String(after),
    onState: onState || (() => {}),
    onEvent: (message) => {
      const body = parseData(message.data);
      if (message.event === "gap") {
        const first = Number(body.first_retained ?? body.first_seq ?? lastSeq + 1);
        lastSeq = Math.max(lastSeq, first - 1);
        client.lastId = String(lastSeq);
        onGap?.(body);
        return;
      }
      const seq = Number(body.seq ?? message.id);
      if (!Number.isFinite(seq) || seq <= lastSeq) return; // already rendered: dedupe
      lastSeq = seq;
      client.lastId = String(seq);
      const event = {
        run_id: body.run_id ?? runId,
        seq,
        type: body.type ?? message.event,
        ts: body.ts,
        data: body.data ?? {},
      };
      onEvent?.(event);
      if (TERMINAL_EVENTS.has(event.type)) {
        client.close();
        onTerminal?.(event);
      }
    },
  });
  client.start();
  return {
    close: () => client.close(),
    drop: () => client.drop(),
    get lastSeq() {
      return lastSeq;
    },
    get connections() {
      return client.connections;
    },
  };
}

/** Follow a session's channel (turn_started, session_updated, task_complete) until closed. */
export function followSession(sessionsApi, sessionId, { onEvent, onState }) {
  const client = new SseClient({
    url: () => sessionsApi.eventsUrl(sessionId),
    onState: onState || (() => {}),
    onEvent: (message) => {
      const body = parseData(message.data);
      onEvent({ type: body.type ?? message.event, data: body.data ?? body, raw: body });
    },
  });
  client.start();
  return { close: () => client.close() };
}
