// hangar dashboard. Every data call is the REST API (/api/...), signed in
// by the HttpOnly cookie that POST /ui/signin sets; terminals are a
// WebSocket to /ui/terminal. No build step: plain browser JavaScript.
"use strict";

(() => {
  const main = document.getElementById("main");
  const statusEl = document.getElementById("status");
  const signOutBtn = document.getElementById("signout");
  // Timers and streams of the page shown; cleared when it changes.
  let pageCleanup = [];

  // ---- small helpers -------------------------------------------------

  // h builds an element: h("a", {href: "#"}, "text", child...). Text is
  // always set as text, never parsed as HTML.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function announce(text) { statusEl.textContent = text; }

  // The API prints enums by name ("SESSION_STATE_IDLE") or, with the
  // spec's short names, as "idle": both become "idle".
  const enumPrefixes = ["SESSION_STATE_", "HARNESS_", "TURN_OUTCOME_", "HOLD_KIND_", "EVENT_KIND_", "APPROVAL_STATE_", "APPROVAL_MODE_"];
  function short(v) {
    if (v === undefined || v === null) return "";
    let s = String(v);
    for (const p of enumPrefixes) if (s.startsWith(p)) { s = s.slice(p.length); break; }
    s = s.toLowerCase();
    return s === "unspecified" ? "" : s;
  }
  // int64 fields arrive as strings or numbers.
  function num(v) { const n = Number(v || 0); return Number.isFinite(n) ? n : 0; }

  function when(ts) {
    if (!ts) return "";
    const t = new Date(ts);
    if (isNaN(t)) return "";
    const s = Math.round((Date.now() - t.getTime()) / 1000);
    const abs = Math.abs(s);
    let text;
    if (abs < 60) text = abs + "s";
    else if (abs < 3600) text = Math.round(abs / 60) + "m";
    else if (abs < 86400) text = Math.round(abs / 3600) + "h";
    else text = Math.round(abs / 86400) + "d";
    return s >= 0 ? text + " ago" : "in " + text;
  }
  function timeEl(ts) {
    if (!ts) return h("span", { class: "muted" }, "—");
    return h("time", { datetime: ts, title: new Date(ts).toLocaleString() }, when(ts));
  }

  function badge(state) { return h("span", { class: "badge state-" + state, "data-state": state }, state || "unknown"); }

  function usageText(u) {
    if (!u) return "";
    const tokens = num(u.input_tokens) + num(u.output_tokens);
    const cost = Number(u.cost_usd || 0);
    const parts = [tokens + " tokens"];
    if (num(u.cache_read_tokens)) parts.push(num(u.cache_read_tokens) + " cached");
    if (cost) parts.push("$" + cost.toFixed(4));
    if (num(u.model_calls)) parts.push(num(u.model_calls) + " calls");
    return parts.join(", ");
  }

  // Why a session is awake, or when it will suspend.
  function awakeText(s) {
    const state = short(s.state);
    if (["suspended", "archived", "failed"].includes(state)) return state === "suspended" ? "suspended: resumes on open or send" : "";
    const holds = s.holds || [];
    const reasons = [];
    if (state === "running") reasons.push("a turn is running");
    for (const hold of holds) {
      const kind = short(hold.kind);
      if (kind === "turn" && state === "running") continue;
      reasons.push((kind || "hold") + (hold.description ? " (" + hold.description + ")" : ""));
    }
    if (reasons.length) return "awake: " + reasons.join("; ");
    if (s.suspend_at) return "suspends " + when(s.suspend_at) + " (idle " + idleText(s) + ")";
    if (s.idle_minutes === 0) return "stays up until suspended";
    if (state === "idle" || state === "needs_input") return "up; suspends after " + idleText(s) + " without use";
    return state ? "awake: " + state : "";
  }
  function idleText(s) {
    if (s.idle_minutes === undefined || s.idle_minutes === null) return "30 min (default)";
    if (s.idle_minutes === 0) return "never (stays up)";
    return s.idle_minutes + " min";
  }

  // ---- the API ------------------------------------------------------

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.message) || ("HTTP " + status));
      this.status = status;
      this.body = body;
    }
  }

  // api calls the REST API. State-changing calls carry X-Hangar-Request,
  // which the server requires of cookie-authenticated requests.
  async function api(method, path, body) {
    const opts = { method, credentials: "same-origin", headers: { "X-Hangar-Request": "1" } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(path, opts);
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = { message: text }; }
    if (resp.status === 401) {
      showSignIn();
      throw new APIError(401, data);
    }
    if (!resp.ok) throw new APIError(resp.status, data);
    return data;
  }
  const enc = encodeURIComponent;

  // stream reads a server-streaming REST call (newline-delimited JSON, one
  // {"result": ...} per message) and calls onMessage for each, until the
  // returned function stops it.
  function stream(path, onMessage, onEnd) {
    const ctl = new AbortController();
    (async () => {
      try {
        const resp = await fetch(path, { credentials: "same-origin", headers: { "X-Hangar-Request": "1" }, signal: ctl.signal });
        if (resp.status === 401) { showSignIn(); return; }
        if (!resp.ok || !resp.body) throw new Error("HTTP " + resp.status);
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, i).trim();
            buf = buf.slice(i + 1);
            if (!line) continue;
            const msg = JSON.parse(line);
            if (msg.result) onMessage(msg.result);
          }
        }
        if (onEnd) onEnd(null);
      } catch (err) {
        if (!ctl.signal.aborted && onEnd) onEnd(err);
      }
    })();
    return () => ctl.abort();
  }

  // ---- sign-in -----------------------------------------------------

  async function signIn(token) {
    const resp = await fetch("/ui/signin", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Hangar-Request": "1" },
      body: JSON.stringify({ token }),
    });
    if (resp.status !== 204) {
      let msg = "sign-in failed";
      try { msg = (await resp.json()).message || msg; } catch (_) {}
      throw new Error(msg);
    }
  }

  function showSignIn(message) {
    // Several calls may be refused at once: ask once.
    if (main.querySelector("form.signin") && !message) return;
    clearPage();
    signOutBtn.hidden = true;
    const input = h("input", { id: "token", type: "password", name: "token", autocomplete: "off", required: true, "aria-describedby": "token-help" });
    const err = h("p", { class: "error", id: "signin-error", role: "alert" }, message || "");
    const form = h("form", { class: "signin", method: "post", action: "/ui/signin", "aria-labelledby": "signin-title", onsubmit: async (e) => {
      e.preventDefault();
      err.textContent = "";
      try {
        await signIn(input.value.trim());
        signOutBtn.hidden = false;
        route();
      } catch (e2) { err.textContent = e2.message; }
    } },
      h("h1", { id: "signin-title" }, "Sign in to hangar"),
      h("label", { for: "token" }, "API token"),
      input,
      h("p", { id: "token-help", class: "muted" }, "The token hangar up printed (also in $HANGAR_HOME/token). It is kept in an HttpOnly cookie for this site only."),
      h("button", { type: "submit", class: "primary", id: "signin-submit" }, "Sign in"),
      err);
    main.replaceChildren(form);
    document.title = "Sign in · hangar";
    input.focus();
  }

  signOutBtn.addEventListener("click", async () => {
    await fetch("/ui/signout", { method: "POST", credentials: "same-origin", headers: { "X-Hangar-Request": "1" } });
    showSignIn("Signed out.");
  });

  // ---- pages -------------------------------------------------------

  function clearPage() {
    for (const f of pageCleanup) { try { f(); } catch (_) {} }
    pageCleanup = [];
  }
  function every(ms, f) {
    const id = setInterval(f, ms);
    pageCleanup.push(() => clearInterval(id));
  }

  function route() {
    clearPage();
    const m = location.hash.match(/^#\/s\/(.+)$/);
    if (m) return sessionPage(decodeURIComponent(m[1]));
    return sessionsPage();
  }

  async function listAll() {
    let sessions = [];
    let token = "";
    for (let i = 0; i < 20; i++) {
      const r = await api("GET", "/api/sessions?page_size=200" + (token ? "&page_token=" + enc(token) : ""));
      sessions = sessions.concat(r.sessions || []);
      token = r.next_page_token || "";
      if (!token) break;
    }
    return sessions;
  }

  // The Sessions page: every session, filtered and searched, refreshed
  // every few seconds.
  function sessionsPage() {
    document.title = "Sessions · hangar";
    const search = h("input", { id: "search", type: "search", placeholder: "name, branch, environment", value: sessionStorage.getItem("search") || "" });
    const stateSel = h("select", { id: "state-filter" },
      ["", "running", "idle", "needs_input", "resuming", "suspending", "suspended", "failed", "archived"].map((s) =>
        h("option", { value: s }, s ? s.replace("_", " ") : "all but archived")));
    stateSel.value = sessionStorage.getItem("state") || "";
    const tbody = h("tbody");
    const updated = h("p", { class: "muted", id: "updated" }, "Loading…");
    const table = h("table", { id: "sessions", "aria-describedby": "updated" },
      h("caption", { class: "sr-only" }, "Sessions"),
      h("thead", {}, h("tr", {}, ["Session", "State", "Harness", "Branch", "Last activity", "Awake / suspends"].map((c) => h("th", { scope: "col" }, c)))),
      tbody);
    main.replaceChildren(
      h("h1", {}, "Sessions"),
      h("div", { class: "filters", role: "search" },
        h("div", {}, h("label", { for: "search" }, "Search"), search),
        h("div", {}, h("label", { for: "state-filter" }, "State"), stateSel)),
      table, updated);
    let sessions = [];
    const render = () => {
      const q = search.value.trim().toLowerCase();
      const want = stateSel.value;
      sessionStorage.setItem("search", search.value);
      sessionStorage.setItem("state", want);
      const rows = sessions.filter((s) => {
        const st = short(s.state);
        if (want ? st !== want : st === "archived") return false;
        if (!q) return true;
        return [s.name, s.branch, s.environment, s.repo].some((f) => (f || "").toLowerCase().includes(q));
      });
      tbody.replaceChildren(...rows.map((s) => h("tr", { "data-session": s.name },
        h("td", {}, h("a", { href: "#/s/" + enc(s.name) }, s.name)),
        h("td", {}, badge(short(s.state))),
        h("td", {}, short(s.harness)),
        h("td", {}, h("code", {}, s.branch || "")),
        h("td", { class: "num" }, timeEl(s.last_active_at)),
        h("td", {}, awakeText(s)))));
      if (!rows.length) tbody.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "muted" }, sessions.length ? "No session matches." : "No sessions yet: start one with hangar session new NAME \"message\".")));
    };
    search.addEventListener("input", render);
    stateSel.addEventListener("change", render);
    const load = async () => {
      try {
        sessions = await listAll();
        sessions.sort((a, b) => String(b.last_active_at || "").localeCompare(String(a.last_active_at || "")));
        render();
        updated.textContent = sessions.length + " sessions · updated " + new Date().toLocaleTimeString();
      } catch (err) {
        if (err.status !== 401) updated.textContent = "Could not load sessions: " + err.message;
      }
    };
    load();
    every(3000, load);
  }

  // One session's page.
  function sessionPage(name) {
    document.title = name + " · hangar";
    const title = h("h1", {}, h("span", { id: "session-name" }, name), h("span", { id: "session-state" }));
    const facts = h("dl", { class: "facts", id: "facts" });
    const progress = h("p", { class: "progress", id: "progress", role: "status", "aria-live": "polite" });
    const actionErr = h("p", { class: "error", id: "action-error", role: "alert" });
    const questionBox = h("div", { id: "question" });
    const approvalsBox = h("div", { id: "approvals" });
    const turnsBody = h("tbody");
    const eventsList = h("ol", { class: "events", id: "events", "aria-label": "Events", tabindex: "0" });
    const checkpointsList = h("ul", { id: "checkpoints" });
    const patchBox = h("div", { id: "patch" }, h("p", { class: "muted" }, "Loading…"));
    const forksBox = h("div", { id: "forks" });
    const artifactsList = h("ul", { id: "artifacts" });
    const terminalBox = h("div", { id: "terminal-box" });

    // Actions.
    const act = async (label, f) => {
      actionErr.textContent = "";
      announce(label + "…");
      try {
        await f();
        announce(label + ": done");
        await load();
      } catch (err) {
        if (err.status !== 401) actionErr.textContent = label + ": " + err.message;
      }
    };
    const idleInput = h("input", { id: "idle", type: "number", min: 0, step: 1, "aria-describedby": "idle-help" });
    const forkInput = h("input", { id: "fork-n", type: "number", min: 1, max: 16, value: 1 });
    const message = h("textarea", { id: "message", name: "message", required: true });
    const sendBtn = h("button", { type: "submit", class: "primary", id: "send" }, "Send");
    const actions = h("div", { class: "actions", role: "group", "aria-label": "Session actions" },
      h("button", { type: "button", id: "open", onclick: () => act("Open", () => api("POST", "/api/sessions/" + enc(name) + ":open", {})) }, "Open"),
      h("button", { type: "button", id: "suspend", onclick: () => act("Suspend", () => api("POST", "/api/sessions/" + enc(name) + ":suspend", {})) }, "Suspend"),
      h("button", { type: "button", id: "archive", class: "danger", onclick: () => {
        if (confirm("Archive " + name + "? Its checkpoints are kept; it is hidden from the list.")) act("Archive", () => api("POST", "/api/sessions/" + enc(name) + ":archive", {}));
      } }, "Archive"),
      h("form", { id: "keep-form", onsubmit: (e) => {
        e.preventDefault();
        act("Set idle time", () => api("POST", "/api/sessions/" + enc(name) + ":keep", { idle_minutes: Number(idleInput.value) }));
      } }, h("label", { for: "idle" }, "Idle time (min)"), idleInput, h("button", { type: "submit", id: "keep" }, "Set"),
        h("span", { id: "idle-help", class: "sr-only" }, "Minutes without use before the session suspends; 0 keeps it up.")),
      h("form", { id: "fork-form", onsubmit: (e) => {
        e.preventDefault();
        act("Fork", async () => {
          const r = await api("POST", "/api/sessions/" + enc(name) + "/fork", { n: Number(forkInput.value) });
          progress.textContent = "Forked: " + (r.forks || []).map((f) => f.name).join(", ");
        });
      } }, h("label", { for: "fork-n" }, "Forks"), forkInput, h("button", { type: "submit", id: "fork" }, "Fork")));

    let followTurn = 0;
    const sendForm = h("form", { id: "send-form", onsubmit: (e) => {
      e.preventDefault();
      const text = message.value.trim();
      if (!text) return;
      sendBtn.disabled = true;
      act("Send", async () => {
        progress.textContent = "Sending…";
        const r = await api("POST", "/api/sessions/" + enc(name) + "/turns", { message: text });
        followTurn = (r.turn && r.turn.number) || 0;
        progress.textContent = "Turn " + followTurn + " running…";
        message.value = "";
      }).finally(() => { sendBtn.disabled = false; });
    } },
      h("label", { for: "message" }, "Message the agent"), message,
      h("div", { class: "actions" }, sendBtn, h("span", { class: "muted" }, "Resumes the session if it is suspended.")));

    const termButtons = h("div", { class: "actions", role: "group", "aria-label": "Terminals" },
      h("button", { type: "button", id: "open-shell", onclick: () => openTerminal(name, "shell", terminalBox) }, "Open a shell"),
      h("button", { type: "button", id: "talk-agent", onclick: () => openTerminal(name, "agent", terminalBox) }, "Talk to the agent here"));

    main.replaceChildren(
      h("p", {}, h("a", { href: "#/" }, "← Sessions")),
      title,
      h("div", { class: "grid" },
        h("section", { class: "panel", "aria-labelledby": "h-about" }, h("h2", { id: "h-about" }, "About"), facts),
        h("section", { class: "panel", "aria-labelledby": "h-act" }, h("h2", { id: "h-act" }, "Work with it"), actions, sendForm, progress, actionErr, termButtons)),
      terminalBox,
      questionBox, approvalsBox,
      h("section", { "aria-labelledby": "h-turns" }, h("h2", { id: "h-turns" }, "Turns"),
        h("table", { id: "turns" }, h("thead", {}, h("tr", {}, ["#", "Message", "Outcome", "Usage", "Summary"].map((c) => h("th", { scope: "col" }, c)))), turnsBody)),
      h("div", { class: "grid" },
        h("section", { "aria-labelledby": "h-events" }, h("h2", { id: "h-events" }, "Events (live)"), eventsList),
        h("section", { "aria-labelledby": "h-forks" }, h("h2", { id: "h-forks" }, "Forks"), forksBox,
          h("h2", { id: "h-cp" }, "Checkpoints"), checkpointsList,
          h("h2", { id: "h-art" }, "Artifacts"), artifactsList)),
      h("section", { "aria-labelledby": "h-patch" }, h("h2", { id: "h-patch" }, "Patch"), patchBox));

    let lastTurns = "";
    let patchFor = null;
    let idleEdited = false;
    idleInput.addEventListener("input", () => { idleEdited = true; });
    const load = async () => {
      let s;
      try {
        s = (await api("GET", "/api/sessions/" + enc(name))).session;
      } catch (err) {
        if (err.status === 404) main.replaceChildren(h("h1", {}, "No session " + name), h("p", {}, h("a", { href: "#/" }, "← Sessions")));
        else if (err.status !== 401) actionErr.textContent = "Could not load: " + err.message;
        throw err;
      }
      const state = short(s.state);
      title.querySelector("#session-state").replaceChildren(badge(state));
      const rows = [
        ["Environment", s.environment], ["Harness", short(s.harness)], ["Branch", h("code", {}, s.branch || "")],
        ["Idle time", h("span", { id: "idle-time" }, idleText(s))], ["Status", h("span", { id: "awake" }, awakeText(s))],
        ["Last activity", timeEl(s.last_active_at)], ["Created", timeEl(s.created_at)],
        ["Sandbox", s.sandbox_id || "—"], ["Resume", s.resume_command ? h("code", {}, s.resume_command) : "—"],
        ["Usage", usageText(s.usage) || "—"],
      ];
      if (s.parent_id) rows.push(["Forked from", h("a", { href: "#/s/" + enc(s.parent_id) }, s.parent_id)]);
      if (s.state_reason) rows.push(["Why", s.state_reason]);
      facts.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
      if (!idleEdited) idleInput.value = s.idle_minutes === undefined || s.idle_minutes === null ? 30 : s.idle_minutes;

      const turns = s.turns || [];
      const sig = JSON.stringify(turns.map((t) => [t.number, t.outcome, t.summary]));
      if (sig !== lastTurns) {
        lastTurns = sig;
        turnsBody.replaceChildren(...turns.slice().reverse().map((t) => {
          const outcome = short(t.outcome) || (t.ended_at ? "" : "running");
          return h("tr", { "data-turn": t.number },
            h("td", { class: "num" }, t.number),
            h("td", {}, t.message || ""),
            h("td", {}, h("span", { class: "outcome-" + outcome, "data-outcome": outcome }, outcome), t.outcome_reason ? h("div", { class: "muted" }, t.outcome_reason) : null),
            h("td", { class: "num" }, usageText(t.usage)),
            h("td", {}, t.summary || t.result || ""));
        }));
        if (!turns.length) turnsBody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No turns yet.")));
      }
      if (followTurn) {
        const t = turns.find((x) => x.number === followTurn);
        if (t && short(t.outcome)) {
          progress.textContent = "Turn " + followTurn + " finished: " + short(t.outcome);
          followTurn = 0;
        } else if (state === "resuming") progress.textContent = "Resuming the session…";
        else if (state === "running") progress.textContent = "Turn " + followTurn + " running…";
      }

      // The open question.
      if (s.question && s.question.text) {
        const answer = h("textarea", { id: "answer" });
        questionBox.replaceChildren(h("section", { class: "panel question", "aria-labelledby": "h-q" },
          h("h2", { id: "h-q" }, "The agent asks"), h("p", {}, s.question.text),
          h("form", { onsubmit: (e) => {
            e.preventDefault();
            act("Answer", () => api("POST", "/api/sessions/" + enc(name) + "/turns", { message: answer.value }));
          } }, h("label", { for: "answer" }, "Your answer"), answer, h("button", { type: "submit", class: "primary" }, "Answer"))));
      } else questionBox.replaceChildren();

      checkpointsList.replaceChildren(...(s.checkpoints || []).slice().reverse().map((c) =>
        h("li", {}, h("code", {}, c.id), " · turn ", c.turn || 0, " · ", c.reason || "", " · ", timeEl(c.created_at),
          c.damaged ? h("span", { class: "error" }, " damaged: " + c.damaged) : null)));
      if (!(s.checkpoints || []).length) checkpointsList.replaceChildren(h("li", { class: "muted" }, "None yet."));

      // What changes less often: when a turn ended or a checkpoint came.
      const key = sig + (s.checkpoints || []).length;
      if (key !== patchFor) {
        patchFor = key;
        loadPatch();
        loadArtifacts(s);
        loadForks(s);
      }
      loadApprovals();
      return s;
    };

    const loadPatch = async () => {
      try {
        const r = await api("GET", "/api/sessions/" + enc(name) + "/patch");
        patchBox.replaceChildren(diffView(r.patch || ""));
      } catch (err) {
        patchBox.replaceChildren(h("p", { class: "muted" }, "No patch: " + err.message));
      }
    };
    // Each turn's artifacts (the session's record has them; the list call
    // is not needed).
    const loadArtifacts = (s) => {
      const arts = (s.turns || []).flatMap((t) => (t.artifacts || []).map((a) => Object.assign({ turn: t.number }, a)));
      artifactsList.replaceChildren(...arts.map((a) => h("li", {},
        h("button", { type: "button", class: "link", onclick: () => download(name, a) }, a.path), " · ", num(a.size_bytes), " bytes · turn ", a.turn || 0)));
      if (!arts.length) artifactsList.replaceChildren(h("li", { class: "muted" }, "None."));
    };
    const loadApprovals = async () => {
      try {
        const r = await api("GET", "/api/sessions/" + enc(name) + "/approvals");
        const pending = (r.approvals || []).filter((a) => short(a.state) === "pending");
        approvalsBox.replaceChildren(...(pending.length ? [h("section", { class: "panel question", "aria-labelledby": "h-ap" },
          h("h2", { id: "h-ap" }, "Waiting for your approval"),
          h("ul", {}, pending.map((a) => h("li", {}, h("code", {}, a.tool_name), " ", h("code", {}, a.input_json || ""), " ",
            h("button", { type: "button", onclick: () => act("Allow", () => api("POST", "/api/sessions/" + enc(name) + "/approvals/" + enc(a.id), { allow: true })) }, "Allow"), " ",
            h("button", { type: "button", class: "danger", onclick: () => act("Deny", () => api("POST", "/api/sessions/" + enc(name) + "/approvals/" + enc(a.id), { allow: false })) }, "Deny")))))] : []));
      } catch (_) { approvalsBox.replaceChildren(); }
    };
    const loadForks = async (s) => {
      try {
        const all = await listAll();
        const byName = new Map(all.map((x) => [x.name, x]));
        let root = s;
        for (let i = 0; i < 50 && root.parent_id && byName.has(root.parent_id); i++) root = byName.get(root.parent_id);
        const children = (n) => all.filter((x) => x.parent_id === n).sort((a, b) => a.name.localeCompare(b.name));
        const node = (x) => h("li", { "data-fork": x.name },
          x.name === name ? h("span", { class: "current", "aria-current": "page" }, x.name) : h("a", { href: "#/s/" + enc(x.name) }, x.name),
          " ", badge(short(x.state)),
          children(x.name).length ? h("ul", { class: "tree" }, children(x.name).map(node)) : null);
        if (root.name === name && !children(name).length) forksBox.replaceChildren(h("p", { class: "muted" }, "No forks."));
        else forksBox.replaceChildren(h("ul", { class: "tree root", "aria-label": "Fork tree" }, node(root)));
      } catch (_) {}
    };

    // Events, live: what was recorded, then what comes.
    let lastSeq = 0;
    const addEvent = (ev) => {
      const seq = num(ev.seq);
      if (seq && seq <= lastSeq) return;
      lastSeq = Math.max(lastSeq, seq);
      const text = ev.text || ev.path || (ev.usage ? usageText(ev.usage) : "");
      eventsList.append(h("li", { "data-seq": seq }, h("span", { class: "muted" }, "#" + (ev.turn || 0) + " "), h("span", { class: "kind" }, short(ev.kind)), " ", text));
      while (eventsList.children.length > 500) eventsList.firstChild.remove();
      eventsList.scrollTop = eventsList.scrollHeight;
    };
    let stopStream = null;
    const follow = () => {
      stopStream = stream("/api/sessions/" + enc(name) + "/events:stream?after_seq=" + lastSeq, (r) => { if (r.event) addEvent(r.event); },
        () => {
          // The stream ended (a restart, a network blip): follow again.
          const t = setTimeout(follow, 2000);
          pageCleanup.push(() => clearTimeout(t));
        });
    };
    pageCleanup.push(() => { if (stopStream) stopStream(); });
    (async () => {
      try {
        await load();
        follow();
      } catch (_) {}
    })();
    every(2000, () => load().catch(() => {}));
  }

  function diffView(patch) {
    if (!patch) return h("p", { class: "muted" }, "No changes yet.");
    const pre = h("pre", { class: "diff", tabindex: "0", "aria-label": "Patch" });
    for (const line of patch.replace(/\n$/, "").split("\n")) {
      let cls = "";
      if (line.startsWith("diff --git") || line.startsWith("+++ ") || line.startsWith("--- ")) cls = "file";
      else if (line.startsWith("@@")) cls = "hunk";
      else if (line.startsWith("+")) cls = "add";
      else if (line.startsWith("-")) cls = "del";
      pre.append(h("span", { class: cls }, line || " "));
    }
    return pre;
  }

  async function download(name, a) {
    try {
      const r = await api("GET", "/api/sessions/" + enc(name) + "/artifacts/" + a.path.split("/").map(enc).join("/"));
      const bin = atob(r.content || "");
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const url = URL.createObjectURL(new Blob([bytes], { type: a.content_type || "application/octet-stream" }));
      const link = h("a", { href: url, download: a.path.split("/").pop() });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) { announce("Download failed: " + err.message); }
  }

  // ---- terminals ---------------------------------------------------

  // openTerminal opens a pty in the session's sandbox over a WebSocket:
  // kind "shell" (the work tree) or "agent" (the agent CLI in its own
  // conversation). While it is open the session is held awake.
  function openTerminal(name, kind, box) {
    const old = box.querySelector(".terminal-panel");
    if (old && old.close) old.close();
    const label = kind === "agent" ? "Agent (" + name + ")" : "Shell (" + name + ")";
    const info = h("span", { id: "terminal-status", role: "status" }, "Connecting…");
    const closeBtn = h("button", { type: "button", id: "terminal-close" }, "Close terminal");
    const area = h("div", { class: "terminal", id: "terminal", "data-kind": kind, role: "region", "aria-label": label + " terminal" });
    const panel = h("section", { class: "terminal-panel", "aria-label": label },
      h("header", {}, h("strong", {}, label), info, closeBtn), area);
    box.replaceChildren(panel);
    const term = new window.Terminal({ fontSize: 13, cursorBlink: true, scrollback: 5000, screenReaderMode: false,
      theme: { background: "#1e1e1e" } });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(area);
    try { fit.fit(); } catch (_) {}
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(proto + "//" + location.host + "/ui/terminal?session=" + enc(name) + "&kind=" + kind + "&rows=" + term.rows + "&cols=" + term.cols);
    ws.binaryType = "arraybuffer";
    const textEnc = new TextEncoder();
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        const m = JSON.parse(e.data);
        if (m.type === "ready") { info.textContent = m.command ? "running " + m.command : "connected"; panel.dataset.ready = "1"; }
        else if (m.type === "exit") { info.textContent = "exited (" + (m.code || 0) + ")"; term.write("\r\n[exited with code " + (m.code || 0) + "]\r\n"); }
        else if (m.type === "error") { info.textContent = "error"; term.write("\r\n\x1b[31m" + m.message + "\x1b[0m\r\n"); panel.dataset.error = m.message; }
        return;
      }
      term.write(new Uint8Array(e.data));
    };
    ws.onclose = () => { if (!info.textContent.startsWith("exited") && info.textContent !== "error") info.textContent = "closed"; };
    term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(textEnc.encode(d)); });
    term.onResize(({ rows, cols }) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows, cols })); });
    const onWinResize = () => { try { fit.fit(); } catch (_) {} };
    window.addEventListener("resize", onWinResize);
    panel.close = () => {
      window.removeEventListener("resize", onWinResize);
      ws.close();
      term.dispose();
      panel.remove();
    };
    closeBtn.addEventListener("click", () => panel.close());
    pageCleanup.push(() => { if (panel.isConnected) panel.close(); });
    window.hangarTerminal = term; // for tests and the console
    term.focus();
  }

  // ---- start -------------------------------------------------------

  async function start() {
    const m = location.hash.match(/^#token=(.+)$/);
    if (m) {
      // The one-click sign-in URL hangar up prints: the token travels in
      // the fragment (never sent to a server), leaves the address bar now.
      history.replaceState(null, "", location.pathname + "#/");
      try { await signIn(decodeURIComponent(m[1])); } catch (err) { return showSignIn(err.message); }
    }
    signOutBtn.hidden = false;
    window.addEventListener("hashchange", route);
    route();
  }
  start();
})();
