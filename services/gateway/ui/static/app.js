// Corral's web UI: reads the gateway's /v1 API (Nomad's shapes) from the
// browser and stays live from /v1/event/stream (NDJSON), falling back to
// blocking queries (?index=) where the stream is not served. No build step,
// no dependency: the pages are server-rendered shells this script fills in.
"use strict";

const UI = document.body.dataset.ui || "/ui";
const PAGE = document.body.dataset.page;
const TOKEN_KEY = "corral.token";
const REGION_KEY = "corral.region";

// ------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The highest X-Nomad-Index any read answered: the event stream starts
// there, so a change committed between a page's first read and the stream's
// start is not missed (a few events seen twice only refresh twice).
let SEEN_INDEX = 0;

// Every long-lived request (event stream, blocking query, log stream) is
// aborted when the page goes away: Chromium otherwise keeps their
// connections, and six of them exhaust the per-host limit so the next page
// waits for one to time out.
const PAGE_ABORT = new AbortController();
window.addEventListener("pagehide", () => PAGE_ABORT.abort());
window.addEventListener("beforeunload", () => PAGE_ABORT.abort());

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

// The region every request is for (the header's region switcher; none: the
// gateway's own region). The gateway passes ?region= on, and a state server
// forwards what names another region.
function region() {
  return localStorage.getItem(REGION_KEY) || "";
}

function withRegion(path) {
  const r = region();
  if (!r) return path;
  return path + (path.includes("?") ? "&" : "?") + "region=" + encodeURIComponent(r);
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const t = token();
  if (t) h["X-Nomad-Token"] = t;
  return h;
}

async function api(path, opts) {
  opts = opts || {};
  const init = { method: opts.method || "GET", headers: headers(opts.headers), signal: opts.signal };
  if (opts.body !== undefined) {
    init.body = typeof opts.body === "string" ? opts.body : JSON.stringify(opts.body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(withRegion(path), init);
  const text = await resp.text();
  if (!resp.ok) {
    throw new ApiError(resp.status, (text || resp.statusText).trim());
  }
  const index = Number(resp.headers.get("X-Nomad-Index") || 0);
  if (init.method === "GET" && index > SEEN_INDEX) SEEN_INDEX = index;
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch (e) {
      body = text;
    }
  }
  return { body: body, index: index, nextToken: resp.headers.get("X-Nomad-NextToken") || "" };
}

async function get(path) {
  return (await api(path)).body;
}

function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") s.append(k, v);
  }
  const out = s.toString();
  return out ? "?" + out : "";
}

// ------------------------------------------------------------------ DOM

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function $(id) {
  return document.getElementById(id);
}

function fill(tableId, rows, empty) {
  const tbody = $(tableId).querySelector("tbody");
  const cols = $(tableId).querySelectorAll("thead th").length;
  tbody.replaceChildren(
    ...(rows.length ? rows : [h("tr", { class: "empty" }, h("td", { colspan: cols }, empty || "none"))])
  );
}

function meta(dlId, pairs) {
  $(dlId).replaceChildren(...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function badge(status) {
  return h("span", { class: "badge s-" + String(status || "unknown").replace(/[^a-z-]/gi, "") }, status || "—");
}

function link(path, text) {
  return h("a", { href: UI + path }, text);
}

function short(id) {
  return (id || "").slice(0, 8);
}

function nsq(ns) {
  return ns && ns !== "default" ? "?namespace=" + encodeURIComponent(ns) : "";
}

function jobLink(id, ns) {
  return link("/jobs/" + encodeURIComponent(id) + nsq(ns), id);
}

function allocLink(id) {
  return link("/allocations/" + encodeURIComponent(id), short(id));
}

function evalLink(id) {
  return link("/evaluations/" + encodeURIComponent(id), short(id));
}

function nodeLink(id, text) {
  return link("/nodes/" + encodeURIComponent(id), text || short(id));
}

// Nomad's times are int64 Unix nanoseconds, or RFC 3339 strings where its
// struct holds a Go time.Time (Go's zero time = unset): milliseconds or null.
// One row renderer per object: a table names the columns it shows, in
// order; every table of allocations (job, evaluation, node pages) and of
// evaluations (job and evaluations pages) builds its rows here.
const ALLOC_CELLS = {
  id: (a) => h("td", {}, allocLink(a.ID)),
  name: (a) => h("td", {}, a.Name),
  job: (a) => h("td", {}, jobLink(a.JobID, a.Namespace)),
  group: (a) => h("td", {}, a.TaskGroup),
  node: (a) => h("td", {}, a.NodeID ? nodeLink(a.NodeID, a.NodeName || short(a.NodeID)) : "—"),
  version: (a) => h("td", {}, a.JobVersion),
  desired: (a) => h("td", {}, a.DesiredStatus),
  status: (a) => h("td", {}, badge(a.ClientStatus)),
  modified: (a) => h("td", {}, ago(a.ModifyTime)),
  created: (a) => h("td", {}, fmtTime(a.CreateTime)),
  cpu: (a) => h("td", { class: "num" }, allocUsage(a).cpu),
  memory: (a) => h("td", { class: "num" }, allocUsage(a).mem),
};

function allocRow(a, columns) {
  return h("tr", { "data-alloc": a.ID, "data-status": a.ClientStatus }, ...columns.map((c) => ALLOC_CELLS[c](a)));
}

const EVAL_CELLS = {
  id: (e) => h("td", {}, evalLink(e.ID)),
  job: (e) => h("td", {}, e.JobID ? jobLink(e.JobID, e.Namespace) : "—"),
  type: (e) => h("td", {}, e.Type),
  triggeredBy: (e) => h("td", {}, e.TriggeredBy),
  priority: (e) => h("td", {}, e.Priority),
  status: (e) => h("td", {}, badge(e.Status)),
  created: (e) => h("td", {}, fmtTime(e.CreateTime)),
};

function evalRow(e, columns) {
  return h("tr", { "data-eval": e.ID }, ...columns.map((c) => EVAL_CELLS[c](e)));
}

function millis(t) {
  if (!t) return null;
  if (typeof t === "string") {
    if (t.startsWith("0001-01-01")) return null;
    const ms = Date.parse(t);
    return isNaN(ms) ? null : ms;
  }
  return Number(t) / 1e6;
}

function fmtTime(t) {
  const ms = millis(t);
  if (ms === null) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC").replace("Z", " UTC");
}

function ago(t) {
  const ms = millis(t);
  if (ms === null) return "—";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function flash(message, kind) {
  const el = $("flash");
  el.textContent = message;
  el.className = "flash " + (kind || "error");
  el.hidden = false;
}

function clearFlash() {
  $("flash").hidden = true;
}

// An action's failure, 403 included, is shown as the gateway said it.
async function act(what, fn) {
  clearFlash();
  try {
    const out = await fn();
    flash(what + ": done", "ok");
    return out;
  } catch (e) {
    flash(what + " refused (" + (e.status || "error") + "): " + e.message);
    return null;
  }
}

function pageError(e) {
  flash(e.status ? e.status + ": " + e.message : String(e));
}

// ------------------------------------------------------------------ ACL

// What the token may do, from /ui/api/capabilities (the gateway compiles the
// token's policies with Corral's own ACL code); elements marked
// data-needs="<capability>" are hidden when it is not granted.
let CAPS = null;

async function loadCapabilities(namespace) {
  const status = $("token-status");
  try {
    CAPS = await get(UI + "/api/capabilities" + q({ namespace: namespace || "default" }));
    if (!CAPS.Enabled) status.textContent = "ACLs off";
    else if (CAPS.Management) status.textContent = "management token";
    else if (CAPS.AccessorID === "anonymous") status.textContent = "anonymous";
    else status.textContent = "token: " + ((CAPS.Policies || []).join(", ") || "no policies");
  } catch (e) {
    CAPS = { Enabled: true, Capabilities: {} };
    status.textContent = e.status === 403 ? "token refused: " + e.message : "";
  }
  for (const el of document.querySelectorAll("[data-needs]")) {
    el.hidden = !allowed(el.dataset.needs);
  }
}

function allowed(cap) {
  return !CAPS || !CAPS.Enabled || CAPS.Management || Boolean((CAPS.Capabilities || {})[cap]);
}

// With ACLs on, an anonymous request (no token in the box) sees only what
// the anonymous policy grants: a list that comes back empty then says so
// and asks for a token, rather than "no jobs yet" under a green dot.
function signedOut() {
  return Boolean(CAPS && CAPS.Enabled && !CAPS.Management && !token());
}

// The words of an empty list of `what` ("jobs"): ask to sign in when signed
// out; name `cap` (the capability a token needs to see any, e.g.
// "list-jobs"; may be omitted) when the token lacks it; else `fallback`.
function emptyList(what, fallback, cap) {
  if (signedOut()) {
    showSignin(what);
    return h("span", { class: "signin-row" }, "Sign in to see " + what + ": ACLs are enabled and an anonymous request sees none. Enter an ACL token above.");
  }
  if (CAPS && CAPS.Enabled && !CAPS.Management && cap && !allowed(cap)) {
    return "this token may not see " + what + " (it lacks " + cap + ")";
  }
  return fallback;
}

function showSignin(what) {
  const box = $("signin");
  box.hidden = false;
  box.replaceChildren(
    h("strong", {}, "Sign in to see " + what + "."),
    " ACLs are enabled on this cluster and no token is set, so the gateway answers only what the anonymous policy allows. ",
    h("a", { href: "#token-input", onclick: (ev) => { ev.preventDefault(); $("token-input").focus(); } }, "Enter an ACL token"),
    " (its secret ID) in the box at the top right."
  );
  setLive("signin", "signed out · nothing to follow until a token is set");
  document.body.dataset.signin = "true";
}

function setupToken() {
  const input = $("token-input");
  input.value = token();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    localStorage.setItem(TOKEN_KEY, input.value.trim());
    location.reload();
  });
  $("token-clear").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
}

// `corral ui -authenticate` (Nomad's `nomad ui -authenticate`) opens the UI
// with ?ott=<one-time secret>: exchange it for the token it stands for and
// keep that as a token saved from the token box is kept. `ott` leaves the
// address first, whatever the answer: it is spent (or refused) and the
// address bar, history and bookmarks should not keep it. The exchange goes
// without the stored token and region: the one-time secret is the whole
// authorization, and it was made in the gateway's own region.
async function exchangeOneTimeToken() {
  const url = new URL(location.href);
  const ott = url.searchParams.get("ott");
  if (ott === null) return;
  url.searchParams.delete("ott");
  history.replaceState(history.state, "", url.pathname + url.search + url.hash);
  if (!ott) return;
  const resp = await fetch("/v1/acl/token/onetime/exchange", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ OneTimeSecretID: ott }),
  });
  const text = (await resp.text()).trim();
  if (!resp.ok) {
    document.body.dataset.ott = "refused";
    flash("one-time token refused (" + resp.status + "): " + (text || resp.statusText));
    return;
  }
  localStorage.setItem(TOKEN_KEY, JSON.parse(text).Token.SecretID);
  document.body.dataset.ott = "exchanged";
}

// The region switcher: every region /v1/regions knows; choosing one reloads
// the page with every request for that region.
async function setupRegions() {
  const select = $("region-select");
  if (!select) return;
  let regions = [];
  let self = "";
  try {
    regions = (await api("/v1/regions")).body || [];
    self = ((await get("/v1/agent/self")).config || {}).Region || "";
  } catch (e) {
    regions = [];
  }
  const current = region() || self;
  if (current && !regions.includes(current)) regions.push(current);
  select.replaceChildren(
    ...regions.map((r) => h("option", { value: r, selected: r === current }, r + (r === self ? " (here)" : "")))
  );
  select.disabled = regions.length < 2;
  select.addEventListener("change", () => {
    if (select.value === self) localStorage.removeItem(REGION_KEY);
    else localStorage.setItem(REGION_KEY, select.value);
    location.reload();
  });
}

// ------------------------------------------------------------------ live

// Refresh at most once per animation burst however many events arrive.
function debounced(fn, ms) {
  let timer = null;
  let running = false;
  let again = false;
  const run = async () => {
    timer = null;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } catch (e) {
      pageError(e);
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  };
  const schedule = () => {
    if (timer === null) timer = setTimeout(run, ms);
  };
  return schedule;
}

function setLive(state, text) {
  const el = $("live");
  if (el.dataset.live === "signin" && state !== "signin") return;
  el.dataset.live = state;
  el.textContent = text;
}

// Follow /v1/event/stream for `topics` ("Job:*", "Allocation:<job>" ...),
// calling onEvents with each non-empty batch; where the stream is not served,
// long-poll `fallback` (a list path) with blocking queries instead.
async function follow(topics, onEvents, fallback) {
  let index = SEEN_INDEX;
  for (;;) {
    try {
      const params = new URLSearchParams();
      for (const t of topics) params.append("topic", t);
      // Nomad's index=N streams from N on: start after what is shown
      if (index) params.append("index", index + 1);
      const resp = await fetch(withRegion("/v1/event/stream?" + params.toString()), {
        headers: headers(),
        signal: PAGE_ABORT.signal,
      });
      if (!resp.ok) {
        const text = (await resp.text()).trim();
        if (resp.status === 404 || resp.status === 405 || resp.status === 501) {
          return poll(fallback, onEvents);
        }
        throw new ApiError(resp.status, text);
      }
      setLive("stream", "live · event stream");
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line) continue;
          const msg = JSON.parse(line);
          if (msg.Index) index = msg.Index;
          if (msg.Events && msg.Events.length) onEvents(msg.Events);
        }
      }
      setLive("reconnecting", "stream ended · reconnecting");
    } catch (e) {
      if (PAGE_ABORT.signal.aborted) return;
      setLive("error", "event stream: " + (e.message || e) + " · retrying");
    }
    await pause(2000);
  }
}

function pause(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Nomad-style blocking queries: each answer past `index` is a change.
async function poll(path, onEvents) {
  if (!path) {
    setLive("off", "not live");
    return;
  }
  setLive("poll", "live · blocking queries");
  let index = 0;
  for (;;) {
    const started = Date.now();
    try {
      const sep = path.includes("?") ? "&" : "?";
      const res = await api(path + sep + "index=" + index + "&wait=30s", { signal: PAGE_ABORT.signal });
      if (res.index !== index) {
        // the first answer is news only if it is past what the page read
        if (index || res.index > SEEN_INDEX) onEvents([]);
        index = res.index;
      }
    } catch (e) {
      if (PAGE_ABORT.signal.aborted) return;
      setLive("error", "blocking query: " + e.message + " · retrying");
      await pause(2000);
    }
    // a gateway that does not block answers at once: do not spin
    if (Date.now() - started < 500) await pause(1000);
  }
}

// ------------------------------------------------------------------ lists

// A Go string literal for a filter expression (the search box's text).
function goString(text) {
  return '"' + String(text).replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';
}

// The search box as a Nomad filter expression: any of `fields` contains the
// text (go-bexpr's `contains` is a substring test on strings).
function searchFilter(text, fields) {
  const t = text.trim();
  if (!t) return "";
  return fields.map((f) => f + " contains " + goString(t)).join(" or ");
}

function both(a, b) {
  if (a && b) return "(" + a + ") and (" + b + ")";
  return a || b || "";
}

// A list paged by the gateway (Nomad's per_page and next_token, in the
// state's order: evaluations, allocations and deployments by creation,
// the others by ID), narrowed by a search box and a Nomad filter
// expression (?filter=, evaluated by the gateway before it pages); the
// search, filter and page size live in the address so a view can be shared.
// The page shown is read again on each event of `topics`.
//   spec: { list, path, params, search: [fields], row, empty, what, cap, topics, fallback }
async function pagedList(spec) {
  const list = spec.list;
  const url = new URL(location.href);
  const state = {
    search: url.searchParams.get("search") || "",
    filter: url.searchParams.get("filter") || "",
    perPage: Math.floor(Number(url.searchParams.get("per_page"))) || 50,
    tokens: [""], // the next_token of each page seen, page 1 first
    next: "",
  };
  const search = $(list + "-search");
  const filter = $(list + "-filter");
  const per = $(list + "-per-page");
  search.value = state.search;
  filter.value = state.filter;
  if (![...per.options].some((o) => Number(o.value) === state.perPage)) {
    per.append(h("option", { value: state.perPage }, state.perPage));
  }
  per.value = String(state.perPage);
  // a page size the gateway refuses (above its cap, negative) shows its 400

  const remember = () => {
    const u = new URL(location.href);
    for (const [k, v] of [["search", state.search], ["filter", state.filter], ["per_page", state.perPage === 50 ? "" : state.perPage]]) {
      if (v) u.searchParams.set(k, v);
      else u.searchParams.delete(k);
    }
    history.replaceState(null, "", u.toString());
  };

  const load = async () => {
    const started = performance.now();
    const token = state.tokens[state.tokens.length - 1];
    const expr = both(searchFilter(state.search, spec.search), state.filter);
    let res;
    try {
      res = await api(spec.path + q(Object.assign({}, spec.params || {}, { per_page: state.perPage, next_token: token, filter: expr })));
      $(list + "-error").hidden = true;
    } catch (e) {
      if (e.status === 400 && expr) {
        // a bad filter: say so by the box and keep what was shown (a 400
        // without one, e.g. an unknown region, is the page's error)
        $(list + "-error").hidden = false;
        $(list + "-error").textContent = e.message;
        return;
      }
      throw e;
    }
    const items = res.body || [];
    state.next = res.nextToken;
    const narrowed = Boolean(expr);
    fill(
      list,
      items.map(spec.row),
      narrowed ? "nothing matches" : state.tokens.length > 1 ? "no more " + spec.what : emptyList(spec.what, spec.empty, spec.cap)
    );
    $(list + "-prev").disabled = state.tokens.length <= 1;
    $(list + "-next").disabled = !state.next;
    $(list + "-page").textContent = "page " + state.tokens.length + (items.length ? " · " + items.length + " shown" : "");
    const ms = performance.now() - started;
    $(list + "-timing").textContent = "answered in " + Math.round(ms) + " ms";
    document.body.dataset.lastLoadMs = String(Math.round(ms));
    document.body.dataset.listPage = String(state.tokens.length);
    document.body.dataset.listToken = token;
  };
  const first = () => {
    state.tokens = [""];
    return load().catch(pageError);
  };
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.search = search.value;
      remember();
      first();
    }, 250);
  });
  $(list + "-bar").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.search = search.value;
    state.filter = filter.value.trim();
    remember();
    first();
  });
  filter.addEventListener("change", () => {
    state.filter = filter.value.trim();
    remember();
    first();
  });
  per.addEventListener("change", () => {
    state.perPage = Number(per.value);
    remember();
    first();
  });
  $(list + "-next").addEventListener("click", () => {
    if (!state.next) return;
    state.tokens.push(state.next);
    load().catch(pageError);
  });
  $(list + "-prev").addEventListener("click", () => {
    if (state.tokens.length <= 1) return;
    state.tokens.pop();
    load().catch(pageError);
  });
  await load();
  if (signedOut() && document.body.dataset.signin === "true") return;
  // the fallback's blocking query answers on any change of the list's
  // table: one row of it is enough
  follow(spec.topics, debounced(load, 300), spec.fallback || spec.path + q(Object.assign({}, spec.params || {}, { per_page: 1 })));
}

// ------------------------------------------------------------------ pages

const PAGES = {};

// -------- overview

PAGES.overview = async function () {
  const WINDOW_S = 10;
  // Placements: allocations created (an Allocation event at the alloc's
  // own CreateIndex) in the last WINDOW_S seconds. Where only blocking
  // queries are served, the growth of the allocation count counts instead.
  const placed = []; // ms of each placement
  let streamed = false;
  let lastCount = null;
  const rate = () => {
    const cut = Date.now() - WINDOW_S * 1000;
    while (placed.length && placed[0] < cut) placed.shift();
    $("placements-rate").textContent = (placed.length / WINDOW_S).toFixed(1);
  };
  $("placements-window").textContent = WINDOW_S;

  const stats = async () => {
    try {
      const s = await get(UI + "/api/overview");
      $("stats-error").hidden = true;
      const b = s.Broker;
      if (b) {
        const rows = [
          ["ready", b.TotalReady],
          ["unacked", b.TotalUnacked],
          ["blocked", b.TotalBlocked],
          ["delayed", b.DelayedEvals],
          ["waiting", b.TotalWaiting],
          ["failed", b.TotalFailed],
        ];
        for (const [sched, v] of Object.entries(b.ByScheduler || {})) {
          rows.push([sched + " ready/unacked", v.Ready + " / " + v.Unacked]);
        }
        meta("broker", rows);
      } else meta("broker", [["", s.BrokerError || "no broker address configured"]]);
      const p = s.Plan;
      if (p) {
        meta("planner", [
          ["queue depth", p.QueueDepth],
          ["plans applied", p.PlansApplied],
          ["partial plans", p.PlansPartial],
          ["commits", p.Commits],
        ]);
      } else meta("planner", [["", s.PlanError || "no planner address configured"]]);
    } catch (e) {
      $("stats-error").hidden = false;
      $("stats-error").textContent = "cluster stats: " + e.message;
    }
  };
  // the counts come from the gateway (/ui/api/cluster): the browser never
  // fetches every job, node and allocation to count them
  const cluster = async () => {
    const started = performance.now();
    const c = await get(UI + "/api/cluster");
    const errors = c.Errors || {};
    if (!streamed && c.Allocs !== null && lastCount !== null && c.Allocs > lastCount) {
      for (let i = lastCount; i < c.Allocs; i++) placed.push(Date.now());
    }
    if (c.Allocs !== null) lastCount = c.Allocs;
    rate();
    const count = (v, err) => (v === null ? h("span", { class: "muted", title: err || "" }, "not readable") : v);
    meta("cluster", [
      ["jobs", count(c.Jobs, errors.Jobs)],
      ["nodes ready", c.Nodes === null ? count(null, errors.Nodes) : c.NodesReady + " of " + c.Nodes],
      ["allocations running", c.Allocs === null ? count(null, errors.Allocs) : c.AllocsRunning + " of " + c.Allocs],
    ]);
    document.body.dataset.lastLoadMs = String(Math.round(performance.now() - started));
    if (signedOut() && (c.Nodes === null || (!c.Jobs && !allowed("list-jobs")))) showSignin("the cluster");
  };
  await Promise.all([stats(), cluster()]);
  setInterval(stats, 2000);
  setInterval(rate, 1000);
  // counts re-read at most once a second however busy the stream
  const refresh = debounced(cluster, 1000);
  const seen = new Set(); // placements already counted (a reconnect may replay a few)
  follow(
    ["Allocation:*", "Node:*", "Job:*"],
    (events) => {
      if (events.length) streamed = true;
      for (const ev of events) {
        const a = ev.Payload && ev.Payload.Allocation;
        if (ev.Topic === "Allocation" && a && a.CreateIndex === ev.Index && !seen.has(a.ID)) {
          if (seen.size > 100000) seen.clear();
          seen.add(a.ID);
          placed.push(Date.now());
        }
      }
      rate();
      refresh();
    },
    // a blocking query answers on any change of the table: one row is enough
    "/v1/allocations?namespace=*&per_page=1"
  );
};

// -------- jobs

function groupCounts(summary) {
  const total = { Queued: 0, Starting: 0, Running: 0, Failed: 0, Complete: 0, Lost: 0 };
  for (const g of Object.values((summary && summary.Summary) || {})) {
    for (const k of Object.keys(total)) total[k] += g[k] || 0;
  }
  return total;
}

PAGES.jobs = async function () {
  setupRegister();
  await pagedList({
    list: "jobs",
    path: "/v1/jobs",
    params: { namespace: "*" },
    search: ["ID", "Name"],
    what: "jobs",
    empty: "no jobs yet",
    cap: "list-jobs",
    topics: ["Job:*"],
    row: (j) => {
      const c = groupCounts(j.JobSummary);
      return h(
        "tr",
        { "data-job": j.ID },
        h("td", {}, jobLink(j.ID, j.Namespace)),
        h("td", {}, j.Namespace),
        h("td", {}, j.Type),
        h("td", {}, j.Priority),
        h("td", {}, badge(j.Status)),
        h("td", {}, Object.keys((j.JobSummary && j.JobSummary.Summary) || {}).length),
        h("td", { class: "counts" }, countsText(c))
      );
    },
  });
};

function countsText(c) {
  const parts = [];
  for (const k of ["Running", "Starting", "Queued", "Failed", "Complete", "Lost"]) {
    if (c[k]) parts.push(c[k] + " " + k.toLowerCase());
  }
  return parts.join(", ") || "—";
}

function setupRegister() {
  $("register-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const format = document.querySelector("input[name=format]:checked").value;
    const text = $("jobspec").value;
    const out = $("register-result");
    out.textContent = "submitting…";
    const result = await act("Run job", async () => {
      let job;
      if (format === "hcl") {
        job = (await api("/v1/jobs/parse", { method: "POST", body: { JobHCL: text, Canonicalize: true } })).body;
      } else {
        let parsed;
        try {
          parsed = JSON.parse(text);
        } catch (e) {
          throw new ApiError(400, "the job is not valid JSON: " + e.message);
        }
        job = parsed.Job || parsed;
      }
      const res = (await api("/v1/jobs", { method: "POST", body: { Job: job } })).body;
      return { job: job, res: res };
    });
    if (result) {
      out.textContent = "";
      out.append("registered ", jobLink(result.job.ID, result.job.Namespace), " · eval ", evalLink(result.res.EvalID));
    } else out.textContent = "";
  });
}

PAGES.job = async function () {
  const id = document.body.dataset.job;
  const ns = document.body.dataset.namespace || "default";
  const base = "/v1/job/" + encodeURIComponent(id);
  const nsp = "namespace=" + encodeURIComponent(ns);
  await loadCapabilities(ns);

  const load = async () => {
    const [job, summary, allocs, evals, deployments, versions] = await Promise.all([
      get(base + "?" + nsp),
      get(base + "/summary?" + nsp).catch(() => null),
      get(base + "/allocations?" + nsp),
      get(base + "/evaluations?" + nsp),
      get(base + "/deployments?" + nsp).catch(() => []),
      get(base + "/versions?diffs=true&" + nsp).catch(() => null),
    ]);
    meta("job-meta", [
      ["Status", badge(job.Stop ? "stopped" : job.Status)],
      ["Type", job.Type],
      ["Namespace", job.Namespace],
      ["Priority", job.Priority],
      ["Version", job.Version],
      ["Datacenters", (job.Datacenters || []).join(", ")],
      ["Submitted", fmtTime(job.SubmitTime)],
    ]);
    const sums = (summary && summary.Summary) || {};
    fill(
      "groups",
      (job.TaskGroups || []).map((g) => {
        const s = sums[g.Name] || {};
        return h(
          "tr",
          { "data-group": g.Name },
          h("td", {}, g.Name),
          h("td", {}, g.Count),
          ...["Queued", "Starting", "Running", "Failed", "Complete", "Lost"].map((k) =>
            h("td", { class: "num", "data-count": k.toLowerCase() }, s[k] || 0)
          )
        );
      })
    );
    allocs.sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0));
    fill(
      "allocs",
      allocs.map((a) => allocRow(a, ["id", "group", "node", "version", "desired", "status", "modified"])),
      "no allocations"
    );
    fill(
      "deployments",
      (deployments || []).map((d) => deploymentRow(d, load)),
      "no deployments"
    );
    evals.sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0));
    fill(
      "evals",
      evals.map((e) => evalRow(e, ["id", "triggeredBy", "status", "created"])),
      "no evaluations"
    );
    renderVersions(versions);
    await loadServices();
  };
  // the job's service instances with their checks, as their clients last
  // ran them (check results change without an event: polled)
  const loadServices = async () => {
    const regs = await get(base + "/services?" + nsp).catch(() => []);
    const checks = await allocsChecks(regs.map((r) => r.AllocID));
    fill(
      "services",
      regs.map((r) =>
        h(
          "tr",
          { "data-service": r.ServiceName, "data-alloc": r.AllocID },
          h("td", {}, r.ServiceName),
          h("td", {}, serviceAddress(r)),
          h("td", {}, (r.Tags || []).join(", ") || "—"),
          h("td", {}, allocLink(r.AllocID)),
          h("td", { class: "checks" }, checksSummary(checks[r.AllocID], r.ServiceName))
        )
      ),
      "no services registered"
    );
  };
  await load();
  follow(
    ["Job:" + id, "Allocation:" + id, "Evaluation:" + id, "Deployment:" + id, "Service:" + id],
    debounced(load, 200),
    base + "/allocations?" + nsp
  );
  setInterval(loadServices, 3000);
};

function deploymentRow(d, reload) {
  const groups = Object.entries(d.TaskGroups || {}).map(
    ([name, g]) =>
      name + ": " + (g.HealthyAllocs || 0) + "/" + (g.DesiredTotal || 0) + " healthy" +
      (g.DesiredCanaries ? ", " + (g.PlacedCanaries || []).length + "/" + g.DesiredCanaries + " canaries" + (g.Promoted ? " promoted" : "") : "")
  );
  const waiting = Object.values(d.TaskGroups || {}).filter((g) => g.DesiredCanaries > 0 && !g.Promoted);
  // as the state refuses a promotion until every canary is placed and
  // healthy, the button shows from then on (before: what it waits for)
  const ready = waiting.every(
    (g) => (g.PlacedCanaries || []).length >= g.DesiredCanaries && (g.HealthyAllocs || 0) >= g.DesiredCanaries
  );
  const promote =
    d.Status === "running" && waiting.length && !ready
      ? h("span", { class: "muted" }, "canaries not yet healthy")
      : d.Status === "running" && waiting.length && allowed("submit-job")
      ? h(
          "button",
          {
            type: "button",
            class: "promote",
            onclick: async () => {
              await act("Promote", () =>
                api("/v1/deployment/promote/" + encodeURIComponent(d.ID), {
                  method: "POST",
                  body: { DeploymentID: d.ID, All: true },
                })
              );
              reload();
            },
          },
          "Promote"
        )
      : "";
  return h(
    "tr",
    { "data-deployment": d.ID },
    h("td", {}, short(d.ID)),
    h("td", {}, d.JobVersion),
    h("td", {}, badge(d.Status), d.StatusDescription ? h("div", { class: "muted" }, d.StatusDescription) : ""),
    h("td", {}, groups.join("; ")),
    h("td", {}, promote)
  );
}

// Versions newest first, each with its diff against the one before: the
// gateway's Diffs when it sends them, else computed here field by field.
function renderVersions(data) {
  const box = $("versions");
  if (!data) {
    box.replaceChildren(h("p", { class: "muted" }, "versions unavailable"));
    return;
  }
  const versions = (data.Versions || []).slice().sort((a, b) => b.Version - a.Version);
  box.replaceChildren(
    ...versions.map((v, i) => {
      const prev = versions[i + 1];
      const lines = prev ? diffLines(prev, v) : [];
      return h(
        "details",
        { class: "version", open: i === 0 ? true : undefined, "data-version": v.Version },
        h("summary", {}, "Version " + v.Version, " · ", fmtTime(v.SubmitTime), v.Stable ? " · stable" : "", prev ? " · " + lines.length + " change(s)" : " · first version"),
        prev
          ? h("pre", { class: "diff" }, ...lines.map((l) => h("span", { class: l[0] === "+" ? "add" : l[0] === "-" ? "del" : "mod" }, l + "\n")))
          : ""
      );
    })
  );
}

const VOLATILE = new Set(["Version", "ModifyIndex", "JobModifyIndex", "SubmitTime", "Stable", "CreateIndex", "Status", "StatusDescription"]);

function diffLines(a, b, path, out) {
  out = out || [];
  path = path || "";
  const keys = new Set([...Object.keys(a || {}), ...Object.keys(b || {})]);
  for (const k of [...keys].sort()) {
    if (!path && VOLATILE.has(k)) continue;
    const x = a ? a[k] : undefined;
    const y = b ? b[k] : undefined;
    const p = path ? path + "." + k : k;
    if (isObj(x) && isObj(y)) diffLines(x, y, p, out);
    else if (Array.isArray(x) && Array.isArray(y) && x.length === y.length && x.every(isObj)) {
      x.forEach((xi, i) => diffLines(xi, y[i], p + "[" + (xi && xi.Name ? xi.Name : i) + "]", out));
    } else if (JSON.stringify(x) !== JSON.stringify(y)) {
      if (x === undefined || x === null) out.push("+ " + p + ": " + JSON.stringify(y));
      else if (y === undefined || y === null) out.push("- " + p + ": " + JSON.stringify(x));
      else out.push("~ " + p + ": " + JSON.stringify(x) + " → " + JSON.stringify(y));
    }
  }
  return out;
}

function isObj(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

// -------- allocation

PAGES.alloc = async function () {
  const id = document.body.dataset.alloc;
  let logsTask = null;
  let logsAbort = null;
  let shown = null; // the alloc as last read
  let stopUsage = null;
  const load = async () => {
    const a = await get("/v1/allocation/" + encodeURIComponent(id));
    shown = a;
    const live = a.ClientStatus === "running" || a.ClientStatus === "pending";
    if (live && !stopUsage) stopUsage = followUsage(id, () => allocUsage(shown));
    if (!live && !stopUsage) $("usage-status").textContent = "the allocation is " + a.ClientStatus + ": no usage to read";
    $("title").textContent = "Allocation " + a.Name;
    if (CAPS === null) await loadCapabilities(a.Namespace);
    meta("alloc-meta", [
      ["ID", a.ID],
      ["Job", jobLink(a.JobID, a.Namespace)],
      ["Group", a.TaskGroup],
      ["Node", nodeLink(a.NodeID, a.NodeName || short(a.NodeID))],
      ["Eval", evalLink(a.EvalID)],
      ["Desired", a.DesiredStatus],
      ["Status", badge(a.ClientStatus)],
      ["Description", a.ClientDescription || "—"],
    ]);
    const states = a.TaskStates || {};
    const names = Object.keys(states).sort();
    $("tasks").replaceChildren(
      ...(names.length
        ? names.map((name) => {
            const s = states[name];
            return h(
              "section",
              { class: "task", "data-task": name },
              h("h3", {}, name, " ", badge(s.State), s.Failed ? badge("failed") : "", s.Restarts ? h("span", { class: "muted" }, " " + s.Restarts + " restart(s)") : ""),
              h(
                "table",
                { class: "list" },
                h("thead", {}, h("tr", {}, h("th", {}, "Time"), h("th", {}, "Type"), h("th", {}, "Message"))),
                h(
                  "tbody",
                  {},
                  ...(s.Events || [])
                    .slice()
                    .reverse()
                    .map((e) => h("tr", {}, h("td", {}, fmtTime(e.Time)), h("td", {}, e.Type), h("td", {}, e.DisplayMessage || e.Message || "")))
                )
              )
            );
          })
        : [h("p", { class: "muted" }, "no task has reported yet")])
    );
    const sel = $("logs-task");
    const current = sel.value;
    const taskNames = names.length ? names : Object.keys(a.TaskResources || {}).sort();
    if (sel.options.length !== taskNames.length) {
      sel.replaceChildren(...taskNames.map((n) => h("option", { value: n }, n)));
      if (current) sel.value = current;
    }
    if (logsTask === null && taskNames.length && allowed("read-logs")) startLogs();
  };
  const startLogs = () => {
    if (logsAbort) logsAbort.abort();
    logsTask = $("logs-task").value;
    logsAbort = new AbortController();
    PAGE_ABORT.signal.addEventListener("abort", () => logsAbort.abort());
    streamLogs(id, logsTask, $("logs-type").value, logsAbort.signal);
  };
  $("logs-task").addEventListener("change", startLogs);
  $("logs-type").addEventListener("change", startLogs);
  const loadServices = async () => {
    const regs = await get("/v1/allocation/" + encodeURIComponent(id) + "/services").catch(() => []);
    fill(
      "services",
      regs.map((r) =>
        h(
          "tr",
          { "data-service": r.ServiceName },
          h("td", {}, r.ServiceName),
          h("td", {}, serviceAddress(r)),
          h("td", {}, (r.Tags || []).join(", ") || "—")
        )
      ),
      "no services registered"
    );
    const results = await allocChecks(id);
    fill(
      "checks",
      Object.values(results || {})
        .sort((a, b) => (a.Service + a.Check).localeCompare(b.Service + b.Check))
        .map((c) =>
          h(
            "tr",
            { "data-check": c.Check, "data-status": c.Status },
            h("td", {}, c.Check),
            h("td", {}, c.Service),
            h("td", {}, c.Task || "—"),
            h("td", {}, c.Mode),
            h("td", {}, badge(CHECK_WORDS[c.Status] || c.Status)),
            h("td", { class: "output" }, (c.Output || "").slice(0, 200)),
            h("td", {}, fmtTime(c.Timestamp * 1e9))
          )
        ),
      results === null ? "check results unavailable (the client could not be asked)" : "no checks"
    );
  };
  await load();
  await loadServices();
  follow(
    ["Allocation:*"],
    debounced(async () => {
      await load();
      await loadServices();
    }, 200),
    "/v1/allocation/" + encodeURIComponent(id)
  );
  setInterval(loadServices, 3000);
};

// -------- resource usage charts

const SVG = "http://www.w3.org/2000/svg";
// samples kept per chart: two minutes at one read every 2 s
const USAGE_SAMPLES = 60;

function svgEl(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

// A line of `values` (oldest first) against `limit` (the allocated amount,
// a dashed line), scaled to whichever is larger.
function drawChart(id, values, limit, label) {
  const box = $(id);
  const svg = box.querySelector("svg");
  const top = Math.max(limit || 0, ...values, 1) * 1.1;
  const W = 300;
  const H = 90;
  const x = (i) => (W * i) / (USAGE_SAMPLES - 1);
  const y = (v) => H - (H * v) / top;
  const start = USAGE_SAMPLES - values.length;
  const pts = values.map((v, i) => x(start + i).toFixed(1) + "," + y(v).toFixed(1));
  const children = [];
  if (pts.length) {
    children.push(svgEl("polygon", { class: "area", points: x(start).toFixed(1) + "," + H + " " + pts.join(" ") + " " + x(USAGE_SAMPLES - 1).toFixed(1) + "," + H }));
    children.push(svgEl("polyline", { points: pts.join(" ") }));
  }
  if (limit) children.push(svgEl("line", { class: "limit", x1: 0, x2: W, y1: y(limit), y2: y(limit) }));
  svg.replaceChildren(...children);
  box.dataset.samples = String(values.length);
  box.querySelector(".now").textContent = label;
}

// Poll the alloc's usage from its client (/v1/client/allocation/:id/stats,
// as Nomad's UI does) while it runs; each chart shows the last two minutes
// against what the alloc was allocated.
function followUsage(allocId, allocated) {
  const cpu = [];
  const mem = [];
  const status = $("usage-status");
  let stopped = false;
  const read = async () => {
    if (stopped || PAGE_ABORT.signal.aborted) return;
    try {
      const u = await get("/v1/client/allocation/" + encodeURIComponent(allocId) + "/stats");
      const r = u.ResourceUsage || {};
      const c = (r.CpuStats && r.CpuStats.TotalTicks) || 0;
      const m = ((r.MemoryStats && (r.MemoryStats.RSS || r.MemoryStats.Usage)) || 0) / (1024 * 1024);
      cpu.push(c);
      mem.push(m);
      if (cpu.length > USAGE_SAMPLES) cpu.shift();
      if (mem.length > USAGE_SAMPLES) mem.shift();
      const cur = allocated();
      drawChart("chart-cpu", cpu, cur.cpu, Math.round(c) + " / " + cur.cpu + " MHz");
      drawChart("chart-mem", mem, cur.mem, m.toFixed(1) + " / " + cur.mem + " MiB");
      status.textContent = "from the client, every 2 s · last " + fmtTime(u.Timestamp);
      $("charts").hidden = false;
    } catch (e) {
      // no client to ask, or the alloc is not running there (any more)
      status.textContent = "no resource usage reported" + (e.message ? ": " + e.message : "");
      if (!cpu.length) $("charts").hidden = true;
    }
  };
  read();
  const timer = setInterval(read, 2000);
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}

// -------- services (Nomad's native service discovery)

const CHECK_WORDS = { success: "passing", failure: "failing", pending: "pending" };

function serviceAddress(r) {
  if (!r.Port) return r.Address || "—";
  return (r.Address.includes(":") ? "[" + r.Address + "]" : r.Address) + ":" + r.Port;
}

// An alloc's check results from its client, null when they cannot be read
// (no node:read to find the client, or the client is gone).
async function allocChecks(allocId) {
  try {
    return await get("/v1/client/allocation/" + encodeURIComponent(allocId) + "/checks");
  } catch (e) {
    return null;
  }
}

async function allocsChecks(allocIds) {
  const ids = [...new Set(allocIds)];
  const results = await Promise.all(ids.map(allocChecks));
  return Object.fromEntries(ids.map((id, i) => [id, results[i]]));
}

function checksSummary(results, service) {
  if (results === null || results === undefined) {
    return h("span", { class: "muted", title: "the client's check results could not be read" }, "unknown");
  }
  const mine = Object.values(results).filter((r) => r.Service === service);
  if (!mine.length) return h("span", { class: "muted" }, "—");
  const counts = {};
  for (const r of mine) {
    const word = CHECK_WORDS[r.Status] || r.Status;
    counts[word] = (counts[word] || 0) + 1;
  }
  return h(
    "span",
    {},
    ...Object.entries(counts)
      .sort()
      .map(([word, n]) => badge(n + " " + word))
  );
}

PAGES.services = async function () {
  const load = async () => {
    const namespaces = await get("/v1/services?namespace=*");
    const rows = [];
    for (const ns of namespaces) {
      for (const svc of ns.Services || []) {
        const instances = await get(
          "/v1/service/" + encodeURIComponent(svc.ServiceName) + "?namespace=" + encodeURIComponent(ns.Namespace)
        ).catch(() => []);
        rows.push(
          h(
            "tr",
            { "data-service": svc.ServiceName, "data-namespace": ns.Namespace },
            h("td", {}, svc.ServiceName),
            h("td", {}, ns.Namespace),
            h("td", {}, (svc.Tags || []).join(", ") || "—"),
            h(
              "td",
              {},
              ...instances.flatMap((r, i) => [i ? ", " : "", link("/allocations/" + encodeURIComponent(r.AllocID), serviceAddress(r))])
            )
          )
        );
      }
    }
    fill("services", rows, "no services registered");
  };
  await load();
  follow(["Service:*"], debounced(load, 250), "/v1/services?namespace=*");
};

// Live logs: /v1/client/fs/logs with follow=true&plain=true, appended as they
// arrive; a dropped stream resumes from the bytes already shown.
async function streamLogs(allocId, task, type, signal) {
  const pre = $("logs");
  const status = $("logs-status");
  pre.textContent = "";
  let offset = 0;
  const decoder = new TextDecoder();
  while (!signal.aborted) {
    try {
      const path =
        "/v1/client/fs/logs/" + encodeURIComponent(allocId) +
        q({ task: task, type: type, follow: "true", plain: "true", origin: "start", offset: offset });
      const resp = await fetch(withRegion(path), { headers: headers(), signal: signal });
      if (!resp.ok) {
        status.textContent = resp.status + ": " + (await resp.text()).trim();
        if (resp.status === 403 || resp.status === 400) return;
      } else {
        status.textContent = "following";
        const reader = resp.body.getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          offset += value.length;
          const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.append(decoder.decode(value, { stream: true }));
          if (atBottom) pre.scrollTop = pre.scrollHeight;
        }
        status.textContent = "log stream ended · reconnecting";
      }
    } catch (e) {
      if (signal.aborted) return;
      status.textContent = "logs: " + (e.message || e) + " · retrying";
    }
    await pause(2000);
  }
}

// -------- evaluations

PAGES.evals = async function () {
  await pagedList({
    list: "evals",
    path: "/v1/evaluations",
    params: { namespace: "*" },
    search: ["ID", "JobID"],
    what: "evaluations",
    empty: "no evaluations",
    cap: "read-job",
    topics: ["Evaluation:*"],
    row: (e) => evalRow(e, ["id", "job", "type", "triggeredBy", "priority", "status", "created"]),
  });
};

PAGES.eval = async function () {
  const id = document.body.dataset.eval;
  const load = async () => {
    const [ev, allocs, j] = await Promise.all([
      get("/v1/evaluation/" + encodeURIComponent(id)),
      // related=true: the gateway's skeleton fills the allocs only with it
      get("/v1/evaluation/" + encodeURIComponent(id) + "/allocations?related=true"),
      get(UI + "/api/evaluation/" + encodeURIComponent(id) + "/journey"),
    ]);
    meta("eval-meta", [
      ["ID", ev.ID],
      ["Job", ev.JobID ? jobLink(ev.JobID, ev.Namespace) : "—"],
      ["Type", ev.Type],
      ["Triggered by", ev.TriggeredBy],
      ["Status", badge(ev.Status)],
      ["Description", ev.StatusDescription || "—"],
      ["Node", ev.NodeID ? nodeLink(ev.NodeID) : "—"],
      ["Previous / next / blocked", [ev.PreviousEval, ev.NextEval, ev.BlockedEval].filter(Boolean).map((x) => evalLink(x)).flatMap((x) => [x, " "])],
    ]);
    renderJourney(j);
    fill("allocs", allocs.map((a) => allocRow(a, ["id", "group", "node", "status", "created"])), "none");
  };
  await load();
  follow(["Evaluation:*", "Allocation:*"], debounced(load, 300), "/v1/evaluation/" + encodeURIComponent(id) + "/allocations");
};

function renderJourney(j) {
  const stages = j.Stages || [];
  const t0 = stages.length && stages[0].Time ? stages[0].Time : null;
  $("timeline").replaceChildren(
    ...stages.map((s) =>
      h(
        "li",
        { class: s.Time ? "done" : "unknown", "data-stage": s.Name },
        h("span", { class: "dot" }),
        h("strong", {}, s.Name),
        h(
          "span",
          { class: "when" },
          s.Time ? fmtTime(s.Time) + (t0 && s.Time !== t0 ? " (+" + ((s.Time - t0) / 1e6).toFixed(1) + " ms)" : "") : "—"
        ),
        h("span", { class: "index" }, s.Index ? "index " + s.Index : ""),
        s.Note ? h("span", { class: "note muted" }, s.Note) : ""
      )
    )
  );
  const trace = $("trace");
  trace.replaceChildren();
  if (j.TraceID) {
    trace.append("Trace ", j.TraceURL ? h("a", { href: j.TraceURL, id: "trace-link" }, j.TraceID) : h("code", { id: "trace-id" }, j.TraceID));
  } else trace.append("no trace context was recorded for this eval");
}

// -------- nodes

PAGES.nodes = async function () {
  await pagedList({
    list: "nodes",
    path: "/v1/nodes",
    search: ["ID", "Name", "Address"],
    what: "clients",
    empty: "no client nodes registered",
    topics: ["Node:*"],
    row: (n) =>
      h(
        "tr",
        { "data-node": n.ID },
        h("td", {}, nodeLink(n.ID)),
        h("td", {}, n.Name),
        h("td", {}, n.Address || "—"),
        h("td", {}, n.Datacenter),
        h("td", {}, n.NodeClass || "—"),
        h("td", {}, n.NodePool || "—"),
        h("td", {}, badge(n.Status)),
        h("td", {}, n.SchedulingEligibility),
        h("td", {}, n.Drain ? badge("draining") : "no")
      ),
  });
};

// -------- allocations

PAGES.allocs = async function () {
  await pagedList({
    list: "allocs",
    path: "/v1/allocations",
    params: { namespace: "*" },
    search: ["ID", "Name", "JobID", "NodeName"],
    what: "allocations",
    empty: "no allocations",
    cap: "read-job",
    topics: ["Allocation:*"],
    row: (a) => allocRow(a, ["id", "name", "job", "group", "node", "desired", "status", "modified"]),
  });
};

// -------- deployments

PAGES.deployments = async function () {
  let reload = null;
  const row = (d) => {
    const tr = deploymentRow(d, () => reload && reload());
    // the job's column, after the ID
    tr.children[0].after(h("td", {}, jobLink(d.JobID, d.Namespace)));
    return tr;
  };
  await pagedList({
    list: "deployments",
    path: "/v1/deployments",
    params: { namespace: "*" },
    search: ["ID", "JobID"],
    what: "deployments",
    empty: "no deployments",
    cap: "read-job",
    topics: ["Deployment:*"],
    row: row,
  });
  reload = () => $("deployments-bar").requestSubmit();
};

// -------- servers

PAGES.servers = async function () {
  const load = async () => {
    const body = await get(UI + "/api/members");
    fill(
      "servers",
      (body.Members || []).map((m) =>
        h(
          "tr",
          { "data-member": m.ID, "data-role": m.Role, "data-leader": m.Leader ? "true" : "false" },
          h("td", {}, m.Role),
          h("td", { class: "mono" }, m.ID),
          h("td", {}, m.Address || "—"),
          h("td", {}, m.Leader ? badge("leader") : "—"),
          h("td", {}, m.Version || "—"),
          h("td", {}, fmtTime(m.StartedAt)),
          h("td", {}, ago(m.LastSeen))
        )
      ),
      "no control-plane process is registered"
    );
  };
  await load();
  // leadership and membership changes are no state events: read again
  setLive("poll", "live · read every 5 s");
  setInterval(() => load().catch(pageError), 5000);
};

function allocUsage(a) {
  // Nomad's AllocatedResources (per task) or the older Resources total
  let cpu = 0;
  let mem = 0;
  let disk = 0;
  const ar = a.AllocatedResources;
  if (ar && ar.Tasks) {
    for (const t of Object.values(ar.Tasks)) {
      cpu += (t.Cpu && t.Cpu.CpuShares) || 0;
      mem += (t.Memory && t.Memory.MemoryMB) || 0;
    }
    disk = (ar.Shared && ar.Shared.DiskMB) || 0;
  } else if (a.Resources) {
    cpu = a.Resources.CPU || 0;
    mem = a.Resources.MemoryMB || 0;
    disk = a.Resources.DiskMB || 0;
  }
  return { cpu: cpu, mem: mem, disk: disk };
}

function nodeTotals(n) {
  const nr = n.NodeResources;
  const rr = n.ReservedResources;
  if (nr) {
    return {
      total: { cpu: (nr.Cpu && nr.Cpu.CpuShares) || 0, mem: (nr.Memory && nr.Memory.MemoryMB) || 0, disk: (nr.Disk && nr.Disk.DiskMB) || 0 },
      reserved: {
        cpu: (rr && rr.Cpu && rr.Cpu.CpuShares) || 0,
        mem: (rr && rr.Memory && rr.Memory.MemoryMB) || 0,
        disk: (rr && rr.Disk && rr.Disk.DiskMB) || 0,
      },
    };
  }
  const r = n.Resources || {};
  const v = n.Reserved || {};
  return {
    total: { cpu: r.CPU || 0, mem: r.MemoryMB || 0, disk: r.DiskMB || 0 },
    reserved: { cpu: v.CPU || 0, mem: v.MemoryMB || 0, disk: v.DiskMB || 0 },
  };
}

PAGES.node = async function () {
  const id = document.body.dataset.node;
  await loadCapabilities("default");
  const base = "/v1/node/" + encodeURIComponent(id);
  const load = async () => {
    const [n, allocs] = await Promise.all([get(base), get(base + "/allocations")]);
    $("title").textContent = "Node " + n.Name;
    meta("node-meta", [
      ["ID", n.ID],
      ["Datacenter", n.Datacenter],
      ["Class", n.NodeClass || "—"],
      ["Address", n.HTTPAddr || "—"],
      ["Status", badge(n.Status)],
      ["Eligibility", h("span", { id: "eligibility" }, n.SchedulingEligibility)],
      ["Drain", h("span", { id: "drain" }, n.Drain ? "draining" : "no")],
    ]);
    const live = allocs.filter((a) => a.DesiredStatus === "run" && !["complete", "failed", "lost"].includes(a.ClientStatus));
    const used = { cpu: 0, mem: 0, disk: 0 };
    for (const a of live) {
      const u = allocUsage(a);
      used.cpu += u.cpu;
      used.mem += u.mem;
      used.disk += u.disk;
    }
    const t = nodeTotals(n);
    fill(
      "resources",
      [
        ["CPU", "cpu", "MHz"],
        ["Memory", "mem", "MiB"],
        ["Disk", "disk", "MiB"],
      ].map(([label, k, unit]) => {
        const avail = Math.max(t.total[k] - t.reserved[k], 0);
        const free = avail - used[k];
        const pct = avail ? Math.min(100, Math.round((100 * used[k]) / avail)) : 0;
        return h(
          "tr",
          { "data-resource": k },
          h("td", {}, label),
          h("td", { class: "num" }, t.total[k] + " " + unit),
          h("td", { class: "num" }, t.reserved[k] + " " + unit),
          h("td", { class: "num used" }, used[k] + " " + unit),
          h("td", { class: "num free" }, free + " " + unit),
          h("td", { class: "bar" }, h("span", { style: "width:" + pct + "%" }), h("em", {}, pct + "%"))
        );
      })
    );
    allocs.sort((a, b) => (b.CreateIndex || 0) - (a.CreateIndex || 0));
    fill(
      "allocs",
      allocs.map((a) => allocRow(a, ["id", "job", "group", "desired", "status", "cpu", "memory"])),
      "no allocations"
    );
    const drain = $("drain-toggle");
    drain.textContent = n.Drain ? "Stop drain" : "Drain";
    drain.onclick = () =>
      act(n.Drain ? "Stop drain" : "Drain", () =>
        api(base + "/drain", {
          method: "POST",
          body: n.Drain
            ? { DrainSpec: null, MarkEligible: true }
            : { DrainSpec: { Deadline: 3600 * 1e9, IgnoreSystemJobs: false }, MarkEligible: false },
        })
      ).then(load);
    const elig = $("eligibility-toggle");
    const eligible = n.SchedulingEligibility === "eligible";
    elig.textContent = eligible ? "Mark ineligible" : "Mark eligible";
    elig.onclick = () =>
      act(eligible ? "Mark ineligible" : "Mark eligible", () =>
        api(base + "/eligibility", { method: "POST", body: { Eligibility: eligible ? "ineligible" : "eligible" } })
      ).then(load);
  };
  await load();
  follow(["Node:" + id, "Allocation:*"], debounced(load, 250), base);
};

// -------- topology

// A colour per job, stable across reloads (a hash of namespace and id).
function jobColour(ns, job) {
  let x = 2166136261;
  const key = ns + "/" + job;
  for (let i = 0; i < key.length; i++) {
    x ^= key.charCodeAt(i);
    x = Math.imul(x, 16777619);
  }
  return "hsl(" + (Math.abs(x) % 360) + " 55% 46%)";
}

// Text made safe inside HTML (an element's text or a double-quoted attribute).
function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function pct(part, whole) {
  return whole > 0 ? Math.min(100, (100 * part) / whole) : 0;
}

// One bar of a node: its allocations' shares of `total`, side by side, as a
// gradient (one element per bar however many allocations it holds).
function barGradient(allocs, col, total) {
  if (!total || !allocs.length) return "";
  const stops = [];
  let at = 0;
  for (const a of allocs) {
    const w = pct(a[col], total);
    if (w <= 0) continue;
    const c = jobColour(a[1], a[2]);
    const end = Math.min(100, at + w);
    stops.push(c + " " + at.toFixed(2) + "%", c + " " + Math.max(at, end - 0.6).toFixed(2) + "%", "#fff " + Math.max(at, end - 0.6).toFixed(2) + "%", "#fff " + end.toFixed(2) + "%");
    at = end;
  }
  if (!stops.length) return "";
  stops.push("transparent " + at.toFixed(2) + "%", "transparent 100%");
  return "linear-gradient(90deg, " + stops.join(", ") + ")";
}

PAGES.topology = async function () {
  const box = $("topology");
  const detail = $("topology-detail");
  let data = null;
  let byId = new Map();
  let selected = "";
  const F = { ID: 0, Namespace: 1, JobID: 2, TaskGroup: 3, ClientStatus: 4, CPU: 5, MemoryMB: 6 };

  const showNode = (id) => {
    selected = id;
    for (const el of box.querySelectorAll(".tnode.sel")) el.classList.remove("sel");
    const n = byId.get(id);
    if (!n) {
      detail.replaceChildren(h("p", { class: "muted" }, "Select a node to see its allocations."));
      return;
    }
    const tile = box.querySelector(".tnode[data-node='" + CSS.escape(id) + "']");
    if (tile) tile.classList.add("sel");
    detail.replaceChildren(
      h("h2", {}, nodeLink(n.ID, n.Name)),
      h("p", {}, badge(n.Status), " ", n.Eligibility, n.Drain ? [" ", badge("draining")] : ""),
      h(
        "dl",
        { class: "meta" },
        h("dt", {}, "CPU"),
        h("dd", { "data-detail": "cpu" }, n.CPUAllocated + " / " + n.CPU + " MHz (" + Math.round(pct(n.CPUAllocated, n.CPU)) + "%)"),
        h("dt", {}, "Memory"),
        h("dd", { "data-detail": "mem" }, n.MemoryAllocated + " / " + n.MemoryMB + " MiB (" + Math.round(pct(n.MemoryAllocated, n.MemoryMB)) + "%)")
      ),
      h("h3", {}, n.Allocs.length + " allocation(s)"),
      h(
        "table",
        { class: "list", id: "topology-allocs" },
        h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "ID"), h("th", {}, "Job"), h("th", {}, "Group"), h("th", {}, "Status"), h("th", {}, "CPU"), h("th", {}, "Mem"))),
        h(
          "tbody",
          {},
          ...n.Allocs.map((a) =>
            h(
              "tr",
              { "data-alloc": a[F.ID] },
              h("td", {}, h("i", { class: "sw", style: "background:" + jobColour(a[F.Namespace], a[F.JobID]) })),
              h("td", {}, allocLink(a[F.ID])),
              h("td", {}, jobLink(a[F.JobID], a[F.Namespace])),
              h("td", {}, a[F.TaskGroup]),
              h("td", {}, badge(a[F.ClientStatus])),
              h("td", { class: "num" }, a[F.CPU]),
              h("td", { class: "num" }, a[F.MemoryMB])
            )
          )
        )
      )
    );
  };

  const render = () => {
    const frag = document.createDocumentFragment();
    byId = new Map();
    for (const g of data.Groups) {
      let cpu = 0, cpuA = 0, mem = 0, memA = 0, allocs = 0;
      const grid = h("div", { class: "tgrid" });
      // one HTML string per group, parsed once: thousands of tiles built
      // element by element cost several times more
      const tiles = [];
      for (const n of g.Nodes) {
        byId.set(n.ID, n);
        cpu += n.CPU; cpuA += n.CPUAllocated; mem += n.MemoryMB; memA += n.MemoryAllocated; allocs += n.Allocs.length;
        const cls = "tnode s-" + n.Status + (n.Drain ? " draining" : "") + (n.Eligibility === "ineligible" ? " inelig" : "");
        const title = n.Name + " · " + n.Status + " · CPU " + Math.round(pct(n.CPUAllocated, n.CPU)) + "% · memory " + Math.round(pct(n.MemoryAllocated, n.MemoryMB)) + "% · " + n.Allocs.length + " alloc(s)";
        tiles.push(
          '<div class="' + esc(cls) + '" data-node="' + esc(n.ID) + '" title="' + esc(title) + '">' +
            '<div class="b" style="background-image:' + esc(barGradient(n.Allocs, F.CPU, n.CPU)) + '"></div>' +
            '<div class="b" style="background-image:' + esc(barGradient(n.Allocs, F.MemoryMB, n.MemoryMB)) + '"></div>' +
            "</div>"
        );
      }
      grid.innerHTML = tiles.join("");
      frag.append(
        h(
          "section",
          { class: "tgroup", "data-datacenter": g.Datacenter, "data-class": g.NodeClass, "data-nodes": g.Nodes.length },
          h(
            "h2",
            {},
            g.Datacenter,
            h("span", { class: "muted" }, " · class " + (g.NodeClass || "none")),
            h("small", { class: "muted" }, " " + g.Nodes.length + " node(s), " + allocs + " allocation(s), CPU " + Math.round(pct(cpuA, cpu)) + "%, memory " + Math.round(pct(memA, mem)) + "%")
          ),
          grid
        )
      );
    }
    box.replaceChildren(frag);
    if (!data.Groups.length) box.replaceChildren(h("p", { class: "muted" }, "no client nodes registered"));
    const t = data.Totals;
    $("topology-totals").replaceChildren(
      h("div", { class: "card" }, h("h2", {}, "Clients"), h("p", { class: "big", id: "topology-nodes" }, t.Nodes), h("p", { class: "muted" }, data.Groups.length + " datacenter/class group(s)")),
      h("div", { class: "card" }, h("h2", {}, "Allocations"), h("p", { class: "big", id: "topology-allocs-count" }, t.Allocs), h("p", { class: "muted" }, "live ones, on their nodes")),
      h("div", { class: "card" }, h("h2", {}, "CPU allocated"), h("p", { class: "big" }, Math.round(pct(t.CPUAllocated, t.CPU)) + "%"), h("p", { class: "muted" }, t.CPUAllocated + " of " + t.CPU + " MHz")),
      h("div", { class: "card" }, h("h2", {}, "Memory allocated"), h("p", { class: "big" }, Math.round(pct(t.MemoryAllocated, t.MemoryMB)) + "%"), h("p", { class: "muted" }, t.MemoryAllocated + " of " + t.MemoryMB + " MiB"))
    );
    highlight();
    if (selected) showNode(selected);
  };

  // the search: nodes whose name or id, or one of whose allocations' job,
  // contains the text stay lit, the others dim
  const highlight = () => {
    const text = $("topology-search").value.trim().toLowerCase();
    box.classList.toggle("searching", Boolean(text));
    let hits = 0;
    for (const tile of box.querySelectorAll(".tnode")) {
      const n = byId.get(tile.dataset.node);
      const hit = Boolean(text) && (n.Name.toLowerCase().includes(text) || n.ID.startsWith(text) || n.Allocs.some((a) => a[F.JobID].toLowerCase().includes(text)));
      tile.classList.toggle("hit", hit);
      if (hit) hits++;
    }
    box.dataset.hits = String(hits);
    if (text && hits === 1) showNode(box.querySelector(".tnode.hit").dataset.node);
  };

  const load = async () => {
    const started = performance.now();
    data = await get(UI + "/api/topology");
    const fetched = performance.now();
    render();
    // the figure after the layout the drawing caused
    void box.offsetHeight;
    const ms = performance.now() - started;
    $("topology-timing").textContent =
      "answered in " + Math.round(fetched - started) + " ms, drawn in " + Math.round(performance.now() - fetched) + " ms";
    document.body.dataset.lastLoadMs = String(Math.round(ms));
  };
  box.addEventListener("click", (ev) => {
    const tile = ev.target.closest(".tnode");
    if (tile) showNode(tile.dataset.node);
  });
  $("topology-search").addEventListener("input", highlight);
  $("topology-bar").addEventListener("submit", (ev) => ev.preventDefault());
  await load();
  // a reload costs the gateway both lists: at most one every 2 s
  follow(["Node:*", "Allocation:*"], debounced(load, 2000), "/v1/allocations?namespace=*&per_page=1");
};

// ------------------------------------------------------------------ start

async function start() {
  await exchangeOneTimeToken();
  setupToken();
  await setupRegions();
  const ownCaps = ["job", "node"].includes(PAGE) || PAGE === "alloc";
  if (!ownCaps) await loadCapabilities("default");
  const page = PAGES[PAGE];
  if (!page) {
    setLive("off", "");
    return;
  }
  try {
    await page();
    document.body.dataset.ready = "true";
  } catch (e) {
    pageError(e);
    // refused for want of a token: say how to get in
    if (e.status === 403 && signedOut()) showSignin("this page");
    setLive("error", e.status === 403 ? "not live: this token may not read this page (see the token box)" : "not live");
    document.body.dataset.ready = "error";
  }
}

start();
