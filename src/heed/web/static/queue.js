// queue.js: messages typed while a session is busy, kept in localStorage so a reload keeps them.
// Shared by every tab of the origin: changes from another tab arrive as "storage" events.

const key = (sessionId) => `heed.queue.${sessionId}`;

function read(sessionId) {
  try {
    const value = JSON.parse(localStorage.getItem(key(sessionId)) || "[]");
    return Array.isArray(value) ? value.filter((m) => m && typeof m.text === "string") : [];
  } catch {
    return [];
  }
}

function write(sessionId, items) {
  if (items.length) localStorage.setItem(key(sessionId), JSON.stringify(items));
  else localStorage.removeItem(key(sessionId));
}

export const queue = {
  items: (sessionId) => read(sessionId),

  push(sessionId, text) {
    const items = read(sessionId);
    const item = { id: `q${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, text };
    items.push(item);
    write(sessionId, items);
    return item;
  },

  /** Put a message back at the head (its send failed and will be retried). */
  unshift(sessionId, item) {
    const items = read(sessionId).filter((m) => m.id !== item.id);
    items.unshift(item);
    write(sessionId, items);
  },

  /** Take the head off the queue (read-modify-write in one synchronous step). */
  take(sessionId) {
    const items = read(sessionId);
    const head = items.shift() ?? null;
    write(sessionId, items);
    return head;
  },

  remove(sessionId, id) {
    write(sessionId, read(sessionId).filter((m) => m.id !== id));
  },

  drop(sessionId) {
    localStorage.removeItem(key(sessionId));
  },

  /** Call fn(sessionId) when another tab changes a queue. Returns an unsubscribe function. */
  watch(fn) {
    const listener = (event) => {
      if (event.key && event.key.startsWith("heed.queue.")) fn(event.key.slice("heed.queue.".length));
    };
    window.addEventListener("storage", listener);
    return () => window.removeEventListener("storage", listener);
  },

  /** Run fn while holding the session's queue lock (one tab drains at a time). */
  async exclusive(sessionId, fn) {
    if (navigator.locks?.request) {
      return navigator.locks.request(`heed.queue.${sessionId}`, { ifAvailable: true }, (lock) =>
        lock ? fn() : null,
      );
    }
    return fn();
  },
};

// The events of a run being streamed, kept per tab so a reload resumes after the last seq
// instead of starting over (sessionStorage: it survives a reload, not the tab).
const runKey = (runId) => `heed.run.${runId}`;
const MAX_CACHED_EVENTS = 5000;

export const runCache = {
  load(runId) {
    try {
      const value = JSON.parse(sessionStorage.getItem(runKey(runId)) || "null");
      return value && Array.isArray(value.events) ? value.events : [];
    } catch {
      return [];
    }
  },

  save(runId, events) {
    if (events.length > MAX_CACHED_EVENTS) return this.drop(runId);
    try {
      sessionStorage.setItem(runKey(runId), JSON.stringify({ events }));
    } catch {
      this.drop(runId); // quota: a reload replays from the start instead
    }
  },

  drop(runId) {
    sessionStorage.removeItem(runKey(runId));
  },

  /** Forget cached runs other than *keep* (runs that ended while the page was away). */
  prune(keep) {
    for (let i = sessionStorage.length - 1; i >= 0; i--) {
      const k = sessionStorage.key(i);
      if (k?.startsWith("heed.run.") && !keep.has(k.slice("heed.run.".length))) {
        sessionStorage.removeItem(k);
      }
    }
  },
};
