// ratifier dashboard: polls the JSON API every 2 s and renders with plain DOM (no libraries,
// no HTML built from strings: every value goes through textContent).
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "ratifier.dashboard.token";
const STATUS_COLORS = {
  succeeded: "#16a34a",
  awaiting_approval: "#6366f1",
  failed: "#dc2626",
  rejected: "#f97316",
  denied: "#e11d48",
  unknown: "#eab308",
  conflict: "#a855f7",
  expired: "#64748b",
  cancelled: "#94a3b8",
};
const STATUS_ORDER = Object.keys(STATUS_COLORS);
const DECISION_COLORS = { approve: "#0ea5e9", reject: "#f97316", edit: "#8b5cf6" };
const REFUSED = ["failed", "rejected", "denied", "conflict", "expired", "cancelled"];
const FILTERS = ["window", "tenant", "tool", "status", "error_code"];

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  me: null,
  filters: { window: "3600", tenant: "", tool: "", status: "", error_code: "" },
  overview: null,
  seenFeed: new Set(),
  feedPrimed: false,
  mine: new Set(), // call ids decided from this tab (highlighted in the feed)
  cards: new Map(), // call id -> {el, item, refs}
  clockOffset: 0, // server time minus browser time, ms
  inFlight: false,
};

// ------------------------------------------------------------------ helpers

const $ = (id) => document.getElementById(id);

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") for (const [p, v] of Object.entries(value)) el.style.setProperty(p, v);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children.flat()) if (child) el.append(child);
  return el;
}

const humanStatus = (status) => String(status || "").replace(/_/g, " ");

function chip(status, label) {
  const decision = String(status || "").startsWith("decision:") ? status.split(":")[1] : null;
  const color = decision ? DECISION_COLORS[decision] || "#0ea5e9" : STATUS_COLORS[status] || "#64748b";
  const text = label || (decision ? `${decision} decision` : humanStatus(status));
  return h("span", { class: "chip", style: { "--c": color }, "data-status": status }, text);
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 59950) return `${(ms / 1000).toFixed(ms < 9995 ? 2 : 1)} s`;
  const total = Math.round(ms / 1000);
  const m = Math.floor(total / 60);
  return `${m}m ${String(total % 60).padStart(2, "0")}s`;
}

function fmtLeft(seconds) {
  if (seconds <= 0) return "expired";
  const m = Math.floor(seconds / 60);
  const sec = Math.floor(seconds % 60);
  if (m >= 60) return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m left`;
  return `${m}:${String(sec).padStart(2, "0")} left`;
}

function fmtTime(iso) {
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

function ago(iso) {
  const seconds = Math.max(0, (serverNow() - new Date(iso).getTime()) / 1000);
  if (seconds < 5) return "just now";
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

const serverNow = () => Date.now() + state.clockOffset;
const shortId = (id) => (id && id.length > 22 ? `${id.slice(0, 10)}…${id.slice(-8)}` : id || "");

function toast(text, tone) {
  const el = h("div", { class: `toast ${tone || ""}` }, text);
  $("toasts").append(el);
  setTimeout(() => el.remove(), 5000);
}

class ApiError extends Error {
  constructor(status, code, message, refusal) {
    super(message);
    this.status = status;
    this.code = code;
    this.refusal = refusal || null; // why the approval service refused a decision
  }
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (options.auth && state.token) headers.Authorization = `Bearer ${state.token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
  } catch (err) {
    throw new ApiError(0, "unreachable", "The dashboard server cannot be reached.");
  }
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;
  }
  if (!response.ok) {
    const error = (body && body.error) || {};
    throw new ApiError(response.status, error.code || `http_${response.status}`, error.message || response.statusText, error.refusal);
  }
  return body;
}

function query() {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (state.filters[name]) params.set(name, state.filters[name]);
  return params.toString();
}

// ------------------------------------------------------------------ header and health

function setHealth(kind, text) {
  $("health").dataset.state = kind;
  $("health-text").textContent = text;
}

function showBanner(text) {
  const banner = $("banner");
  banner.hidden = !text;
  banner.textContent = text || "";
}

function renderHealth(overview) {
  $("prefix").textContent = overview.prefix || "(no prefix)";
  if (!overview.last_outcome_at) {
    setHealth("stale", "connected · no outcomes recorded yet");
    return;
  }
  const age = (serverNow() - new Date(overview.last_outcome_at).getTime()) / 1000;
  setHealth(age < 600 ? "live" : "stale", `live · last outcome ${ago(overview.last_outcome_at)}`);
}

// ------------------------------------------------------------------ filters

function fillSelect(name, values, label) {
  const select = $(`f-${name}`);
  const current = state.filters[name];
  const wanted = [...new Set([...(values || []), ...(current ? [current] : [])])].sort();
  const existing = [...select.options].slice(1).map((o) => o.value);
  if (existing.join("\u0000") !== wanted.join("\u0000")) {
    select.replaceChildren(
      h("option", { value: "" }, label),
      ...wanted.map((v) => h("option", { value: v }, name === "status" ? humanStatus(v) : v)),
    );
  }
  select.value = current;
  select.classList.toggle("active", Boolean(current));
}

function renderFacets(facets) {
  fillSelect("tenant", facets.tenant, "all tenants");
  fillSelect("tool", facets.tool, "all tools");
  fillSelect("status", [...new Set([...STATUS_ORDER, ...(facets.status || [])])], "all statuses");
  fillSelect("error_code", facets.error_code, "all error codes");
}

function initFilters() {
  const params = new URLSearchParams(location.search);
  for (const name of FILTERS) if (params.get(name)) state.filters[name] = params.get(name);
  $("f-window").value = state.filters.window;
  for (const name of FILTERS) {
    $(`f-${name}`).addEventListener("change", (event) => {
      state.filters[name] = event.target.value;
      history.replaceState(null, "", `?${query()}`);
      refresh();
    });
  }
  $("f-clear").addEventListener("click", () => {
    state.filters = { window: state.filters.window, tenant: "", tool: "", status: "", error_code: "" };
    history.replaceState(null, "", `?${query()}`);
    refresh();
  });
}

// ------------------------------------------------------------------ KPIs

function kpiTile(label, value, sub, tone, extra) {
  return h(
    "div",
    { class: `kpi ${extra || ""}`, style: { "--tone": tone } },
    h("div", { class: "k-label" }, label),
    h("div", { class: "k-value" }, value),
    h("div", { class: "k-sub" }, sub),
  );
}

function renderKpis(overview) {
  const k = overview.kpis;
  const by = k.by_status || {};
  const total = Object.entries(by).reduce((n, [st, c]) => n + (st === "awaiting_approval" ? 0 : c), 0);
  const ok = by.succeeded || 0;
  const refused = REFUSED.reduce((n, st) => n + (by[st] || 0), 0);
  const topCode = Object.entries(k.by_code || {})
    .filter(([code]) => code !== "approval_required")
    .sort((a, b) => b[1] - a[1])[0];
  const e2e = (overview.latency || []).find((r) => r.stage === "end_to_end") || {};
  const windowLabel = $("f-window").selectedOptions[0].textContent;
  $("kpis").replaceChildren(
    kpiTile("Calls finished", total.toLocaleString(), `terminal outcomes, ${windowLabel}`, "#4f46e5"),
    kpiTile("Succeeded", ok.toLocaleString(), total ? `${((100 * ok) / total).toFixed(1)}% of finished calls` : "no finished calls yet", STATUS_COLORS.succeeded),
    kpiTile("Refused or failed", refused.toLocaleString(), topCode ? `most often ${topCode[0]} (${topCode[1]})` : "none", STATUS_COLORS.failed),
    kpiTile("Awaiting approval", String(k.pending_approvals), state.filters.tenant ? `in ${state.filters.tenant}` : "across tenants", STATUS_COLORS.awaiting_approval),
    kpiTile(
      "Unknown outcomes",
      String(k.reconciling + k.escalated),
      k.escalated ? `${k.escalated} escalated to humans` : `${k.reconciling} being reconciled`,
      k.escalated ? STATUS_COLORS.failed : STATUS_COLORS.unknown,
      k.escalated ? "alert" : "",
    ),
    kpiTile("End to end p95", fmtMs(e2e.p95), e2e.n ? `p50 ${fmtMs(e2e.p50)} · ${e2e.n} calls` : "no finished calls", "#0ea5e9"),
  );
}

// ------------------------------------------------------------------ chart

function renderChart(overview) {
  const box = $("chart");
  const width = Math.max(box.clientWidth, 320);
  const height = 220;
  const pad = { left: 38, right: 8, top: 10, bottom: 24 };
  const series = overview.series || [];
  const totals = series.map((b) => Object.values(b.counts).reduce((a, n) => a + n, 0));
  const max = Math.max(1, ...totals);
  const step = niceStep(max);
  const top = Math.ceil(max / step) * step;
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const slot = innerW / Math.max(series.length, 1);
  const barW = Math.max(2, slot * 0.72);
  const y = (v) => pad.top + innerH - (v / top) * innerH;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "Outcomes per time bucket, stacked by status" });
  for (let v = 0; v <= top; v += step) {
    svg.append(s("line", { class: "grid-line", x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v) }));
    const label = s("text", { class: "axis", x: pad.left - 6, y: y(v) + 4, "text-anchor": "end" });
    label.textContent = String(v);
    svg.append(label);
  }
  const labelEvery = Math.max(1, Math.ceil(series.length / 7));
  series.forEach((bucket, i) => {
    const x = pad.left + i * slot + (slot - barW) / 2;
    let base = 0;
    const group = s("g", {});
    const title = s("title", {});
    const lines = [fmtTime(bucket.at)];
    for (const status of [...STATUS_ORDER, ...Object.keys(bucket.counts).filter((k) => !STATUS_COLORS[k])]) {
      const n = bucket.counts[status] || 0;
      if (!n) continue;
      const y0 = y(base + n);
      group.append(s("rect", { x, y: y0, width: barW, height: Math.max(1, y(base) - y0), fill: STATUS_COLORS[status] || "#94a3b8", rx: 1.5 }));
      lines.push(`${humanStatus(status)}: ${n}`);
      base += n;
    }
    title.textContent = lines.join("\n");
    group.append(s("rect", { x: pad.left + i * slot, y: pad.top, width: slot, height: innerH, fill: "transparent" }), title);
    svg.append(group);
    if (i % labelEvery === 0 || i === series.length - 1) {
      const label = s("text", { class: "axis", x: pad.left + i * slot + slot / 2, y: height - 6, "text-anchor": "middle" });
      label.textContent = i === series.length - 1 ? "now" : fmtTime(bucket.at).slice(0, 5);
      svg.append(label);
    }
  });
  box.replaceChildren(svg);
  const sums = {};
  for (const b of series) for (const [k, n] of Object.entries(b.counts)) sums[k] = (sums[k] || 0) + n;
  const shown = STATUS_ORDER.filter((st) => sums[st]);
  $("legend").replaceChildren(
    ...(shown.length
      ? shown.map((st) => h("span", {}, h("span", { class: "swatch", style: { background: STATUS_COLORS[st] } }), humanStatus(st), h("b", {}, sums[st])))
      : [h("span", { class: "muted" }, "No outcomes in this window.")]),
  );
  $("chart-hint").textContent = `one bar per ${overview.bucket_seconds >= 60 ? `${overview.bucket_seconds / 60} min` : `${overview.bucket_seconds} s`}`;
}

function niceStep(max) {
  const raw = max / 4;
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  for (const m of [1, 2, 5, 10]) if (raw <= m * mag) return Math.max(1, m * mag);
  return Math.max(1, 10 * mag);
}

// ------------------------------------------------------------------ feed

function feedDetails(item) {
  if (item.kind === "decision") {
    return [h("span", {}, `${item.decision || "decision"} published by ${item.approver || "an approver"}`), item.reason ? h("span", { class: "msg" }, ` · “${item.reason}”`) : null];
  }
  const parts = [];
  if (item.error_code) parts.push(h("span", { class: "code-chip" }, item.error_code), " ");
  if (item.message) parts.push(h("span", { class: "msg" }, item.message));
  if (item.detail) parts.push(h("span", {}, item.detail));
  if (item.approver) parts.push(h("span", { class: "msg" }, ` · approved by ${item.approver}`));
  if (!parts.length && item.resource_id) parts.push(h("span", {}, item.resource_id));
  return parts;
}

function renderFeed(items) {
  const tbody = $("feed").querySelector("tbody");
  const rows = items.map((item) => {
    const fresh = state.feedPrimed && !state.seenFeed.has(item.id);
    const classes = [fresh ? "fresh" : "", state.mine.has(item.call_id) ? "mine" : ""].join(" ").trim();
    return h(
      "tr",
      { class: classes || null, "data-call-id": item.call_id, "data-status": item.status, "data-kind": item.kind },
      h("td", { class: "time", title: item.at }, fmtTime(item.at)),
      h("td", { class: "status" }, chip(item.status), h("span", { class: "sub" }, item.stage ? `at ${item.stage}` : "")),
      h("td", { class: "tool" }, item.tool || "–", h("span", { class: "sub mono", title: item.call_id }, shortId(item.call_id))),
      h("td", { class: "tenant" }, item.tenant || h("span", { class: "muted" }, "unverified")),
      h("td", { class: "details" }, feedDetails(item)),
    );
  });
  tbody.replaceChildren(...rows);
  state.seenFeed = new Set(items.map((i) => i.id));
  state.feedPrimed = true;
  $("feed-empty").hidden = items.length > 0;
}

// ------------------------------------------------------------------ latency

function renderLatency(rows) {
  const tbody = $("latency").querySelector("tbody");
  const max = Math.max(1, ...rows.map((r) => r.p99 || 0));
  tbody.replaceChildren(
    ...rows.map((r) =>
      h(
        "tr",
        { class: r.stage === "end_to_end" ? "total" : null, "data-stage": r.stage },
        h("td", {}, r.label, h("span", { class: "stage-hint" }, r.hint)),
        h("td", { class: "num" }, String(r.n)),
        h("td", { class: "num" }, fmtMs(r.p50)),
        h("td", { class: "num" }, fmtMs(r.p95)),
        h("td", { class: "num" }, fmtMs(r.p99)),
        h(
          "td",
          {},
          h(
            "div",
            { class: "lbar", title: `p50 ${fmtMs(r.p50)} · p95 ${fmtMs(r.p95)}` },
            h("span", { class: "p95", style: { width: `${(100 * (r.p95 || 0)) / max}%` } }),
            h("span", { class: "p50", style: { width: `${(100 * (r.p50 || 0)) / max}%` } }),
          ),
        ),
      ),
    ),
  );
}

// ------------------------------------------------------------------ breakdown

function renderBreakdown(rows) {
  const tbody = $("breakdown").querySelector("tbody");
  if (!rows.length) {
    tbody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "empty" }, "No outcomes in this window.")));
    return;
  }
  tbody.replaceChildren(
    ...rows.slice(0, 40).map((r) => {
      const statuses = Object.entries(r.by_status).sort((a, b) => STATUS_ORDER.indexOf(a[0]) - STATUS_ORDER.indexOf(b[0]));
      return h(
        "tr",
        {},
        h("td", {}, r.tenant || h("span", { class: "muted" }, "unverified")),
        h("td", {}, r.tool),
        h("td", { class: "num" }, r.total.toLocaleString()),
        h(
          "td",
          {},
          h("div", { class: "codes" }, statuses.map(([st, n]) => chip(st, `${humanStatus(st)} ${n}`))),
          h("div", { class: "stack" }, statuses.map(([st, n]) => h("span", { title: `${humanStatus(st)}: ${n}`, style: { width: `${(100 * n) / r.total}%`, background: STATUS_COLORS[st] || "#94a3b8" } }))),
        ),
        h(
          "td",
          {},
          h(
            "div",
            { class: "codes" },
            Object.entries(r.by_code)
              .sort((a, b) => b[1] - a[1])
              .map(([code, n]) => h("span", { class: "code-chip" }, `${code} ${n}`)),
          ),
        ),
      );
    }),
  );
}

// ------------------------------------------------------------------ operations

function renderOps(items) {
  const box = $("ops");
  if (!items.length) {
    box.replaceChildren(h("div", { class: "all-clear" }, h("span", { class: "tick" }, "✓"), h("span", {}, "No unknown outcomes: every executed operation has a known result.")));
    return;
  }
  const stateChip = { escalated: ["escalated to humans", "#dc2626"], reconciling: ["reconciling", "#d97706"], settled: ["settled", "#16a34a"] };
  box.replaceChildren(
    ...items.map((op) => {
      const [label, color] = stateChip[op.state] || [op.state, "#64748b"];
      const meta = [`${op.tool} · ${op.tenant}`, `${op.checks} check${op.checks === 1 ? "" : "s"}`];
      if (op.state === "reconciling" && op.next_check_at) meta.push(`next check ${fmtTime(op.next_check_at)}`);
      if (op.state === "escalated") meta.push(`escalated ${ago(op.escalated_at)} — settle with "ratifier ops resolve"`);
      if (op.state === "settled") meta.push(`settled as ${op.ledger_status}${op.error_code ? ` (${op.error_code})` : ""} ${ago(op.updated_at)}`);
      return h(
        "div",
        { class: `op ${op.state}`, "data-operation-id": op.operation_id },
        h("div", { class: "op-head" }, h("span", { class: "chip", style: { "--c": color } }, label), h("span", { class: "op-id", title: op.operation_id }, op.operation_id)),
        h("div", { class: "op-meta" }, meta.join(" · ")),
        op.history.length
          ? h(
              "ul",
              { class: "timeline" },
              op.history.map((e) => h("li", { class: `k-${e.kind}` }, h("span", { class: "t" }, fmtTime(e.at)), h("span", { class: "kind" }, humanStatus(e.kind)), e.summary)),
            )
          : null,
      );
    }),
  );
}

// ------------------------------------------------------------------ sign-in

const rolesText = (me) => (me.roles.length ? me.roles.join(", ") : "no role");

function renderWho() {
  const signedIn = Boolean(state.me);
  $("who").hidden = !signedIn;
  $("signin").hidden = signedIn;
  if (signedIn) {
    $("who-sub").textContent = state.me.sub;
    $("who-roles").textContent = ` ${rolesText(state.me)} in `;
    $("who-tenant").textContent = state.me.tenant;
    $("who-avatar").textContent = state.me.sub.slice(0, 1).toUpperCase();
  }
  if (!signedIn || !state.me.can_approve) {
    $("inbox-count").textContent = "";
    $("inbox-count").classList.remove("hot");
  }
  renderAccess();
}

// What the signed-in user sees and may do, panel by panel (from /api/session). Shown at once
// on sign-in and sign-out, not at the next poll: a panel never says "Sign in above" to
// someone signed in.
function freezeAccess(me) {
  const seen = `You see the frozen scopes of ${me.tenant} and the fleet-wide ones`;
  if (me.can_freeze && me.can_freeze_fleet) {
    return `${seen}; you may freeze and unfreeze ${me.tenant}'s scopes and writes:* (every tenant's writes).`;
  }
  if (me.can_freeze) {
    return `${seen}; you may freeze and unfreeze ${me.tenant}'s scopes (writes:* needs the fleet_operator role).`;
  }
  if (me.can_freeze_fleet) {
    return `${seen}; you may freeze and unfreeze writes:* (every tenant's writes); ${me.tenant}'s own scopes need the operator role.`;
  }
  return `${seen}; freezing needs the operator role.`;
}

function renderAccess() {
  const me = state.me;
  const approver = Boolean(me && me.can_approve);
  $("inbox").hidden = !approver;
  $("inbox-access").hidden = !me || approver;
  $("inbox-access").textContent = me && !approver ? `Your token has no approver role: approvals are not shown (${me.sub} in ${me.tenant}: ${rolesText(me)}).` : "";
  for (const panel of ["freezes", "budgets", "limits"]) {
    $(`${panel}-signin`).hidden = Boolean(me);
    $(`${panel}-panel`).hidden = !me;
  }
  const mayFreeze = Boolean(me && (me.can_freeze || me.can_freeze_fleet));
  $("freeze-form").hidden = !mayFreeze;
  $("freezes-access").dataset.can = mayFreeze ? "yes" : "no";
  $("freezes-access").textContent = me ? freezeAccess(me) : "";
  $("budgets-access").dataset.can = "no";
  $("budgets-access").textContent = me
    ? `You see the budgets of the policy set in force and ${me.tenant}'s usage of them (read-only: budgets change with the policy set).`
    : "";
  $("limits-access").dataset.can = "no";
  $("limits-access").textContent = me
    ? `You see the admission limits that apply to ${me.tenant} and what its live buckets hold (read-only: limits change in limits.toml beside the policies).`
    : "";
  if (!me) {
    $("freeze-result").hidden = true;
    $("freeze-error").hidden = true;
    closeConfirm();
  }
}

// Re-read every signed-in panel (after a sign-in, and on each poll).
async function refreshPanels() {
  await Promise.all([refreshInbox(), refreshFreezes(), refreshBudgets(), refreshLimits()]);
}

async function signIn(token) {
  const previous = state.token;
  state.token = token;
  try {
    state.me = await api("/api/session", { auth: true });
    sessionStorage.setItem(TOKEN_KEY, token);
    $("signin-error").hidden = true;
    $("token").value = "";
    renderWho();
    await refreshPanels();
    return true;
  } catch (err) {
    state.token = previous && previous !== token ? previous : null;
    state.me = null;
    if (!state.token) sessionStorage.removeItem(TOKEN_KEY);
    const reason = {
      unauthenticated: "This token is not valid here: it is malformed, expired, or signed for another deployment.",
    }[err.code] || err.message;
    $("signin-error").textContent = reason;
    $("signin-error").hidden = false;
    renderWho();
    return false;
  }
}

function signOut() {
  state.token = null;
  state.me = null;
  sessionStorage.removeItem(TOKEN_KEY);
  for (const card of state.cards.values()) card.el.remove();
  state.cards.clear();
  renderWho();
}

// ------------------------------------------------------------------ inbox

function argumentsText(item) {
  return JSON.stringify(item.arguments, null, 2);
}

function buildCard(item) {
  const refs = {};
  refs.left = h("span", { class: "req-left" });
  refs.bar = h("span", {});
  refs.timebar = h("div", { class: "timebar" }, refs.bar);
  refs.error = h("p", { class: "error", hidden: true });
  refs.note = h("div", { class: "sent-note", hidden: true }, h("span", { class: "spinner" }), h("span", {}));
  refs.editor = h("div", { class: "editor", hidden: true });
  const action = (verdict, label, cls) =>
    h("button", { class: `btn ${cls}`, type: "button", "data-action": verdict, onclick: () => onAction(item.call_id, verdict) }, label);
  refs.actions = h("div", { class: "actions" }, action("approve", "Approve", "approve"), action("reject", "Reject…", "reject"), action("edit", "Edit…", "edit"));
  const el = h(
    "article",
    { class: "req", "data-call-id": item.call_id },
    h("div", { class: "req-head" }, h("span", { class: "req-tool" }, item.tool), chip("awaiting_approval", humanStatus(item.effect)), refs.left),
    h(
      "div",
      { class: "req-meta" },
      h("code", { title: item.call_id }, shortId(item.call_id)),
      ` · requested by ${item.requested_by} · ${ago(item.requested_at)}`,
    ),
    h("ul", { class: "preview" }, (item.preview || []).map((line) => h("li", {}, line))),
    refs.timebar,
    h("details", {}, h("summary", {}, "Arguments and fingerprint"), h("pre", {}, `${argumentsText(item)}\n\nfingerprint ${item.fingerprint}`)),
    refs.actions,
    refs.editor,
    refs.error,
    refs.note,
  );
  return { el, item, refs, total: Math.max(1, (new Date(item.expires_at) - new Date(item.requested_at)) / 1000), mode: null };
}

function updateCard(card) {
  const left = (new Date(card.item.expires_at).getTime() - serverNow()) / 1000;
  card.refs.left.textContent = fmtLeft(left);
  card.refs.left.className = `req-left ${left < 30 ? "late" : left < 120 ? "soon" : ""}`;
  card.refs.timebar.className = `timebar ${left < 120 ? "soon" : ""}`;
  card.refs.bar.style.width = `${Math.max(0, Math.min(100, (100 * left) / card.total))}%`;
  const verdict = card.verdict;
  const refused = Boolean(verdict && verdict.status === "refused");
  const sent = refused ? null : card.item.decision;
  card.el.classList.toggle("sent", Boolean(sent));
  card.el.dataset.verdict = verdict ? verdict.status : "";
  card.refs.note.hidden = !sent;
  if (sent) card.refs.note.lastChild.textContent = verdictText(sent, verdict);
  if (left <= 0) {
    for (const button of card.refs.actions.querySelectorAll("button")) button.disabled = true;
  }
}

// What the approval service made of this tab's decision (GET …/decisions/{id}).
function verdictText(decision, verdict) {
  const status = verdict ? verdict.status : "published";
  if (status === "waiting_for_another_approver") {
    const counted = verdict.approvals && verdict.required_approvals ? ` (${verdict.approvals} of ${verdict.required_approvals})` : "";
    return `Your approval counts${counted} — waiting for another approver…`;
  }
  if (status === "applied") return `${decision} applied — ${verdict.outcome ? `outcome: ${humanStatus(verdict.outcome)}` : "waiting for the outcome…"}`;
  if (status === "held") return `${decision} decision held until its request arrives…`;
  return `${decision} decision published — waiting for the approval service…`;
}

function refusalText(error) {
  return `Refused: ${error.message}${error.refusal ? ` (${error.refusal})` : ""}`;
}

// Poll the decision's status until the approval-join answered; show it on the card (and in a
// toast). The card leaves the inbox once the call's outcome arrives.
async function followVerdict(card, url, verdict) {
  const deadline = Date.now() + 120_000;
  let last = null;
  while (Date.now() < deadline) {
    let answer;
    try {
      answer = await api(url, { auth: true });
    } catch (err) {
      if (err.code === "unauthenticated") return;
      answer = null;
    }
    if (answer && (!last || answer.status !== last.status || answer.outcome !== last.outcome)) {
      last = answer;
      card.verdict = answer;
      if (answer.status === "refused") {
        card.item = { ...card.item, decision: null };
        showCardError(card, refusalText(answer.error || {}));
        toast(`${refusalText(answer.error || {})} — ${card.item.tool}`, "bad");
      } else if (answer.status === "waiting_for_another_approver") {
        toast(`Your ${verdict} counts; ${card.item.tool} waits for another approver.`, "good");
      } else if (answer.status === "applied") {
        toast(`${verdict} applied for ${card.item.tool}${answer.outcome ? `: ${humanStatus(answer.outcome)}` : ""}.`, "good");
      }
      updateCard(card);
    }
    if (last && (last.status === "refused" || (last.status === "applied" && last.outcome))) return;
    if (!state.cards.has(card.item.call_id) && last && last.status === "applied") return;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function renderInbox(payload) {
  const box = $("inbox");
  const pending = payload.pending || [];
  const ids = new Set(pending.map((p) => p.call_id));
  for (const [id, card] of state.cards) {
    if (!ids.has(id)) {
      card.el.classList.add("leaving");
      setTimeout(() => card.el.remove(), 350);
      state.cards.delete(id);
    }
  }
  for (const item of pending) {
    let card = state.cards.get(item.call_id);
    if (!card) {
      card = buildCard(item);
      state.cards.set(item.call_id, card);
    }
    // After a refusal the latest published decision is not one that counts.
    const refused = card.verdict && card.verdict.status === "refused";
    card.item = { ...item, decision: refused ? null : item.decision || card.item.decision };
    box.append(card.el); // keeps the server's order (soonest to expire first)
    updateCard(card);
  }
  let empty = box.querySelector(".empty");
  if (!pending.length && !empty) {
    empty = h("p", { class: "empty" }, `Nothing to decide in ${payload.tenant}. New requests appear here as agents propose them.`);
    box.append(empty);
  } else if (pending.length && empty) {
    empty.remove();
  }
  $("inbox-count").textContent = String(pending.length);
  $("inbox-count").classList.toggle("hot", pending.length > 0);
}

function showEditor(card, verdict) {
  const editor = card.refs.editor;
  card.refs.error.hidden = true;
  if (card.mode === verdict) {
    editor.hidden = true;
    card.mode = null;
    return;
  }
  card.mode = verdict;
  const reason = h("input", { type: "text", maxlength: 512, placeholder: verdict === "reject" ? "Reason (shown in the audit log)" : "Reason for the change (optional)" });
  const children = [];
  let area = null;
  if (verdict === "edit") {
    area = h("textarea", { spellcheck: "false", "aria-label": "New arguments (JSON)" });
    area.value = argumentsText(card.item);
    children.push(h("span", { class: "hint" }, "Change the arguments; they are validated and authorized again, then approved in your name."), area);
  }
  const confirm = h(
    "button",
    {
      class: `btn ${verdict === "reject" ? "reject" : "approve"}`,
      type: "button",
      "data-action": `confirm-${verdict}`,
      onclick: () => {
        let args;
        if (area) {
          try {
            args = JSON.parse(area.value);
          } catch (err) {
            showCardError(card, `The arguments are not valid JSON: ${err.message}`);
            return;
          }
          if (!args || typeof args !== "object" || Array.isArray(args)) {
            showCardError(card, "The arguments must be a JSON object.");
            return;
          }
        }
        decide(card, verdict, reason.value.trim() || null, args);
      },
    },
    verdict === "reject" ? "Reject request" : "Approve with changes",
  );
  const cancel = h("button", { class: "btn edit", type: "button", onclick: () => showEditor(card, verdict) }, "Cancel");
  editor.replaceChildren(...children, reason, h("div", { class: "row" }, confirm, cancel));
  editor.hidden = false;
  (area || reason).focus();
}

function showCardError(card, text) {
  card.refs.error.textContent = text;
  card.refs.error.hidden = false;
}

function onAction(callId, verdict) {
  const card = state.cards.get(callId);
  if (!card) return;
  if (verdict === "approve") decide(card, "approve", null, undefined);
  else showEditor(card, verdict);
}

async function decide(card, verdict, reason, args) {
  const buttons = card.el.querySelectorAll("button");
  buttons.forEach((b) => (b.disabled = true));
  card.refs.error.hidden = true;
  try {
    const answer = await api(`/api/approvals/${encodeURIComponent(card.item.call_id)}/decision`, {
      method: "POST",
      auth: true,
      body: { decision: verdict, reason, arguments: args },
    });
    state.mine.add(card.item.call_id);
    card.item = { ...card.item, decision: verdict };
    card.verdict = { status: answer.status || "published" };
    card.refs.editor.hidden = true;
    card.mode = null;
    updateCard(card);
    toast(`${verdict === "reject" ? "Rejection" : verdict === "edit" ? "Edited approval" : "Approval"} published for ${card.item.tool}; the approval service's answer follows.`, "good");
    refresh();
    if (answer.follow) followVerdict(card, answer.follow, verdict);
  } catch (err) {
    const text = {
      approval_expired: "Too late: this request expired and can no longer be decided.",
      not_found: "This request is no longer pending (it was decided or ended).",
      unauthenticated: "Your sign-in is no longer valid; sign in again.",
    }[err.code] || err.message;
    // A typed refusal (self-approval, the same approver twice, …) says why in its message.
    showCardError(card, err.refusal ? refusalText(err) : `${text} (${err.code})`);
    // Nothing was published; a decision sent earlier from this tab keeps its own verdict.
    if (err.refusal && !card.item.decision) {
      card.verdict = { status: "refused", error: { code: err.code, message: err.message, refusal: err.refusal } };
    }
    toast(err.refusal ? refusalText(err) : text, "bad");
    if (err.code === "unauthenticated") signOut();
  } finally {
    buttons.forEach((b) => (b.disabled = false));
    updateCard(card);
  }
}

async function refreshInbox() {
  if (!state.token || !state.me || !state.me.can_approve) return;
  try {
    renderInbox(await api("/api/approvals", { auth: true }));
  } catch (err) {
    if (err.code === "unauthenticated" || err.code === "policy_denied") {
      signOut();
      $("signin-error").textContent = "Your sign-in expired; paste a fresh token.";
      $("signin-error").hidden = false;
    }
  }
}

// ------------------------------------------------------------------ kill switch

// What a scope stops (docs/kill-switch.md, "Scopes"); null for text that is not a scope.
const SCOPE_TEXT = /^(?:(tenant|writes):([A-Za-z0-9_-]{1,64}|\*)|(agent|subject|tool):([A-Za-z0-9_-]{1,64}):(\S{1,256}))$/;

function scopeOf(text) {
  const m = SCOPE_TEXT.exec(text);
  if (!m || (m[2] === "*" && m[1] !== "writes")) return null;
  const [kind, tenant, name] = m[1] ? [m[1], m[2], null] : [m[3], m[4], m[5]];
  const stops = {
    tenant: `every call of tenant ${tenant}, reads included`,
    writes: tenant === "*" ? "every tenant's writes (the fleet-wide switch): every call whose effect is not a read" : `every call of ${tenant} whose effect is not a read`,
    agent: `every call made by agent ${name} in ${tenant}`,
    subject: `every call acting on a resource of end user ${name} in ${tenant}`,
    tool: `every call of tool ${name} in ${tenant}`,
  }[kind];
  return { kind, tenant, name, stops };
}

// Whether the signed-in user may (un)freeze ``scope`` (the server checks again).
function mayThrow(scope) {
  const me = state.me;
  const parsed = scopeOf(scope);
  if (!me || !parsed) return false;
  return parsed.tenant === "*" ? me.can_freeze_fleet : parsed.tenant === me.tenant && me.can_freeze;
}

function utc(iso) {
  return new Date(iso).toISOString();
}

function renderFreezes(payload) {
  const rows = payload.freezes;
  $("freezes-count").textContent = rows.length ? String(rows.length) : "";
  $("freezes-count").classList.toggle("hot", rows.length > 0);
  const body = $("freezes").querySelector("tbody");
  body.replaceChildren(
    ...rows.map((freeze) =>
      h(
        "tr",
        { "data-scope": freeze.scope },
        h("td", {}, h("code", {}, freeze.scope)),
        h("td", { class: "freeze-by" }, freeze.by_tenant ? `${freeze.by} (${freeze.by_tenant})` : freeze.by),
        h("td", { title: utc(freeze.at), "data-at": freeze.at }, `${fmtTime(freeze.at)} · ${ago(freeze.at)}`),
        h("td", {}, freeze.reason),
        h(
          "td",
          {},
          mayThrow(freeze.scope)
            ? h("button", { class: "btn", type: "button", "data-action": "unfreeze", onclick: () => askToThrow(freeze.scope, false, "") }, "Unfreeze…")
            : h("span", { class: "none", title: "The operator policies do not let your token unfreeze this scope." }, "operator only"),
        ),
      ),
    ),
  );
  if (!rows.length) body.append(h("tr", {}, h("td", { colspan: "5", class: "empty" }, "Nothing is frozen.")));
}

async function refreshFreezes() {
  if (!state.token || !state.me) return;
  const me = state.me;
  try {
    const payload = await api("/api/freezes", { auth: true });
    if (state.me === me) renderFreezes(payload); // not after a sign-out or another sign-in
  } catch (err) {
    $("freeze-error").textContent = err.message;
    $("freeze-error").hidden = false;
  }
}

// ------------------------------------------------------------------ admission limits

function renderLimits(payload) {
  const rules = $("limits").querySelector("tbody");
  rules.replaceChildren(
    ...payload.limits.map((limit) =>
      h(
        "tr",
        {},
        h("td", {}, limit.scope + (limit.tenant ? "" : " (default)")),
        h("td", {}, limit.tool || ""),
        h("td", {}, limit.rate != null ? String(limit.rate) : ""),
        h("td", {}, limit.burst != null ? String(limit.burst) : limit.rate != null ? String(limit.rate) : ""),
        h("td", {}, limit.concurrency != null ? String(limit.concurrency) : ""),
      ),
    ),
  );
  if (!payload.limits.length) rules.append(h("tr", {}, h("td", { colspan: "5", class: "empty" }, "No limits: every call is admitted.")));
  const usage = $("limits-usage").querySelector("tbody");
  usage.replaceChildren(...payload.usage.map((u) => h("tr", {}, h("td", {}, h("code", {}, u.bucket)), h("td", {}, u.holds))));
  if (!payload.usage.length) usage.append(h("tr", {}, h("td", { colspan: "2", class: "empty" }, "No live bucket.")));
}

async function refreshLimits() {
  if (!state.token || !state.me) return;
  const me = state.me;
  try {
    const payload = await api("/api/limits", { auth: true });
    if (state.me === me) renderLimits(payload);
    $("limits-error").hidden = true;
  } catch (err) {
    $("limits-error").textContent = err.message;
    $("limits-error").hidden = false;
  }
}

// ------------------------------------------------------------------ freeze / unfreeze, confirmed

// The one pending question of the confirmation dialog: {scope, frozen}.
let asked = null;

function closeConfirm() {
  asked = null;
  const dialog = $("confirm");
  if (dialog.open) dialog.close();
}

// A freeze or an unfreeze is published only after the operator confirms it in the page.
function askToThrow(scope, frozen, reason) {
  $("freeze-error").hidden = true;
  const parsed = scopeOf(scope);
  if (!parsed) {
    $("freeze-error").textContent = `Not a scope: ${scope} (writes:T, writes:*, tenant:T, agent:T:sub, subject:T:sub or tool:T:name).`;
    $("freeze-error").hidden = false;
    return;
  }
  const me = state.me;
  asked = { scope, frozen };
  $("confirm").dataset.frozen = String(frozen);
  $("confirm-title").textContent = frozen ? `Freeze ${scope}?` : `Unfreeze ${scope}?`;
  $("confirm-stops").textContent = frozen
    ? `This stops ${parsed.stops}.`
    : `Calls in this scope (${parsed.stops}) run again; a call that falls in another frozen scope stays refused.`;
  $("confirm-effect").textContent = frozen
    ? `Once the broker acknowledges it, every stage refuses them (frozen): new calls, committed commands not yet started, and approvals of pending requests. An effect already in flight finishes. The audit records it as frozen by ${me.sub} (${me.tenant}).`
    : `The audit records it as unfrozen by ${me.sub} (${me.tenant}).`;
  $("confirm-reason").value = reason;
  $("confirm-reason").placeholder = frozen ? "Why (required)" : "Why (optional)";
  $("confirm-error").hidden = true;
  $("confirm-ok").textContent = frozen ? `Freeze ${scope}` : `Unfreeze ${scope}`;
  $("confirm-ok").className = `btn ${frozen ? "danger" : "approve"}`;
  $("confirm-ok").disabled = false;
  $("confirm").showModal();
  $("confirm-cancel").focus();
}

function cancelConfirm() {
  if (!asked) return;
  const { scope } = asked;
  closeConfirm();
  showThrowResult({ state: "cancelled", text: `Cancelled: ${scope} was not changed; nothing was published.` });
}

async function confirmThrow() {
  if (!asked) return;
  const { scope, frozen } = asked;
  const reason = $("confirm-reason").value.trim();
  if (frozen && !reason) {
    $("confirm-error").textContent = "Say why: the reason is kept in the audit.";
    $("confirm-error").hidden = false;
    return;
  }
  $("confirm-ok").disabled = true;
  const done = await throwSwitch(scope, frozen, reason || "unfrozen from the dashboard");
  if (done) {
    closeConfirm();
  } else {
    $("confirm-ok").disabled = false;
    $("confirm-error").textContent = $("freeze-error").textContent;
    $("confirm-error").hidden = false;
  }
}

function showThrowResult({ state: kind, text, freeze }) {
  const box = $("freeze-result");
  box.dataset.state = kind;
  box.dataset.frozen = freeze ? String(freeze.frozen) : "";
  box.dataset.scope = freeze ? freeze.scope : "";
  box.dataset.at = freeze ? freeze.at : "";
  box.dataset.by = freeze ? freeze.by : "";
  box.textContent = text;
  box.hidden = false;
}

async function throwSwitch(scope, frozen, reason) {
  try {
    const answer = await api("/api/freezes", { method: "POST", auth: true, body: { scope, frozen, reason } });
    const freeze = answer.freeze;
    $("freeze-error").hidden = true;
    const who = freeze.by_tenant ? `${freeze.by} (${freeze.by_tenant})` : freeze.by;
    showThrowResult({
      state: "published",
      freeze,
      text: frozen
        ? `FROZEN ${freeze.scope}: in force since ${fmtTime(freeze.at)} (${utc(freeze.at)}), by ${who}: ${freeze.reason}`
        : `Unfrozen ${freeze.scope} at ${fmtTime(freeze.at)} (${utc(freeze.at)}), by ${who}.`,
    });
    toast(`${frozen ? "Frozen" : "Unfrozen"}: ${scope}`, frozen ? "bad" : "good");
    if (frozen) $("freeze-scope").value = "";
    await refreshFreezes();
    return true;
  } catch (err) {
    $("freeze-error").textContent = {
      policy_denied: "Your token may not freeze or unfreeze that scope (operator role, own tenant; writes:* needs fleet_operator).",
      invalid_arguments: `${err.message} (invalid_arguments)`,
    }[err.code] || err.message;
    $("freeze-error").hidden = false;
    if (err.code === "unauthenticated") signOut();
    return false;
  }
}

// ------------------------------------------------------------------ circuit breakers

const BREAKER_TONE = { closed: "succeeded", half_open: "awaiting_approval", open: "failed" };

function renderBreakers(payload) {
  const rows = payload.breakers;
  const open = rows.filter((b) => b.state !== "closed").length;
  $("breakers-count").textContent = open ? String(open) : "";
  $("breakers-count").classList.toggle("hot", open > 0);
  const body = $("breakers").querySelector("tbody");
  body.replaceChildren(
    ...rows.map((b) =>
      h(
        "tr",
        { "data-breaker": b.breaker },
        h("td", {}, h("code", {}, b.breaker)),
        h("td", {}, chip(BREAKER_TONE[b.state] || "unknown", b.state.replace("_", "-"))),
        h("td", {}, b.since ? ago(b.since) : "—"),
        h("td", {}, String(b.calls)),
        h("td", {}, String(b.failures)),
        h("td", {}, String(b.slow)),
      ),
    ),
  );
  if (!rows.length) body.append(h("tr", {}, h("td", { colspan: "6", class: "empty" }, "No downstream called yet.")));
}

async function refreshBreakers() {
  try {
    renderBreakers(await api("/api/breakers"));
  } catch (err) {
    $("breakers-count").textContent = "?";
  }
}

// ------------------------------------------------------------------ budgets

function budgetBar(percent) {
  const tone = percent >= 100 ? "bad" : percent >= 80 ? "warn" : "good";
  const fill = h("div", { class: `budget-fill ${tone}` });
  fill.style.width = `${Math.min(percent, 100)}%`; // CSSOM: allowed by the page's CSP
  return h(
    "div",
    { class: "budget-bar", role: "meter", "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(percent) },
    fill,
  );
}

function renderBudgets(payload) {
  const budgets = payload.budgets;
  $("budgets-count").textContent = budgets.length ? String(budgets.length) : "";
  const root = $("budgets");
  if (!budgets.length) {
    root.replaceChildren(h("p", { class: "empty" }, "The policy set in force declares no budgets."));
    return;
  }
  root.replaceChildren(
    ...budgets.map((budget) =>
      h(
        "div",
        { class: "budget", "data-budget": budget.name },
        h(
          "div",
          { class: "budget-head" },
          h("b", {}, budget.name),
          h(
            "span",
            { class: "hint" },
            ` ${budget.measure} ≤ ${budget.cap} per ${budget.window} · ${budget.tools.length ? budget.tools.join(", ") : "all writes"} · per ${budget.per.join(", ")}`,
          ),
        ),
        budget.scopes.length
          ? h(
              "table",
              { class: "budget-scopes" },
              h("thead", {}, h("tr", {}, ...["Scope", "Used", "Reserved", "Cap", "Left", "", "Resets"].map((t) => h("th", {}, t)))),
              h(
                "tbody",
                {},
                ...budget.scopes.map((scope) =>
                  h(
                    "tr",
                    { "data-scope": scope.scope },
                    h("td", {}, h("code", {}, scope.scope)),
                    h("td", { class: "num budget-used" }, `${scope.used} ${budget.unit}`),
                    h("td", { class: "num budget-reserved" }, String(scope.reserved)),
                    h("td", { class: "num" }, String(budget.cap)),
                    h("td", { class: "num" }, String(scope.left)),
                    h("td", { class: "budget-meter" }, budgetBar(scope.percent_used), h("span", { class: "budget-percent" }, `${scope.percent_used} %`)),
                    h("td", {}, scope.resets_at || "when earlier calls leave the window"),
                  ),
                ),
              ),
            )
          : h("p", { class: "hint" }, `Nothing used in ${budget.window_key}; resets ${budget.resets_at || "-"}.`),
      ),
    ),
  );
}

async function refreshBudgets() {
  if (!state.token || !state.me) return;
  const me = state.me;
  try {
    const payload = await api("/api/budgets", { auth: true });
    if (state.me === me) renderBudgets(payload);
    $("budgets-error").hidden = true;
  } catch (err) {
    $("budgets-error").textContent = err.message;
    $("budgets-error").hidden = false;
  }
}

// ------------------------------------------------------------------ polling

async function refresh() {
  if (state.inFlight) return;
  if (document.hidden && state.overview) return; // a background tab does not poll
  state.inFlight = true;
  const q = query();
  try {
    const [overview, feed, ops] = await Promise.all([
      api(`/api/overview?${q}`),
      api(`/api/feed?${q}`),
      api(`/api/operations?${state.filters.tenant ? `tenant=${encodeURIComponent(state.filters.tenant)}` : ""}`),
    ]);
    state.clockOffset = new Date(overview.now).getTime() - Date.now();
    state.overview = overview;
    renderHealth(overview);
    renderFacets(overview.facets);
    renderKpis(overview);
    renderChart(overview);
    renderLatency(overview.latency);
    renderBreakdown(overview.breakdown);
    renderFeed(feed.items);
    renderOps(ops.items);
    showBanner(null);
    $("refreshed").textContent = `live · updated ${fmtTime(overview.now)}`;
  } catch (err) {
    if (err.status === 0) setHealth("down", "dashboard server unreachable");
    else if (err.status === 503) setHealth("down", "storage unavailable");
    else setHealth("down", "error");
    showBanner(`${err.message}${err.code && err.status ? ` (${err.code})` : ""}`);
  }
  // The signed-in panels read other sources (Kafka, Redis): refreshed even when the
  // overview failed.
  try {
    await Promise.all([refreshPanels(), refreshBreakers()]);
  } finally {
    state.inFlight = false;
  }
}

function tickClocks() {
  for (const card of state.cards.values()) updateCard(card);
}

async function start() {
  initFilters();
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) {
      $("signin-error").textContent = "Paste a token first.";
      $("signin-error").hidden = false;
      return;
    }
    signIn(token);
  });
  $("signout").addEventListener("click", signOut);
  $("freeze-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const scope = $("freeze-scope").value.trim();
    const reason = $("freeze-reason").value.trim();
    if (!scope || !reason) {
      $("freeze-error").textContent = "A scope and a reason, please.";
      $("freeze-error").hidden = false;
      return;
    }
    askToThrow(scope, true, reason);
  });
  $("confirm-ok").addEventListener("click", confirmThrow);
  $("confirm-cancel").addEventListener("click", cancelConfirm);
  $("confirm").addEventListener("cancel", (event) => {
    event.preventDefault(); // Escape: the same as Cancel
    cancelConfirm();
  });
  $("confirm-reason").addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      confirmThrow();
    }
  });
  window.addEventListener("resize", () => state.overview && renderChart(state.overview));
  document.addEventListener("visibilitychange", () => !document.hidden && refresh());
  renderWho();
  if (state.token) await signIn(state.token);
  await refresh();
  setInterval(refresh, POLL_MS);
  setInterval(tickClocks, 1000);
}

document.addEventListener("DOMContentLoaded", start);
