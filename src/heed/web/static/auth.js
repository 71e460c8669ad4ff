// auth.js: the UI session. Asks the server whether API keys are required; when they are and
// nobody is logged in (at start-up, or after any 401) it shows the login form in place of the
// app; it hands api.js the CSRF token and runs the top bar's "Log out". Without keys: invisible.

import { auth, onUnauthorized, setCsrfToken } from "./api.js";
import { describeError, h, showNotice } from "./ui.js";

const session = { keysRequired: false, tenant: null };
let shown = null; // the login form's section while it is on screen

/**
 * Resolves once the app may call the API: at once without keys, else after a login.
 * onLock(): a 401 ended the session (the form is up: stop streams and polls).
 * onRelogin(): the same tenant logged in again after a 401 (reload what the page shows); another
 * tenant's key starts the page afresh instead, so nothing of the first one shows.
 */
export async function startSession({ onLock = () => {}, onRelogin = () => {} } = {}) {
  document.getElementById("logout").addEventListener("click", logout);
  onUnauthorized(() => {
    if (!session.keysRequired || shown) return;
    onLock();
    login().then((tenant) => {
      if (tenant !== session.tenant) {
        restart();
      } else {
        loggedIn(tenant);
        onRelogin();
      }
    });
  });
  let state;
  try {
    state = await auth.session();
  } catch (error) {
    // 401: a session cookie the server no longer accepts; else the pages report the trouble.
    state = { keys_required: error.status === 401, authenticated: false };
  }
  session.keysRequired = Boolean(state.keys_required);
  if (!session.keysRequired) return;
  if (state.authenticated) {
    setCsrfToken(state.csrf_token);
    loggedIn(state.tenant);
    return;
  }
  loggedIn(await login());
}

function loggedIn(tenant) {
  session.tenant = tenant;
  document.body.classList.remove("locked");
  document.getElementById("logout").hidden = false;
}

/** Show the login form until a key is accepted; resolves to its tenant (the app stays hidden). */
function login() {
  document.body.classList.add("locked");
  document.getElementById("logout").hidden = true;
  return new Promise((resolve) => {
    const key = h("input", {
      id: "login-key",
      name: "key",
      type: "password",
      autocomplete: "current-password",
      required: true,
    });
    const error = h("p", { id: "login-error", class: "error", role: "alert" });
    const button = h("button", { type: "submit", id: "login-submit" }, "Log in");
    const submit = async (event) => {
      event.preventDefault();
      button.disabled = true;
      error.textContent = "";
      try {
        const body = await auth.login(key.value.trim());
        setCsrfToken(body.csrf_token);
        shown.remove();
        shown = null;
        resolve(body.tenant);
      } catch (failure) {
        error.textContent = failure.status === 401 ? failure.detail || "unknown API key" : describeError(failure);
        key.select();
      } finally {
        button.disabled = false;
      }
    };
    shown = h(
      "section",
      { id: "login", class: "login", "aria-labelledby": "login-title" },
      h(
        "form",
        { id: "login-form", class: "card login-form", onsubmit: submit },
        h("h2", { id: "login-title" }, "Log in"),
        h("p", { class: "muted" }, "This server needs an API key."),
        h("label", { for: "login-key" }, "API key"),
        key,
        error,
        button,
      ),
    );
    document.getElementById("app").before(shown);
    key.focus();
  });
}

/** End the session, then start the page afresh: nothing of this tenant stays in memory. */
async function logout() {
  try {
    await auth.logout();
  } catch (error) {
    if (error.status !== 401) {
      showNotice("error", `Could not log out: ${describeError(error)}`);
      return;
    }
  }
  setCsrfToken(null);
  restart();
}

function restart() {
  location.replace(location.pathname);
}
