// app.js: the entry point: the login first (auth.js), then routes (#/chat/<id>, #/memory/<bank>[/<tab>]),
// server health, tab visibility, and the narrow-screen sidebar toggle. Each page lives in its own
// module.

import { sessions as sessionsApi, system } from "./api.js";
import { startSession } from "./auth.js";
import { ChatView, config } from "./chat.js";
import { MemoryPage } from "./memory.js";
import { SessionsPanel } from "./sessions.js";
import { hideNotice, showNotice } from "./ui.js";

const $ = (id) => document.getElementById(id);
const statusEl = $("server-status");

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

checkHealth();
// The pages call the API as soon as they exist: only once the UI session is settled.
await startSession({
  onLock: () => chat.close(),
  onRelogin: () => reloadRoute(),
});

const sessionsPanel = new SessionsPanel($("session-sidebar"), { navigate });
const chat = new ChatView($("chat"), {
  onStatus: (id, { busy }) => sessionsPanel.setBusy(id, busy),
  onDeleted: () => sessionsPanel.refresh().then(() => navigate("#/chat")),
});
const memoryPage = new MemoryPage($("memory-view"), { navigate });

let sessionsLoaded = false;

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [page = "chat", id = "", tab = ""] = parts;
  return { page: page === "memory" ? "memory" : "chat", id, tab };
}

async function route({ force = false } = {}) {
  const { page, id, tab } = parseRoute();
  $("chat-view").hidden = page !== "chat";
  $("memory-view").hidden = page !== "memory";
  for (const link of document.querySelectorAll("nav.pages a")) {
    const current = link.dataset.page === page;
    link.classList.toggle("current", current);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  setDrawer(false);
  if (page === "memory") {
    chat.close();
    document.title = id ? `${id} · memory · heed` : "memory · heed";
    await memoryPage.show(id, tab);
    return;
  }
  memoryPage.close();
  if (!sessionsLoaded) {
    sessionsLoaded = true;
    await sessionsPanel.refresh();
  } else {
    sessionsPanel.loadBanks();
  }
  let sessionId = id;
  if (!sessionId && sessionsPanel.items.length) {
    sessionId = sessionsPanel.items[0].id;
    history.replaceState(null, "", `#/chat/${encodeURIComponent(sessionId)}`);
  }
  sessionsPanel.setCurrent(sessionId || null);
  if (force || sessionId !== chat.sessionId || !sessionId) await chat.open(sessionId || null);
  document.title = sessionId ? `${chat.title.textContent} · heed` : "heed";
}

/** After logging in again (a 401 ended the session): the same route, read afresh. */
function reloadRoute() {
  hideNotice("error");
  sessionsLoaded = false;
  sessionsPanel.loadBanks();
  route({ force: true });
}

// --- narrow screens: the sidebar is a drawer ---

function setDrawer(open) {
  document.body.classList.toggle("drawer-open", open);
  $("drawer-toggle").setAttribute("aria-expanded", String(open));
}

$("drawer-toggle").addEventListener("click", () => {
  const open = !document.body.classList.contains("drawer-open");
  setDrawer(open);
  if (open) (document.querySelector("#session-sidebar a, #bank-sidebar a, #session-sidebar input") || document.body).focus();
});

document.querySelector(".scrim").addEventListener("click", () => setDrawer(false));

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && document.body.classList.contains("drawer-open")) setDrawer(false);
  // Alt+N: new session; "/" focuses the composer (when not typing elsewhere).
  if (event.altKey && event.key.toLowerCase() === "n") {
    event.preventDefault();
    navigate("#/chat");
    $("new-session-title")?.focus();
  } else if (event.key === "/" && !/INPUT|TEXTAREA|SELECT/.test(document.activeElement?.tagName ?? "")) {
    event.preventDefault();
    if ($("chat-view").hidden) memoryPage.focusInput();
    else $("message-input")?.focus();
  }
});

// --- tab visibility: a hidden tab closes its streams and polls the status ---

document.addEventListener("visibilitychange", () => {
  const visible = document.visibilityState !== "hidden";
  chat.setVisible(visible);
  memoryPage.setVisible(visible, { shown: !$("memory-view").hidden });
  if (visible) sessionsPanel.pollStatuses();
});

// --- server health and network state ---

async function checkHealth() {
  try {
    const body = await system.health();
    const healthy = body?.status === "healthy";
    statusEl.textContent = healthy ? "server healthy" : "server unhealthy";
    statusEl.className = healthy ? "status ok" : "status error";
    hideNotice("network");
  } catch (error) {
    statusEl.textContent = error.status === 0 ? "network lost" : "server unhealthy";
    statusEl.className = "status error";
  }
}

window.addEventListener("offline", () => showNotice("network", "Network lost: you are offline.", "warn"));
window.addEventListener("online", () => {
  hideNotice("network");
  checkHealth();
});
window.addEventListener("hashchange", () => route());

// For tests and debugging: the tunables and the live objects (read-only use).
window.heed = { config, chat, sessionsPanel, memoryPage, sessionsApi };

route();
