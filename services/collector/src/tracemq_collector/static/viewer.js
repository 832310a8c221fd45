/* tracemq trace viewer.
 *
 * Plain JavaScript, no build step, no external resources. It talks to the collector's JSON API:
 *   GET /api/v1/traces/{msgId}     one message's trace (producer, transactions, consumers, events)
 *   GET /api/v1/traces?key=K[...]  messages sent with business key K
 *   GET /api/v1/messages?topic=T   messages sent to topic T (both lists with outcomes=1: what
 *                                  each consumer group did with every message so far)
 *   GET /api/v1/groups[/{group}]   consumer-group health (drawn by groups.js)
 * Deep links: /?msgId=XXXX opens a trace (an offsetMsgId too), /?key=K[&topic=T] runs a key
 * search, /?topic=T[&from=&to=] lists a topic, /?view=groups and /?group=G show group health.
 * If the API answers 401 the page asks for a bearer token and keeps it in sessionStorage.
 *
 * Statuses are compared EXACTLY against the API's lower-case strings ("success", "failed",
 * "unknown"). Anything else is shown as unknown — never as success. (RocketMQ's dashboard compared
 * upper-case constants against lower-case values, so failed consumptions were drawn green.)
 */
(function () {
  "use strict";

  const API = "/api/v1";
  const TOKEN_KEY = "tracemq.viewer.token";
  const MSGID_RE = /^(?:[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$/; // a msgId or offsetMsgId; 56 with IPv6
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PAGE_SIZE = 50;

  const CONTEXT_CODES = ["SUCCESS", "TIME_OUT", "EXCEPTION", "RETURNNULL", "FAILED"];
  const MSG_TYPES = ["Normal_Msg", "Trans_Msg_Half", "Trans_msg_Commit", "Delay_Msg", "Order_Msg"];

  /* Timeline geometry (px). */
  const AXIS_H = 30;
  const ROW_H = 46;
  const BAR_H = 18;
  const MIN_BAR_W = 4;
  const HIT_MIN_W = 14;
  const PLOT_PAD_L = 10;
  const PLOT_PAD_R = 14;

  /* ---------------------------------------------------------------------------------------- */
  /* Pure helpers (exposed on window.TraceViewer for unit-style browser tests).               */
  /* ---------------------------------------------------------------------------------------- */

  /** The API's attempt status, compared exactly; anything unexpected is "unknown". */
  function normaliseStatus(value) {
    if (value === "success") return "success";
    if (value === "failed") return "failed";
    return "unknown";
  }

  /** A boolean success flag (Pub, SubAfter) as a status. */
  function statusFromSuccess(value) {
    if (value === true) return "success";
    if (value === false) return "failed";
    return "unknown";
  }

  /** An EndTransaction's state as a status. */
  function statusFromTransaction(state) {
    if (state === "COMMIT_MESSAGE") return "success";
    if (state === "ROLLBACK_MESSAGE") return "failed";
    return "unknown"; // UNKNOW (RocketMQ's spelling) or missing
  }

  function toNum(v) {
    if (typeof v === "number" && Number.isFinite(v)) return v;
    if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
    return null;
  }

  function present(v) {
    return v !== null && v !== undefined && v !== "" && v !== "null";
  }

  function pad(n, w) {
    return String(n).padStart(w || 2, "0");
  }

  /** ISO 8601 in the browser's local time zone, with milliseconds and the offset. */
  function fmtIsoLocal(ms) {
    const t = toNum(ms);
    if (t === null) return "—";
    const d = new Date(t);
    if (Number.isNaN(d.getTime())) return "—";
    const off = -d.getTimezoneOffset();
    const sign = off >= 0 ? "+" : "-";
    const abs = Math.abs(off);
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
      `T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}` +
      `${sign}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`
    );
  }

  function trimDecimals(x, digits) {
    const text = x.toFixed(digits);
    return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
  }

  /** A duration in ms, readable: "0 ms", "55 ms", "1.25 s", "2m 5s", "1h 30m". */
  function fmtDuration(ms) {
    const v = toNum(ms);
    if (v === null) return "—";
    const sign = v < 0 ? "−" : "";
    const a = Math.abs(v);
    if (a < 1000) return `${sign}${trimDecimals(a, a < 10 && a % 1 ? 2 : 0)} ms`;
    if (a < 60000) return `${sign}${trimDecimals(a / 1000, 3)} s`;
    if (a < 3600000) {
      const m = Math.floor(a / 60000);
      const s = trimDecimals((a % 60000) / 1000, 1);
      return `${sign}${m}m${s !== "0" ? ` ${s}s` : ""}`;
    }
    const h = Math.floor(a / 3600000);
    const m = Math.round((a % 3600000) / 60000);
    return `${sign}${h}h${m ? ` ${m}m` : ""}`;
  }

  function fmtRel(ms) {
    const v = toNum(ms);
    if (v === null) return "";
    return v >= 0 ? `+${fmtDuration(v)}` : fmtDuration(v);
  }

  function contextCodeName(code, name) {
    if (present(name)) return String(name);
    const n = toNum(code);
    if (n === null) return present(code) ? String(code) : null;
    return CONTEXT_CODES[n] || `code ${n}`;
  }

  function msgTypeName(type, name) {
    if (present(name)) return String(name);
    const n = toNum(type);
    if (n === null) return present(type) ? String(type) : null;
    return MSG_TYPES[n] || `type ${n}`;
  }

  const AXIS_STEPS = [
    1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 15000, 30000,
    60000, 120000, 300000, 600000, 900000, 1800000, 3600000, 7200000, 10800000, 21600000,
    43200000, 86400000,
  ];

  function niceStep(raw) {
    for (const s of AXIS_STEPS) if (s >= raw) return s;
    return Math.ceil(raw / 86400000) * 86400000;
  }

  /**
   * Turn a trace (API JSON) into timeline rows and bars, with times relative to the origin:
   * the Pub send time, or the earliest event when there is no Pub.
   */
  function buildModel(trace) {
    const producer = trace && trace.producer ? trace.producer : null;
    const transactions = Array.isArray(trace && trace.transactions) ? trace.transactions : [];
    const consumers = Array.isArray(trace && trace.consumers) ? trace.consumers : [];
    const events = Array.isArray(trace && trace.events) ? trace.events : [];
    const deadLetters = Array.isArray(trace && trace.dead_letters) ? trace.dead_letters : [];
    const recalls = Array.isArray(trace && trace.recalls) ? trace.recalls : [];

    let origin = producer ? toNum(producer.timestamp) : null;
    let originLabel = "the send (Pub timestamp)";
    if (origin === null) {
      const times = [];
      for (const t of transactions) times.push(toNum(t.timestamp));
      for (const c of consumers) {
        for (const a of c.attempts || []) times.push(toNum(a.begin), toNum(a.end));
      }
      for (const e of events) times.push(toNum(e.timestamp));
      const known = times.filter((x) => x !== null);
      origin = known.length ? Math.min(...known) : 0;
      originLabel = "the earliest event (no Pub trace for this message)";
    }
    const rel = (t) => {
      const v = toNum(t);
      return v === null ? null : v - origin;
    };

    const rows = [];
    let seq = 0;
    if (producer) {
      const start = rel(producer.timestamp) ?? 0;
      const cost = toNum(producer.cost_time);
      const status = statusFromSuccess(producer.success);
      rows.push({
        key: "producer", role: "PRODUCER", name: producer.group || "(no group)",
        bars: [{
          id: `bar-${seq++}`, kind: "producer", row: "producer", status, start,
          end: cost === null ? start : start + cost, open: false, retry: null,
          group: producer.group, data: producer,
        }],
      });
    }
    for (const t of transactions) {
      const start = rel(t.timestamp) ?? 0;
      rows.push({
        key: "transaction", role: "TRANSACTION", name: t.group || "(no group)",
        bars: [{
          id: `bar-${seq++}`, kind: "transaction", row: "transaction",
          status: statusFromTransaction(t.transaction_state), start, end: start, open: false,
          retry: null, group: t.group, data: t,
        }],
      });
    }
    // A producer's recall of a delayed message (RocketMQ's Recall record): one row per recall,
    // green when the broker recalled it, red when it refused (too late, unknown message).
    for (const r of recalls) {
      const start = rel(r.timestamp) ?? 0;
      rows.push({
        key: "recall", role: "RECALL", name: r.group || "(no group)",
        bars: [{
          id: `bar-${seq++}`, kind: "recall", row: "recall", status: statusFromSuccess(r.success),
          start, end: start, open: false, retry: null, group: r.group, data: r,
        }],
      });
    }
    for (const c of consumers) {
      const attempts = Array.isArray(c.attempts) ? c.attempts : [];
      const bars = [];
      for (const a of attempts) {
        const status = normaliseStatus(a.status);
        let start = rel(a.begin);
        let end = rel(a.end);
        const cost = toNum(a.cost_time);
        if (start === null && end !== null) start = end - (cost ?? 0);
        const open = end === null && status === "unknown";
        if (end === null && !open) end = start;
        bars.push({
          id: `bar-${seq++}`, kind: "attempt", row: `consumer:${c.group}`, status,
          start, end, open, retry: toNum(a.retry_times), group: c.group, data: a,
        });
      }
      const n = attempts.length;
      const count = `${n} ATTEMPT${n === 1 ? "" : "S"}`;
      rows.push({
        key: `consumer:${c.group}`,
        role: `CONSUMER GROUP · ${count}`,
        roleShort: [`CONSUMER · ${count}`, `CONSUMER · ${n} ATT.`, `${n} ATT.`],
        name: c.group || "(no group)", bars,
      });
    }

    // A consumer group that gave up: the move to %DLQ%<group> (failed: the message was never
    // consumed successfully by that group).
    for (const d of deadLetters) {
      const start = rel(d.timestamp) ?? 0;
      rows.push({
        key: `dlq:${d.group}`, role: "DEAD-LETTER QUEUE", name: `${d.group || "(no group)"} → ${d.topic}`,
        bars: [{
          id: `bar-${seq++}`, kind: "deadletter", row: `dlq:${d.group}`,
          status: d.success === false ? "unknown" : "failed", start, end: start, open: false,
          retry: null, group: d.group, data: d,
        }],
      });
    }

    const points = [];
    if (producer) points.push(0);
    for (const r of rows) {
      for (const b of r.bars) {
        if (b.start !== null) points.push(b.start);
        if (b.end !== null) points.push(b.end);
      }
    }
    let lo = points.length ? Math.min(0, ...points) : 0;
    let hi = points.length ? Math.max(...points) : 0;
    // Bars without any time (should not happen) sit at the left edge.
    for (const r of rows) {
      for (const b of r.bars) {
        if (b.start === null) b.start = lo;
        if (b.end === null && !b.open) b.end = b.start;
      }
    }
    const span = Math.max(hi - lo, 10);
    hi = lo + span;
    const hasOpen = rows.some((r) => r.bars.some((b) => b.open));
    hi += span * (hasOpen ? 0.12 : 0.06); // room for labels, and for open bars to run on
    if (lo < 0) lo -= span * 0.02;

    return { origin, originLabel, rows, lo, hi, producer, transactions, consumers, events, deadLetters };
  }

  /* ---------------------------------------------------------------------------------------- */
  /* DOM helpers                                                                              */
  /* ---------------------------------------------------------------------------------------- */

  const $ = (sel, root) => (root || document).querySelector(sel);

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function s(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.setAttribute("class", v);
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(node, children) {
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function dash(v) {
    return present(v) ? String(v) : "—";
  }

  function pill(status, text) {
    return h("span", { class: `pill pill-${status}`, "data-status": status, text });
  }

  /* ---------------------------------------------------------------------------------------- */
  /* API                                                                                      */
  /* ---------------------------------------------------------------------------------------- */

  class ApiError extends Error {
    constructor(kind, status, body, message, path) {
      super(message);
      this.kind = kind; // network | auth | not-found | bad-request | server | bad-response
      this.status = status;
      this.body = body;
      this.path = path;
    }
  }

  function getToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY);
    } catch (_e) {
      return null;
    }
  }

  function setToken(token) {
    memoryToken = null;
    try {
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (_e) {
      /* storage unavailable: the token lives for this page only */
      memoryToken = token || null;
    }
    $('[data-testid="forget-token"]').hidden = !currentToken();
  }

  let memoryToken = null;
  function currentToken() {
    return getToken() || memoryToken;
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const token = currentToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    let resp;
    try {
      resp = await fetch(API + path, { headers, cache: "no-store" });
    } catch (e) {
      throw new ApiError("network", 0, null, (e && e.message) || String(e), API + path);
    }
    let text = "";
    try {
      text = await resp.text();
    } catch (e) {
      throw new ApiError("network", resp.status, null, (e && e.message) || String(e), API + path);
    }
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_e) {
      body = null;
    }
    if (resp.ok) {
      if (body === null || typeof body !== "object") {
        throw new ApiError("bad-response", resp.status, null, "the response is not a JSON object", API + path);
      }
      return body;
    }
    const kind = resp.status === 401 ? "auth"
      : resp.status === 404 ? "not-found"
      : resp.status === 400 ? "bad-request" : "server";
    const msg = body && typeof body.error === "string" ? body.error : `HTTP ${resp.status}`;
    throw new ApiError(kind, resp.status, body, msg, API + path);
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Page state                                                                               */
  /* ---------------------------------------------------------------------------------------- */

  let requestSeq = 0;
  let lastAction = null; // re-run after a token is entered
  let model = null; // the trace on screen
  let selectedBarId = null;

  function setState(state) {
    document.body.dataset.state = state;
    $('[data-testid="loading"]').hidden = state !== "loading";
    $('[data-testid="welcome"]').hidden = state !== "welcome";
    $('[data-testid="results"]').hidden = state !== "results";
    $('[data-testid="trace"]').hidden = state !== "trace";
    $('[data-testid="error"]').hidden = state !== "error";
    $('[data-testid="token-panel"]').hidden = state !== "auth";
    $('[data-testid="groups"]').hidden = state !== "groups";
    for (const a of document.querySelectorAll(".topnav a")) {
      const mine = a.dataset.testid === (state === "groups" ? "nav-groups" : "nav-search");
      if (mine) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
  }

  function showError(title, detail, warning) {
    const box = $('[data-testid="error"]');
    box.classList.toggle("notice-warning", !!warning);
    $(".notice-title", box).textContent = title;
    $(".notice-detail", box).textContent = detail || "";
    setState("error");
    document.title = "tracemq · error";
  }

  function showApiError(err, what) {
    if (!(err instanceof ApiError)) {
      showError("Something went wrong in the page", String((err && err.stack) || err));
      return;
    }
    if (err.kind === "auth") {
      showTokenPanel();
      return;
    }
    if (err.kind === "network") {
      showError(
        "Could not reach the collector API",
        `The request to ${err.path} failed (${err.message}). Check that the collector is running ` +
          "and reachable from this browser, then search again.",
      );
      return;
    }
    if (err.kind === "not-found") {
      if (what && what.msgId) {
        showError(
          `No trace for msgId ${what.msgId}`,
          "The collector has no trace event for this message. Trace data arrives a few seconds " +
            "after the send; check the id or try again shortly." +
            (err.body && typeof err.body.error === "string" &&
              !err.body.error.toLowerCase().includes("no trace for msgid")
              ? ` (collector: ${err.body.error})` : ""),
          true,
        );
      } else {
        showError("Not found", err.message, true);
      }
      return;
    }
    if (err.kind === "bad-request") {
      const param = err.body && err.body.parameter ? ` (parameter “${err.body.parameter}”)` : "";
      showError("The collector rejected the request", `${err.message}${param}.`);
      return;
    }
    if (err.kind === "bad-response") {
      showError("The collector sent an unexpected response", `${err.path}: ${err.message}.`);
      return;
    }
    showError(`The collector answered HTTP ${err.status}`, err.message);
  }

  function showTokenPanel() {
    const panel = $('[data-testid="token-panel"]');
    const hadToken = !!currentToken();
    let msg = $(".token-error", panel);
    if (hadToken) {
      // The stored token was refused: drop it so a reload does not keep sending it.
      setToken(null);
      if (!msg) {
        msg = h("p", { class: "token-error", "data-testid": "token-error" });
        panel.insertBefore(msg, $(".token-form", panel));
      }
      msg.textContent = "That token was not accepted. Enter a valid token.";
    } else if (msg) {
      msg.remove();
    }
    setState("auth");
    document.title = "tracemq · token required";
    const input = $('[data-testid="token-input"]');
    input.value = "";
    input.focus();
  }

  function pushUrl(params, push) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (present(v)) q.set(k, v);
    const url = `${location.pathname}?${q.toString()}`;
    if (push && `${location.pathname}${location.search}` !== url) {
      history.pushState(params, "", url);
    }
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Actions                                                                                  */
  /* ---------------------------------------------------------------------------------------- */

  async function openTrace(msgId, opts) {
    const o = opts || {};
    const seq = ++requestSeq;
    lastAction = () => openTrace(msgId, { push: false, fallbackToKey: o.fallbackToKey });
    if (o.push) pushUrl({ msgId }, true);
    $('[data-testid="search-input"]').value = msgId;
    setState("loading");
    let trace;
    try {
      trace = await api(`/traces/${encodeURIComponent(msgId)}`);
    } catch (err) {
      if (seq !== requestSeq) return;
      if (err instanceof ApiError && err.kind === "not-found" && o.fallbackToKey) {
        // A 32-hex string can also be a business key (a UUID without dashes, say).
        try {
          const found = await api(listingPath({ key: msgId }, null));
          if (seq !== requestSeq) return;
          if (Array.isArray(found.items) && found.items.length) {
            renderResults({ key: msgId, topic: null }, found, false,
              `No message has msgId ${msgId}, but these were sent with it as a business key.`);
            return;
          }
        } catch (_e) {
          if (seq !== requestSeq) return;
        }
      }
      showApiError(err, { msgId });
      return;
    }
    if (seq !== requestSeq) return;
    renderTrace(msgId, trace);
  }

  /** A datetime-local value (the browser's time zone) as epoch ms, or null. */
  function rangeMs(value) {
    if (!present(value)) return null;
    const t = new Date(value).getTime();
    return Number.isFinite(t) ? t : null;
  }

  /** One listing (by key, or a topic's messages), with each message's outcome per group. */
  function listingPath(q, cursor) {
    const params = new URLSearchParams();
    if (q.key) params.set("key", q.key);
    params.set("limit", PAGE_SIZE);
    if (q.topic) params.set("topic", q.topic);
    params.set("outcomes", 1);
    const begin = rangeMs(q.from);
    const end = rangeMs(q.to);
    if (begin !== null) params.set("begin", begin);
    if (end !== null) params.set("end", end);
    if (cursor) params.set("cursor", cursor);
    return `${q.key ? "/traces" : "/messages"}?${params}`;
  }

  async function searchKey(key, opts) {
    const o = opts || {};
    return runListing({ key, topic: o.topic, from: o.from, to: o.to }, o.push);
  }

  async function searchTopic(topic, opts) {
    const o = opts || {};
    return runListing({ key: null, topic, from: o.from, to: o.to }, o.push);
  }

  async function runListing(query, push) {
    const q = {
      key: present(query.key) ? query.key : null,
      topic: present(query.topic) ? query.topic : null,
      from: present(query.from) ? query.from : null,
      to: present(query.to) ? query.to : null,
    };
    const seq = ++requestSeq;
    lastAction = () => runListing(q, false);
    if (push) pushUrl(q, true);
    $('[data-testid="search-input"]').value = q.key || "";
    $('[data-testid="topic-input"]').value = q.topic || "";
    $('[data-testid="from-input"]').value = q.from || "";
    $('[data-testid="to-input"]').value = q.to || "";
    setState("loading");
    let page;
    try {
      page = await api(listingPath(q, null));
    } catch (err) {
      if (seq !== requestSeq) return;
      showApiError(err, { key: q.key });
      return;
    }
    if (seq !== requestSeq) return;
    renderResults(q, page, false);
  }

  async function loadMore(q, cursor, button) {
    button.disabled = true;
    try {
      const page = await api(listingPath(q, cursor));
      renderResults(q, page, true);
    } catch (err) {
      showApiError(err, { key: q.key });
    } finally {
      button.disabled = false;
    }
  }

  function showGroups(group) {
    const seq = ++requestSeq;
    lastAction = () => showGroups(group);
    model = null;
    setState("loading");
    document.title = group ? `tracemq · group ${group}` : "tracemq · consumer groups";
    const path = group ? `/groups/${encodeURIComponent(group)}` : "/groups";
    return api(path).then(
      (body) => {
        if (seq !== requestSeq) return;
        window.TraceViewerGroups.render(body, group, {
          h, s, pill, dash, fmtIsoLocal, fmtDuration, clear, $,
        }, new URLSearchParams(location.search).get("match"));
        setState("groups");
      },
      (err) => {
        if (seq !== requestSeq) return;
        showApiError(err, {});
      },
    );
  }

  function route() {
    const p = new URLSearchParams(location.search);
    const msgId = (p.get("msgId") || p.get("msgid") || "").trim();
    const key = (p.get("key") || "").trim();
    const topic = (p.get("topic") || "").trim();
    const group = (p.get("group") || "").trim();
    const range = { from: p.get("from"), to: p.get("to") };
    if (msgId) {
      openTrace(msgId, { push: false, fallbackToKey: false });
    } else if (key) {
      searchKey(key, { topic, ...range, push: false });
    } else if (group || p.get("view") === "groups") {
      showGroups(group || null);
    } else if (topic) {
      searchTopic(topic, { ...range, push: false });
    } else {
      ++requestSeq;
      lastAction = null;
      model = null;
      setState("welcome");
      document.title = "tracemq · trace viewer";
    }
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Key search results                                                                       */
  /* ---------------------------------------------------------------------------------------- */

  const OUTCOME_TEXT = {
    consumed: "consumed", retried: "retried", dead_lettered: "dead-lettered", pending: "pending",
  };

  function outcomeCell(outcomes) {
    const list = Array.isArray(outcomes) ? outcomes : [];
    if (!list.length) return h("td", { class: "muted", text: "no consumer group" });
    return h("td", null, h("div", { class: "outcomes" }, list.map((o) => {
      const kind = Object.prototype.hasOwnProperty.call(OUTCOME_TEXT, o.outcome) ? o.outcome : "pending";
      const tries = o.attempts > 1 ? ` (${o.attempts} attempts)` : "";
      return h("span", {
        class: `pill pill-${kind}`, "data-testid": "outcome", "data-group": o.group,
        "data-outcome": kind, title: `${o.group}: ${OUTCOME_TEXT[kind]}${tries}`,
        text: `${o.group}: ${OUTCOME_TEXT[kind]}${tries}`,
      });
    })));
  }

  function renderResults(q, page, appendRows, note) {
    const card = $('[data-testid="results"]');
    const tbody = $("tbody", card);
    const items = Array.isArray(page.items) ? page.items : [];
    if (!appendRows) {
      clear(tbody);
      card.dataset.count = "0";
    }
    for (const it of items) {
      const href = `${location.pathname}?msgId=${encodeURIComponent(it.msg_id)}`;
      const link = h("a", {
        href, "data-testid": "result-link", "data-msg-id": it.msg_id, text: it.msg_id,
        onclick: (ev) => {
          if (ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
          ev.preventDefault();
          openTrace(it.msg_id, { push: true });
        },
      });
      tbody.appendChild(h("tr", { "data-testid": "result", "data-msg-id": it.msg_id },
        h("td", null, link),
        h("td", { text: dash(it.topic) }),
        h("td", { text: fmtIsoLocal(it.timestamp) }),
        h("td", { class: "mono", text: dash(it.keys) }),
        h("td", { text: dash(it.tags) }),
        outcomeCell(it.outcomes),
      ));
    }
    const count = Number(card.dataset.count || 0) + items.length;
    card.dataset.count = String(count);
    const title = $(".results-title", card);
    const range = q.from || q.to
      ? ` sent ${q.from ? `from ${q.from.replace("T", " ")}` : ""}${q.from && q.to ? " " : ""}` +
        `${q.to ? `before ${q.to.replace("T", " ")}` : ""}`
      : "";
    const what = q.key
      ? `with key “${q.key}”${q.topic ? ` in topic “${q.topic}”` : ""}${range}`
      : `in topic “${q.topic}”${range}`;
    title.textContent = note ||
      `${count}${page.next_cursor ? "+" : ""} message${count === 1 ? "" : "s"} ${what}`;
    const empty = $('[data-testid="results-empty"]');
    empty.hidden = count !== 0;
    empty.textContent = count ? "" : `No messages found ${what}. Messages are ` +
      "indexed from the trace data, so a message sent just now may take a few seconds to appear.";
    $("table", card).hidden = count === 0;
    const more = $('[data-testid="load-more"]');
    more.hidden = !page.next_cursor;
    more.onclick = page.next_cursor ? () => loadMore(q, page.next_cursor, more) : null;
    setState("results");
    document.title = q.key ? `tracemq · key ${q.key}` : `tracemq · topic ${q.topic}`;
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Trace view                                                                               */
  /* ---------------------------------------------------------------------------------------- */

  function renderTrace(requestedId, trace) {
    model = buildModel(trace);
    model.msgId = trace.msg_id || requestedId;
    model.topic = trace.topic;
    model.delivery = trace.delivery && typeof trace.delivery === "object" ? trace.delivery : null;
    const q = trace.offset_msg_id_query;
    model.foundBy = trace.found_by === "offset_msg_id" && q && typeof q === "object"
      ? `Found by offsetMsgId ${dash(q.offset_msg_id)}: stored at ${dash(q.store_host)}, queue ${dash(q.queue_id)}, offset ${dash(q.kafka_offset)}.`
      : null;
    selectedBarId = null;
    setState("trace"); // visible before drawing, so that the timeline can measure itself
    renderHeader(model);
    renderTimeline();
    renderEvents(model);
    hideDetails();
    document.title = `tracemq · ${model.msgId}`;
  }

  function pubEvent(m) {
    return m.events.find((e) => e && e.trace_type === "Pub") || null;
  }

  function renderHeader(m) {
    const head = $('[data-testid="trace-header"]');
    $('[data-field="msgId"]', head).textContent = m.msgId;
    const p = m.producer;
    const statusEl = $('[data-field="status"]', head);
    const st = p ? statusFromSuccess(p.success) : "unknown";
    // A stored message is not always one consumers should get: the collector's delivery state
    // says where it is expected, and the badge says that rather than a bare "sent".
    const dv = m.delivery || {};
    const shown = st === "success" ? deliveryBadge(dv) : null;
    const pillKind = shown ? shown.kind : st;
    statusEl.className = `pill pill-${pillKind}`;
    statusEl.dataset.status = st;
    statusEl.dataset.delivery = present(dv.state) ? String(dv.state) : "";
    statusEl.textContent = shown ? shown.text
      : !p ? "no send trace" : st === "success" ? "sent" : st === "failed" ? "send failed" : "send status unknown";

    const pub = pubEvent(m);
    const facts = $(".facts", head);
    clear(facts);
    const fact = (field, label, value, mono) => {
      facts.appendChild(h("div", null,
        h("dt", { class: field === "offsetMsgId" ? "keep-case" : null, text: label }),
        h("dd", { "data-field": field, class: mono ? "mono" : null, title: present(value) ? String(value) : null, text: dash(value) }),
      ));
    };
    fact("topic", "Topic", m.topic || (p && p.topic));
    fact("group", "Producer group", p ? p.group : "no Pub trace");
    fact("sendTime", "Send time", p ? fmtIsoLocal(p.timestamp) : null);
    fact("cost", "Send cost", p ? fmtDuration(p.cost_time) : null);
    // A failed send stored nothing: no store host (the dash), and every attempt is a Pub.
    fact("storeHost", "Store host", p && p.store_host, true);
    if (p && toNum(p.send_attempts) !== null) fact("sendAttempts", "Send attempts", p.send_attempts);
    fact("msgType", "Message type", p && msgTypeName(p.msg_type, p.msg_type_name));
    fact("offsetMsgId", "offsetMsgId", p && p.offset_msg_id, true);
    fact("region", "Region", p && p.region_id);
    if (pub && present(pub.tags)) fact("tags", "Tags", pub.tags);
    if (pub && present(pub.keys)) fact("keys", "Keys", pub.keys, true);
    if (p && present(p.client_host)) fact("clientHost", "Producer client", p.client_host, true);
    if (p && present(p.client_id)) fact("clientId", "Producer client id", p.client_id, true);

    // One-line summary of what happened to the message.
    const summary = $('[data-testid="summary"]');
    clear(summary);
    let attempts = 0;
    let ok = 0;
    let failed = 0;
    let unknown = 0;
    for (const c of m.consumers) {
      for (const a of c.attempts || []) {
        attempts++;
        const st2 = normaliseStatus(a.status);
        if (st2 === "success") ok++;
        else if (st2 === "failed") failed++;
        else unknown++;
      }
    }
    const groups = m.consumers.length;
    const expectation = deliverySentence(dv);
    if (expectation) append(summary, [h("span", { "data-testid": "delivery-note", text: expectation }), " "]);
    if (m.foundBy) append(summary, [h("span", { "data-testid": "found-by", text: m.foundBy }), " "]);
    if (!groups) {
      // Only a message consumers should get is "not traced yet"; a rolled-back or held-back one
      // having no consumer is the expected outcome, said above.
      if (dv.expect_consumers !== false) {
        append(summary, ["No consumer group has traced this message yet."]);
      }
    } else {
      append(summary, [
        h("strong", { text: `${groups} consumer group${groups === 1 ? "" : "s"}` }),
        ` · ${attempts} consume attempt${attempts === 1 ? "" : "s"}: `,
        `${ok} succeeded`,
        failed ? [", ", h("span", { class: "bad", text: `${failed} failed` })] : null,
        unknown ? [", ", h("span", { class: "warn", text: `${unknown} without a result yet` })] : null,
      ]);
    }
    if (m.transactions.length) {
      append(summary, [` · ${m.transactions.length} transaction event${m.transactions.length === 1 ? "" : "s"}`]);
    }
    append(summary, [` · ${m.events.length} raw event${m.events.length === 1 ? "" : "s"}`]);
  }

  function deliveryBadge(dv) {
    switch (dv.state) {
      case "rolled_back": return { kind: "neutral", text: "rolled back — expected nowhere" };
      case "recalled": return { kind: "neutral", text: "recalled — expected nowhere" };
      case "half": return { kind: "unknown", text: "half message — not committed or rolled back yet" };
      case "committed": return { kind: "success", text: "committed" };
      case "delayed":
        return { kind: "delayed", text: toNum(dv.due_time) !== null ? `delayed — due ${fmtIsoLocal(dv.due_time)}` : "delayed" };
      default: return null;
    }
  }

  function deliverySentence(dv) {
    switch (dv.state) {
      case "recalled":
        return `Recalled by ${dash(dv.recalled_by)} at ${fmtIsoLocal(dv.recalled_at)}, before it was due: no consumer group should receive it.`;
      case "rolled_back":
        return `Rolled back${dv.from_transaction_check ? " on the broker's check-back" : ""} at ${fmtIsoLocal(dv.decided_at)}: no consumer group should receive it.`;
      case "half":
        return "Half message: the transaction is not committed or rolled back yet, so consumers do not see it.";
      case "committed":
        return `Committed${dv.from_transaction_check ? " on the broker's check-back" : ""} at ${fmtIsoLocal(dv.decided_at)}.`;
      case "delayed":
        if (toNum(dv.due_time) === null) return `Delayed${present(dv.delay_level) ? ` (level ${dv.delay_level})` : ""}: due time unknown.`;
        return `Delayed (level ${dv.delay_level}): due at ${fmtIsoLocal(dv.due_time)}${dv.due_time_basis ? ` (with the ${dv.due_time_basis})` : ""}.`;
      default: return null;
    }
  }

  function barLabel(b) {
    const d = b.data || {};
    if (b.kind === "producer") {
      const c = fmtDuration(d.cost_time);
      return b.status === "failed" ? `send failed · ${c}` : `send · ${c}`;
    }
    if (b.kind === "transaction") {
      return `${dash(d.transaction_state)}${d.from_transaction_check ? " (check-back)" : ""}`;
    }
    if (b.kind === "deadletter") {
      return d.success === false ? "dead-letter write failed" : "dead-lettered";
    }
    if (b.kind === "recall") return d.success ? "recalled" : "recall refused";
    const retry = b.retry ? ` · retry ${b.retry}` : "";
    if (b.status === "unknown") {
      return b.open ? `started${retry} · no result traced` : `unknown${retry}`;
    }
    if (b.status === "failed") {
      const code = contextCodeName(d.context_code, d.context_code_name) || "failed";
      return `${code} · ${fmtDuration(d.cost_time)}${retry}`;
    }
    return `${fmtDuration(d.cost_time)}${retry}`;
  }

  function barTitle(b) {
    const d = b.data || {};
    if (b.kind === "producer") {
      return `Producer ${dash(d.group)}\nsent ${fmtIsoLocal(d.timestamp)}\ncost ${fmtDuration(d.cost_time)} · ${b.status}`;
    }
    if (b.kind === "transaction") {
      return `Transaction ${dash(d.transaction_id)} · ${dash(d.transaction_state)}\n${fmtIsoLocal(d.timestamp)}`;
    }
    if (b.kind === "deadletter") {
      return `${dash(d.group)} gave up: moved to ${dash(d.topic)}\n${fmtIsoLocal(d.timestamp)}`;
    }
    if (b.kind === "recall") {
      return `Recall by ${dash(d.group)} · ${d.success ? "recalled" : "refused"}\n${fmtIsoLocal(d.timestamp)}`;
    }
    const code = contextCodeName(d.context_code, d.context_code_name);
    return `${dash(b.group)} · retry ${b.retry ?? "—"} · ${b.status}` +
      `${code ? ` (${code})` : ""}\nbegin ${fmtIsoLocal(d.begin)}\nend ${fmtIsoLocal(d.end)}` +
      `\ncost ${fmtDuration(d.cost_time)}`;
  }

  /** Set an attached SVG text to the first candidate that fits maxW, else truncate the last. */
  function fitText(el, candidates, maxW) {
    for (const c of candidates) {
      el.textContent = c;
      if (el.getComputedTextLength() <= maxW) return;
    }
    const last = candidates[candidates.length - 1];
    for (let n = last.length - 1; n > 1; n--) {
      el.textContent = `${last.slice(0, n)}…`;
      if (el.getComputedTextLength() <= maxW) return;
    }
  }

  function renderTimeline() {
    const m = model;
    const host = $('[data-testid="timeline"]');
    clear(host);
    $('[data-testid="axis-note"]').textContent =
      `Time after ${m.originLabel}` +
      (m.origin ? `, ${fmtIsoLocal(m.origin)}.` : ".");
    if (!m.rows.length) {
      host.appendChild(h("p", { class: "muted", text: "Nothing to draw: this trace has no send, transaction or consume event." }));
      return;
    }

    const width = Math.max(host.clientWidth || 900, 480);
    const labelW = Math.round(Math.min(230, Math.max(150, width * 0.2)));
    const plotL = labelW + PLOT_PAD_L;
    const plotR = width - PLOT_PAD_R;
    const height = AXIS_H + m.rows.length * ROW_H + 8;
    const x = (t) => plotL + ((t - m.lo) / (m.hi - m.lo)) * (plotR - plotL);

    const svg = s("svg", {
      width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": "Timeline of the message's trace events", "data-testid": "timeline-svg",
    });
    host.appendChild(svg);
    svg.appendChild(s("defs", null,
      s("pattern", { id: "tmq-hatch-unknown", width: 7, height: 7, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { width: 7, height: 7, fill: "#fef3c7" }),
        s("rect", { width: 2.5, height: 7, fill: "#f5b54a" }),
      ),
    ));

    // Row backgrounds and labels.
    m.rows.forEach((row, i) => {
      const top = AXIS_H + i * ROW_H;
      const g = s("g", { class: "tl-row", "data-testid": "row", "data-row": row.key });
      g.appendChild(s("rect", { class: `tl-row-bg${i % 2 ? " alt" : ""}`, x: 0, y: top, width, height: ROW_H }));
      g.appendChild(s("line", { class: "tl-sep", x1: 0, x2: width, y1: top + ROW_H, y2: top + ROW_H }));
      g.appendChild(s("title", { text: `${row.role}\n${row.name}` }));
      const role = s("text", { class: "tl-role", x: 12, y: top + 18 });
      const name = s("text", { class: "tl-name", x: 12, y: top + 35 });
      g.appendChild(role);
      g.appendChild(name);
      svg.appendChild(g);
      fitText(role, [row.role, ...(row.roleShort || [])], labelW - 20);
      fitText(name, [String(row.name)], labelW - 20);
    });
    svg.appendChild(s("line", { class: "tl-label-divider", x1: labelW, x2: labelW, y1: AXIS_H, y2: height - 8 }));

    // Axis: grid lines and tick labels.
    const targetTicks = Math.max(2, Math.floor((plotR - plotL) / 110));
    const step = niceStep((m.hi - m.lo) / targetTicks);
    const axis = s("g", { class: "tl-axis-group", "data-testid": "axis" });
    for (let t = Math.ceil(m.lo / step) * step; t <= m.hi; t += step) {
      const xx = x(t);
      axis.appendChild(s("line", { class: t === 0 ? "tl-zero" : "tl-grid", x1: xx, x2: xx, y1: AXIS_H - 4, y2: height - 8 }));
      const anchor = xx > plotR - 30 ? "end" : "middle";
      axis.appendChild(s("text", { class: "tl-tick", x: xx, y: AXIS_H - 10, "text-anchor": anchor, text: t === 0 ? "0" : fmtRel(t) }));
    }
    axis.appendChild(s("line", { class: "tl-axis", x1: labelW, x2: width, y1: AXIS_H - 0.5, y2: AXIS_H - 0.5 }));
    svg.appendChild(axis);

    // Bars.
    const measure = s("text", { class: "bar-label", x: -1000, y: -1000 });
    svg.appendChild(measure);
    const textWidth = (text) => {
      measure.textContent = text;
      const w = measure.getComputedTextLength();
      return w > 0 ? w : text.length * 6.4;
    };

    m.rows.forEach((row, i) => {
      const top = AXIS_H + i * ROW_H;
      const y = top + (ROW_H - BAR_H) / 2;
      const placed = row.bars.map((b) => {
        const x1 = x(b.start);
        const x2 = b.open ? plotR : Math.max(x(b.end), x1 + MIN_BAR_W);
        return { b, x1, x2: Math.min(Math.max(x2, x1 + MIN_BAR_W), Math.max(plotR, x1 + MIN_BAR_W)) };
      });
      const occupied = placed.map((p) => [p.x1, p.x2]);
      for (const p of placed) {
        const { b, x1, x2 } = p;
        const w = x2 - x1;
        const g = s("g", {
          class: `bar-group${b.id === selectedBarId ? " selected" : ""}`, tabindex: 0, role: "button",
          "data-bar-id": b.id, "aria-label": barTitle(b).replace(/\n/g, ", "),
        });
        const hitW = Math.max(w, HIT_MIN_W);
        g.appendChild(s("rect", { class: "bar-hit", x: x1 - (hitW - w) / 2, y: top + 4, width: hitW, height: ROW_H - 8 }));
        const rect = s("rect", {
          class: `bar status-${b.status}`, x: x1, y, width: w, height: BAR_H, rx: 3,
          "data-testid": "bar", "data-row": b.row, "data-status": b.status, "data-kind": b.kind,
          "data-retry": b.retry === null ? null : String(b.retry),
          "data-request-id": b.kind === "attempt" && present(b.data.request_id) ? b.data.request_id : null,
          "data-bar-id": b.id,
        });
        rect.appendChild(s("title", { text: barTitle(b) }));
        g.appendChild(rect);
        g.addEventListener("click", () => selectBar(b.id));
        g.addEventListener("keydown", (ev) => {
          if (ev.key === "Enter" || ev.key === " ") {
            ev.preventDefault();
            selectBar(b.id);
          }
        });

        // A short label beside the bar (or inside an open bar), when there is room for it.
        const text = barLabel(b);
        const tw = textWidth(text);
        const overlaps = (a1, a2, self) =>
          occupied.some(([o1, o2], k) => k !== self && a1 < o2 + 4 && a2 > o1 - 4);
        const self = placed.indexOf(p);
        let lx = null;
        let anchor = "start";
        if (b.open && w >= tw + 16) {
          lx = x1 + 8;
        } else if (x2 + 6 + tw <= plotR + PLOT_PAD_R - 2 && !overlaps(x2 + 6, x2 + 6 + tw, self)) {
          lx = x2 + 6;
        } else if (x1 - 6 - tw >= plotL - PLOT_PAD_L && !overlaps(x1 - 6 - tw, x1 - 6, self)) {
          lx = x1 - 6;
          anchor = "end";
        }
        if (lx !== null) {
          if (!b.open) occupied.push(anchor === "start" ? [lx, lx + tw] : [lx - tw, lx]);
          g.appendChild(s("text", {
            class: `bar-label ${b.status}`, x: lx, y: y + BAR_H / 2 + 4, "text-anchor": anchor, text,
          }));
        }
        svg.appendChild(g);
      }
    });
    measure.remove();
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Details panel                                                                            */
  /* ---------------------------------------------------------------------------------------- */

  function findBar(id) {
    if (!model) return null;
    for (const r of model.rows) for (const b of r.bars) if (b.id === id) return b;
    return null;
  }

  function selectBar(id) {
    const b = findBar(id);
    if (!b) return;
    selectedBarId = id;
    for (const g of document.querySelectorAll(".bar-group")) {
      g.classList.toggle("selected", g.getAttribute("data-bar-id") === id);
    }
    renderDetails(b);
    highlightEvents(b);
  }

  function hideDetails() {
    selectedBarId = null;
    $('[data-testid="details"]').hidden = true;
    for (const g of document.querySelectorAll(".bar-group.selected")) g.classList.remove("selected");
    highlightEvents(null);
  }

  function timeWithRel(ms) {
    const t = toNum(ms);
    if (t === null) return null;
    return [
      h("span", { class: "when", text: fmtIsoLocal(t) }),
      h("span", { class: "rel", text: `(${fmtRel(t - model.origin)})` }),
    ];
  }

  function renderDetails(b) {
    const panel = $('[data-testid="details"]');
    const d = b.data || {};
    panel.className = `card details status-${b.status}`;
    panel.dataset.barId = b.id;
    panel.dataset.status = b.status;
    const list = $(".details-list", panel);
    clear(list);
    const item = (field, label, value, mono) => {
      const dd = h("dd", { "data-field": field, class: mono ? "mono" : null });
      if (value === null || value === undefined || value === "") dd.textContent = "—";
      else append(dd, [value]);
      list.appendChild(h("div", null, h("dt", { class: field === "offsetMsgId" ? "keep-case" : null, text: label }), dd));
    };
    const statusText = (st) => pill(st, st);
    if (b.kind === "producer") {
      $(".details-title", panel).textContent = `Send · ${dash(d.group)}`;
      item("group", "Producer group", dash(d.group));
      item("begin", "Send time", timeWithRel(d.timestamp));
      item("cost", "Cost (send round trip)", fmtDuration(d.cost_time));
      item("status", "Status", statusText(b.status));
      item("storeHost", "Store host", present(d.store_host) ? d.store_host : null, true);
      item("msgType", "Message type", msgTypeName(d.msg_type, d.msg_type_name));
      item("offsetMsgId", "offsetMsgId", present(d.offset_msg_id) ? d.offset_msg_id : null, true);
      item("region", "Region", present(d.region_id) ? d.region_id : null);
      item("clientHost", "Client host", present(d.client_host) ? d.client_host : null, true);
      item("clientId", "Client id", present(d.client_id) ? d.client_id : null, true);
    } else if (b.kind === "transaction") {
      $(".details-title", panel).textContent = `Transaction end · ${dash(d.group)}`;
      item("group", "Producer group", dash(d.group));
      item("begin", "Time", timeWithRel(d.timestamp));
      item("transactionId", "Transaction id", present(d.transaction_id) ? d.transaction_id : null, true);
      item("transactionState", "State", present(d.transaction_state) ? d.transaction_state : null);
      item("status", "Status", statusText(b.status));
      item("fromCheck", "From broker check-back", d.from_transaction_check === true ? "yes" : d.from_transaction_check === false ? "no" : null);
      item("msgType", "Message type", msgTypeName(d.msg_type, d.msg_type_name));
    } else if (b.kind === "recall") {
      $(".details-title", panel).textContent = `Recall · ${dash(d.group)}`;
      item("group", "Producer group", dash(d.group));
      item("begin", "Time", timeWithRel(d.timestamp));
      item("result", "Result", d.success ? "recalled: not delivered" : "refused (too late, or no such message)");
      item("status", "Status", statusText(b.status));
      item("region", "Region", present(d.region_id) ? d.region_id : null);
    } else if (b.kind === "deadletter") {
      $(".details-title", panel).textContent = `Dead-lettered · ${dash(d.group)}`;
      item("group", "Consumer group", dash(d.group));
      item("topic", "Dead-letter topic", dash(d.topic), true);
      item("begin", "Moved at", timeWithRel(d.timestamp));
      item("status", "Status", statusText(b.status));
      item("clientHost", "Client host", present(d.client_host) ? d.client_host : null, true);
      item("clientId", "Client id", present(d.client_id) ? d.client_id : null, true);
    } else {
      $(".details-title", panel).textContent = `Consume attempt · ${dash(b.group)}`;
      item("group", "Consumer group", dash(b.group));
      item("requestId", "Request id", present(d.request_id) ? d.request_id : null, true);
      item("retry", "Retry times", b.retry === null ? null : String(b.retry));
      item("begin", "Begin (SubBefore)", timeWithRel(d.begin));
      item("end", "End (SubAfter)", toNum(d.end) === null ? "— no SubAfter traced (still running, lost, or the consumer died)" : timeWithRel(d.end));
      item("cost", "Cost (listener time)", toNum(d.cost_time) === null ? null : fmtDuration(d.cost_time));
      item("status", "Status", statusText(b.status));
      const code = contextCodeName(d.context_code, d.context_code_name);
      item("contextCode", "Context code", code);
      item("clientHost", "Client host", present(d.client_host) ? d.client_host : null, true);
      item("clientId", "Client id", present(d.client_id) ? d.client_id : null, true);
    }
    panel.hidden = false;
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Raw events                                                                               */
  /* ---------------------------------------------------------------------------------------- */

  function eventMatchesBar(e, b) {
    if (!b || !e) return false;
    if (b.kind === "producer") return e.trace_type === "Pub" && !String(e.topic || "").startsWith("%DLQ%");
    if (b.kind === "deadletter") return e.trace_type === "Pub" && e.topic === b.data.topic;
    if (b.kind === "recall") return e.trace_type === "Recall" && toNum(e.timestamp) === toNum(b.data.timestamp);
    if (b.kind === "transaction") {
      return e.trace_type === "EndTransaction" &&
        (present(b.data.transaction_id) ? e.transaction_id === b.data.transaction_id : toNum(e.timestamp) === toNum(b.data.timestamp));
    }
    return (e.trace_type === "SubBefore" || e.trace_type === "SubAfter") &&
      present(e.request_id) && e.request_id === b.data.request_id &&
      (!present(e.group_name) || e.group_name === b.group);
  }

  function barForEvent(e) {
    if (!model) return null;
    for (const r of model.rows) for (const b of r.bars) if (eventMatchesBar(e, b)) return b;
    return null;
  }

  function highlightEvents(b) {
    if (!model) return;
    const rows = document.querySelectorAll('[data-testid="events-table"] tbody tr[data-index]');
    for (const tr of rows) {
      const e = model.events[Number(tr.dataset.index)];
      tr.classList.toggle("highlight", !!b && eventMatchesBar(e, b));
    }
  }

  function renderEvents(m) {
    const table = $('[data-testid="events-table"]');
    const tbody = $("tbody", table);
    clear(tbody);
    $(".events-count").textContent = `${m.events.length} event${m.events.length === 1 ? "" : "s"}`;
    if (!m.events.length) {
      tbody.appendChild(h("tr", { class: "empty" }, h("td", { colspan: 9, class: "muted", text: "No raw events." })));
      return;
    }
    m.events.forEach((e, i) => {
      const type = String(e.trace_type || "?");
      const isSub = type === "SubBefore" || type === "SubAfter";
      let success = h("span", { class: "none", text: "—" });
      if (type !== "SubBefore" && e.success === true) success = h("span", { class: "yes", text: "yes" });
      if (type !== "SubBefore" && e.success === false) success = h("span", { class: "no", text: "no" });
      const code = type === "SubAfter" ? contextCodeName(e.context_code, e.context_code_name) : null;
      const time = toNum(e.timestamp);
      const part = present(e.trace_partition) ? e.trace_partition : null;
      const off = present(e.trace_offset) ? e.trace_offset : null;
      const bar = barForEvent(e);
      const tr = h("tr", {
        "data-testid": "event-row", "data-index": i, "data-type": type, class: bar ? "linked" : null,
        title: bar ? "Click to show this event's bar in the timeline" : null,
      },
        h("td", null, h("span", { class: `type-tag type-${type.replace(/[^A-Za-z]/g, "")}`, text: type })),
        h("td", null, time === null ? "—" : [fmtIsoLocal(time), h("span", { class: "rel", text: fmtRel(time - m.origin) })]),
        h("td", { class: "wrap", text: dash(e.group_name) }),
        h("td", { class: "num", text: toNum(e.cost_time) === null || type === "SubBefore" ? "—" : fmtDuration(e.cost_time) }),
        h("td", null, success),
        h("td", { text: code || "—", title: present(e.context_code) ? `context code ${e.context_code}` : null }),
        h("td", { class: "num", text: isSub && toNum(e.retry_times) !== null && type === "SubBefore" ? String(e.retry_times) : "—" }),
        h("td", { class: "mono wrap", text: dash(e.request_id) }),
        h("td", {
          class: "mono", title: present(e.trace_topic) ? `trace topic ${e.trace_topic}` : null,
          text: part === null && off === null ? "—" : `${dash(part)} / ${dash(off)}`,
        }),
      );
      if (bar) tr.addEventListener("click", () => {
        selectBar(bar.id);
        const g = document.querySelector(`.bar-group[data-bar-id="${bar.id}"]`);
        if (g && g.scrollIntoView) g.scrollIntoView({ block: "nearest" });
      });
      tbody.appendChild(tr);
    });
  }

  /* ---------------------------------------------------------------------------------------- */
  /* Wiring                                                                                   */
  /* ---------------------------------------------------------------------------------------- */

  function init() {
    let tz = "local";
    try {
      tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
    } catch (_e) { /* keep "local" */ }
    $('[data-testid="timezone"]').textContent = tz;
    $('[data-testid="forget-token"]').hidden = !currentToken();

    $('[data-testid="search-form"]').addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = $('[data-testid="search-input"]').value.trim();
      const topic = $('[data-testid="topic-input"]').value.trim();
      const range = {
        from: $('[data-testid="from-input"]').value, to: $('[data-testid="to-input"]').value,
      };
      if (!q && !topic) {
        $('[data-testid="search-input"]').focus();
        return;
      }
      // A msgId or an offsetMsgId (the API resolves either); a 32-hex key is tried next.
      if (q && MSGID_RE.test(q)) openTrace(q, { push: true, fallbackToKey: true });
      else if (q) searchKey(q, { topic, ...range, push: true });
      else searchTopic(topic, { ...range, push: true });
    });

    $('[data-testid="token-form"]').addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $('[data-testid="token-input"]').value.trim();
      if (!token) return;
      setToken(token);
      if (lastAction) lastAction();
      else route();
    });

    $('[data-testid="forget-token"]').addEventListener("click", () => {
      setToken(null);
      route();
    });

    $('[data-testid="details-close"]').addEventListener("click", hideDetails);
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") hideDetails();
    });

    let resizeFrame = 0;
    let lastWidth = 0;
    window.addEventListener("resize", () => {
      if (resizeFrame) return;
      resizeFrame = requestAnimationFrame(() => {
        resizeFrame = 0;
        const w = $('[data-testid="timeline"]').clientWidth;
        if (model && document.body.dataset.state === "trace" && w !== lastWidth) {
          lastWidth = w;
          renderTimeline();
        }
      });
    });

    window.addEventListener("popstate", route);
    route();
  }

  window.TraceViewer = {
    normaliseStatus, statusFromSuccess, statusFromTransaction, buildModel, fmtDuration,
    fmtIsoLocal, contextCodeName, msgTypeName, niceStep,
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
