// events.js: the names of journal events, the same set as heed.runs.events.EventType (a test
// keeps the two equal). Payloads are described there; every renderer reads these names only.

export const EVENT = Object.freeze({
  STARTED: "started",
  REQUEUED: "requeued",
  COMPLETED: "completed",
  FAILED: "failed",
  CANCELLED: "cancelled",
  INTERRUPTED: "interrupted",
  USER_MESSAGE: "user_message",
  TEXT_DELTA: "text_delta",
  TOOL_CALL: "tool_call",
  TOOL_RESULT: "tool_result",
  MESSAGE: "message",
  PROGRESS: "progress",
});

/** Event types after which a run's journal has nothing more. */
export const TERMINAL_EVENTS = new Set([EVENT.COMPLETED, EVENT.FAILED, EVENT.CANCELLED, EVENT.INTERRUPTED]);
