// herd dashboard: polls /overview every 2 s and renders it with textContent only
// (job payloads and errors are untrusted strings). The bearer token, when the
// server wants one, lives in sessionStorage: gone when the tab closes.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "herd.token";
let lastData = null;
let fetchedAt = 0;
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

const fmt = {
  int: (n) => (n == null ? "–" : Number(n).toLocaleString("en-US")),
  money: (x) => (x == null ? "–" : "$" + (x < 1 ? x.toFixed(4) : x.toFixed(2))),
  // A batch's money, to the cent: "$0.77"; a positive sum under a cent is not "$0.00".
  usd(x) {
    if (x == null) return "–";
    if (x > 0 && x < 0.005) return "<$0.01";
    return "$" + x.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  },
  pct: (x) => (x == null ? "–" : (100 * x).toFixed(1) + "%"),
  secs(s) {
    if (s == null) return "";
    const a = Math.abs(s);
    const text = a < 60 ? a.toFixed(1) + "s" : a < 3600 ? Math.floor(a / 60) + "m " + Math.floor(a % 60) + "s" : (a / 3600).toFixed(1) + "h";
    return s < 0 ? "-" + text : text;
  },
  time: (iso) => (iso ? new Date(iso).toISOString().slice(11, 19) : ""),
  short(value, width = 60) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    return text.length <= width ? text : text.slice(0, width - 1) + "…";
  },
};

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const h = { "Content-Type": "application/json" };
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(), cache: "no-store" });
  if (response.status === 401) {
    askToken(Boolean(sessionStorage.getItem(TOKEN_KEY)));
    throw new Error("unauthorized");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || "HTTP " + response.status);
  return body;
}

function askToken(refused) {
  const dialog = $("login");
  $("login-error").hidden = !refused;
  if (!dialog.open) dialog.showModal();
  $("token").focus();
}

// Widths go through the CSSOM: the page's CSP refuses inline style attributes.
function bar(fraction, kind) {
  const fill = el("i");
  fill.style.width = (Math.max(0, Math.min(1, fraction || 0)) * 100).toFixed(1) + "%";
  return el("div", { class: "bar " + (kind || "") }, fill);
}

function fillTable(id, rows, columns, empty) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { class: "empty", colspan: String(columns), text: empty })));
    return;
  }
  for (const row of rows) body.append(row);
}

function renderKpis(d) {
  const sum = (f) => d.queues.reduce((acc, q) => acc + (q.counts[f] || 0), 0);
  $("k-pending").textContent = fmt.int(sum("pending"));
  $("k-running").textContent = fmt.int(sum("processing"));
  $("k-done").textContent = fmt.int(d.throughput.succeeded.reduce((a, b) => a + b, 0));
  $("k-dead").textContent = fmt.int(sum("dead"));
  const hits = d.caches.reduce((a, c) => a + c.hits, 0);
  const misses = d.caches.reduce((a, c) => a + c.misses, 0);
  $("k-hits").textContent = hits + misses ? fmt.pct(hits / (hits + misses)) : "–";
  $("k-saved").textContent = priced(d.ledger.filter((r) => AVOIDED.includes(r.kind)), "saved");
}

function renderThroughput(tp) {
  const W = 600, H = 140, top = 10, bottom = 20, left = 30;
  const n = tp.minutes;
  const totals = tp.succeeded.map((s, i) => s + tp.dead[i]);
  const max = Math.max(1, ...totals);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  const caption = svg("title", {});
  caption.textContent = `jobs finished per minute over the last ${n} minutes`;
  chart.append(caption);
  const plotH = H - top - bottom, slot = (W - left) / n, barW = Math.max(2, slot * 0.72);
  for (const frac of max >= 2 ? [0, 0.5, 1] : [0, 1]) {
    const y = top + plotH * (1 - frac);
    chart.append(svg("line", { x1: left, x2: W, y1: y, y2: y, class: "grid-line" }));
    const label = svg("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "axis" });
    label.textContent = fmt.int(Math.floor(max * frac));
    chart.append(label);
  }
  tp.succeeded.forEach((ok, i) => {
    const bad = tp.dead[i];
    const x = left + i * slot + (slot - barW) / 2;
    const hOk = (ok / max) * plotH, hBad = (bad / max) * plotH;
    const title = `${fmt.time(new Date(Date.parse(tp.start) + i * 60000).toISOString()).slice(0, 5)} UTC: ${ok} succeeded, ${bad} dead`;
    const group = svg("g", {});
    group.append(svg("title", {}));
    group.firstChild.textContent = title;
    if (ok) group.append(svg("rect", { x, y: top + plotH - hOk, width: barW, height: hOk, rx: 1.5, class: "ok" }));
    if (bad) group.append(svg("rect", { x, y: top + plotH - hOk - hBad, width: barW, height: hBad, rx: 1.5, class: "bad" }));
    chart.append(group);
  });
  for (const [i, text] of [[0, `-${n}m`], [Math.floor(n / 2), `-${n - Math.floor(n / 2)}m`], [n - 1, "now"]]) {
    const label = svg("text", { x: left + i * slot + slot / 2, y: H - 5, "text-anchor": "middle", class: "axis" });
    label.textContent = text;
    chart.append(label);
  }
  $("throughput").replaceChildren(chart);
}

function renderQueues(queues, hidden) {
  // "{others}" sums the queues past the busiest HERD_SHOWN_QUEUES (no queue bears that name).
  const name = (q) => (q.queue === "{others}" ? `${fmt.int(hidden)} other queues` : q.queue);
  const depth = (q) => (q.counts.pending || 0) + (q.counts.processing || 0);
  const max = Math.max(1, ...queues.map(depth));
  fillTable("queues", queues.map((q) => el("tr", {},
    el("td", { class: "mono", text: name(q) }),
    el("td", { class: "n", text: fmt.int(q.counts.pending || 0) }),
    el("td", { class: "n", text: fmt.int(q.ready) }),
    el("td", { class: "n", text: fmt.int(q.counts.processing || 0) }),
    el("td", { class: "n", text: fmt.int(q.counts.succeeded || 0) }),
    el("td", { class: "n", text: fmt.int(q.counts.dead || 0) }),
    el("td", { class: "n", text: q.oldest_ready_age == null ? "" : fmt.secs(q.oldest_ready_age) }),
    el("td", {}, bar(depth(q) / max)),
  )), 8, "no queues yet");
}

function renderRunning(running) {
  fillTable("running", running.map((r) => el("tr", { "data-job": String(r.id) },
    el("td", { class: "n", text: String(r.id) }),
    el("td", { class: "mono", text: r.task }),
    el("td", { class: "mono", text: r.queue }),
    el("td", { class: "mono muted clip", text: r.owner || "" }),
    el("td", { class: "n", text: String(r.attempts + 1) }),
    el("td", {}, el("div", { class: "lease" },
      el("span", { class: "n countdown", "data-left": String(r.lease_left), "data-total": String(r.lease_seconds) }),
      bar(0))),
  )), 6, "no job is running");
  tick();
}

// Lease countdowns move between polls: time left at the fetch, minus time since.
function tick() {
  const elapsed = (performance.now() - fetchedAt) / 1000;
  for (const span of document.querySelectorAll(".countdown")) {
    const left = Number(span.dataset.left) - elapsed;
    const total = Number(span.dataset.total) || 1;
    span.textContent = left < 0 ? "expired" : fmt.secs(left);
    const barNode = span.nextElementSibling;
    barNode.className = "bar " + (left < 0 ? "bad" : left < total * 0.25 ? "warn" : "ok");
    barNode.firstChild.style.width = (Math.max(0, Math.min(1, left / total)) * 100).toFixed(1) + "%";
  }
}

async function requeue(id, button) {
  button.disabled = true;
  try {
    const result = await api("/dlq/requeue", { method: "POST", body: JSON.stringify({ job_ids: [id] }) });
    const held = (result.skipped || [])[0];
    toast(result.requeued.length ? `job ${id} requeued`
      : held ? `job ${id} stays dead: active job ${held.held_by} holds its dedup key`
      : `job ${id} was no longer dead-lettered`);
    await refresh();
  } catch (error) {
    toast(`requeue of job ${id} failed: ${error.message}`);
    button.disabled = false;
  }
}

function renderDead(dead) {
  fillTable("dead", dead.map((j) => el("tr", { "data-job": String(j.id) },
    el("td", { class: "n", text: String(j.id) }),
    taskCell(j),
    el("td", { class: "mono", text: j.queue }),
    el("td", {}, el("span", { class: "pill s-dead", text: j.dead_reason || "dead" })),
    el("td", { class: "mono clip", text: fmt.short(j.last_error || "", 80), title: j.last_error || "" }),
    el("td", { class: "mono muted", text: fmt.time(j.finished_at) }),
    el("td", {}, el("button", { type: "button", class: "requeue", onclick: (e) => requeue(j.id, e.currentTarget), text: "Requeue" })),
  )), 7, "the dead-letter queue is empty");
}

// An evaluation job is known by its document's path, not by the hashes its payload holds.
function payloadCell(j) {
  if (j.label) return el("td", { class: "mono clip path", text: j.label, title: j.payload_excerpt });
  return el("td", { class: "mono clip", text: fmt.short(j.payload_excerpt, 70) });
}

function taskCell(j) {
  // A path's end names the document: a long one is cut at its start.
  const tail = (text, width) => (text.length <= width ? text : "…" + text.slice(text.length - width + 1));
  return el("td", { class: "mono" }, j.task, j.label ? el("div", { class: "sub path", text: tail(j.label, 22), title: j.label }) : null);
}

function renderRecent(jobs) {
  fillTable("recent", jobs.map((j) => el("tr", { "data-job": String(j.id) },
    el("td", { class: "n", text: String(j.id) }),
    el("td", { class: "mono", text: j.task }),
    el("td", { class: "mono", text: j.queue }),
    el("td", {}, el("span", { class: "pill s-" + j.status, text: j.status })),
    payloadCell(j),
    el("td", { class: "mono muted", text: fmt.time(j.created_at) }),
  )), 6, "no jobs yet");
}

function renderCaches(caches) {
  const box = $("caches");
  box.replaceChildren();
  if (!caches.length) {
    box.append(el("p", { class: "muted", text: "no cache lookups yet" }));
    return;
  }
  for (const c of caches) {
    box.append(el("div", { class: "cache" },
      el("div", { class: "head" },
        el("span", { class: "mono", text: `${c.cache} · ${c.namespace}` }),
        el("span", { class: "rate", text: fmt.pct(c.hit_rate) })),
      bar(c.hit_rate, "ok"),
      el("div", { class: "counts" },
        el("span", { text: `${fmt.int(c.hits)} hits` }),
        el("span", { text: `${fmt.int(c.misses)} misses` }),
        el("span", { text: `${fmt.int(c.entries)} entries` }),
        c.counters.waited ? el("span", { text: `${fmt.int(c.counters.waited)} waited` }) : null)));
  }
}

const LEDGER_LABELS = {
  call: "provider calls", lost: "lost (lease lost mid-call)", failed: "failed after sending",
  cut_short: "cut short (worker died)", cache: "avoided: cache",
  singleflight: "avoided: singleflight", dedup: "avoided: dedup",
};

const AVOIDED = ["cache", "singleflight", "dedup"];

// Money of ledger rows: a row with calls and no figure is of models without a price,
// whose cost is unknown, never $0 (the API's null); a sum over such rows says so.
function priced(rows, field) {
  const known = rows.filter((r) => r[field] != null).reduce((a, r) => a + r[field], 0);
  const unknown = rows.some((r) => (r.calls && r[field] == null) || (field === "cost" && r.unpriced));
  if (!unknown) return fmt.money(known);
  return known ? `${fmt.money(known)} + unpriced` : "unpriced";
}

function renderLedger(rows) {
  const out = rows.map((r) => {
    const avoided = AVOIDED.includes(r.kind);
    const value = avoided ? r.saved : r.cost;
    const part = !avoided && r.unpriced && value != null ? " + unpriced" : "";
    const money = value ? (avoided ? "−" : "") + fmt.money(value) + part : (r.calls && value == null ? "unpriced" : "");
    return el("tr", {},
      el("td", { text: LEDGER_LABELS[r.kind] || r.kind }),
      el("td", { class: "n", text: fmt.int(r.calls) }),
      el("td", { class: "n", text: avoided ? "" : fmt.int(r.input_tokens + r.output_tokens) }),
      el("td", { class: "n" + (avoided ? " saved" : ""), text: money }));
  });
  const spent = priced(rows.filter((r) => !AVOIDED.includes(r.kind)), "cost");
  const saved = priced(rows.filter((r) => AVOIDED.includes(r.kind)), "saved");
  out.push(el("tr", { class: "total" }, el("td", { text: "spent" }), el("td"), el("td"), el("td", { class: "n", text: spent })));
  out.push(el("tr", { class: "total" }, el("td", { text: "saved" }), el("td"), el("td"), el("td", { class: "n saved", text: saved })));
  // The provider's own prompt cache, apart from herd's: tokens it served, money it saved.
  const cached = rows.reduce((a, r) => a + (r.cached_input_tokens || 0), 0);
  const pSaved = rows.reduce((a, r) => a + (r.provider_cache_saved || 0), 0);
  if (cached || rows.some((r) => r.cache_write_tokens)) {
    out.push(el("tr", { class: "total", id: "provider-cache" },
      el("td", { colspan: 4, text: `provider cache: ${fmt.int(cached)} tokens, ${fmt.money(pSaved)} saved` })));
  }
  fillTable("ledger", out, 4, "");
}

function renderLimits(rows) {
  const of = (now, limit) => limit == null ? fmt.int(Math.round(now)) : `${fmt.int(Math.round(now))} / ${fmt.int(limit)}`;
  const out = (rows || []).map((r) => el("tr", {},
    el("td", { class: "mono" },
      el("span", { text: r.scope + (r.paused_for > 0 ? ` (paused ${r.paused_for.toFixed(1)} s)` : "") }),
      // The batches sharing it now: weight, share of its recent use, and their fair share.
      ...(r.shares || []).map((f) => el("div", { class: "share",
        text: `${f.batch} weight ${f.weight}: ${Math.round(f.share * 100)}% (fair ${Math.round(f.fair * 100)}%)` }))),
    el("td", { class: "n", text: of(r.requests_now, r.rpm) }),
    el("td", { class: "n", text: of(r.tokens_now, r.tpm) }),
    el("td", { class: "n", text: of(r.in_flight, r.max_concurrent) }),
    el("td", { class: "n", text: fmt.int(r.waits) }),
    el("td", { class: "n", text: fmt.int(r.rate_limited) })));
  fillTable("limits", out, 6, "no provider limits set");
}

// A batch's progress: one bar of segments (answered, failed, running, queued, parked,
// cancelled), each sized through the CSSOM like every other bar here.
const SEGMENTS = [
  ["done", "answered", (b) => b.done], ["failed", "dead", (b) => b.dead + b.lost],
  ["running", "running", (b) => b.running], ["queued", "queued", (b) => b.queued],
  ["parked", "parked", (b) => b.parked_items], ["cancelled", "cancelled", (b) => b.cancelled_items],
];

function progress(b) {
  const total = Math.max(1, b.documents);
  const track = el("div", { class: "segbar", role: "img", "aria-label": `${b.done} of ${b.documents} answered` });
  const legend = el("div", { class: "seglegend" });
  for (const [kind, label, count] of SEGMENTS) {
    const n = count(b);
    if (n) {
      const part = el("i", { class: "seg-" + kind, title: `${n} ${label}` });
      part.style.width = ((100 * n) / total).toFixed(2) + "%";
      track.append(part);
    }
    if (n || kind === "done" || kind === "queued") {
      legend.append(el("span", { class: "count k-" + kind }, el("span", { class: "sw seg-" + kind }), el("b", { text: fmt.int(n) }), " " + label));
    }
  }
  return [track, legend];
}

// Why a batch waits, in the server's words where it gave some.
const PARKED = {
  budget: ["Parked", "its budget is spent"],
  refused: ["Parked", "the provider refused its key or model"],
  cancelled: ["Cancelled", "no more calls will be made for it"],
};

function parkedBanner(b) {
  if (!b.parked) return null;
  const [title, why] = PARKED[b.parked] || ["Parked", b.parked];
  const box = el("div", { class: "park-banner " + b.parked, role: "status" },
    el("strong", { text: title }), el("span", { class: "reason", text: b.parked_reason || why }));
  if (b.next) {
    const hint = b.parked === "budget" && b.next.endsWith(" USD") ? `USD: a budget above ${fmt.usd(b.spent || 0)}` : null;
    box.append(el("span", { class: "resume" }, "Resume with ", el("code", { class: "next", text: b.next }),
      hint ? el("span", { class: "hint", text: " " + hint }) : null));
  }
  return box;
}

function spendText(b) {
  const priced = b.spent == null && !b.unpriced.length ? "–" : fmt.usd(b.spent || 0);
  if (!b.unpriced.length) return priced;
  return b.spent ? `${priced} + unpriced` : "unpriced";
}

function spend(b) {
  const box = el("div", { class: "stat spend" },
    el("span", { class: "label", text: "spent" }),
    el("span", { class: "value", text: spendText(b) }),
    el("span", { class: "of", text: b.budget == null ? "no budget"
      : `of ${fmt.usd(b.budget)} budget` + (b.budget ? ` (${Math.round((100 * (b.spent || 0)) / b.budget)}%)` : "") }));
  if (b.budget != null) {
    const used = b.budget ? (b.spent || 0) / b.budget : 1;
    box.append(bar(used, used >= 1 ? "bad" : used >= 0.8 ? "warn" : "ok"));
  }
  const notes = [];
  if (b.estimated) notes.push(`incl. ≈${fmt.usd(b.estimated)} estimated: calls cut off mid-call, at their worst case`);
  if (b.reserved) notes.push(`${fmt.usd(b.reserved)} held by calls in flight`);
  if (b.unpriced.length) notes.push(`no price for ${b.unpriced.join(", ")}`);
  for (const note of notes) box.append(el("span", { class: "sub est", text: note }));
  return box;
}

function stat(label, value, sub) {
  return el("div", { class: "stat" }, el("span", { class: "label", text: label }),
    el("span", { class: "value", text: value }), sub ? el("span", { class: "sub", text: sub }) : null);
}

const COST_LABELS = { call: "answered calls", lost: "lost mid-call", failed: "failed after sending", cut_short: "cut short (worker died)" };

function costTable(b) {
  if (!b.costs.length) return null;
  const rows = b.costs.map((c) => el("tr", {},
    el("td", { class: "mono", text: b.costs_by === "model" ? c.label : COST_LABELS[c.label] || c.label }),
    el("td", { class: "n", text: fmt.int(c.calls) }),
    el("td", { class: "n", text: fmt.int(c.input_tokens + c.output_tokens) }),
    el("td", { class: "n" }, c.cost == null ? "unpriced" : (c.estimated ? "≈" : "") + fmt.usd(c.cost) + (c.unpriced ? " + unpriced" : ""),
      c.estimated_cost && !c.estimated ? el("span", { class: "sub est", text: `incl. ≈${fmt.usd(c.estimated_cost)} estimated` }) : null)));
  return el("table", { class: "costs" },
    el("thead", {}, el("tr", {},
      el("th", { text: b.costs_by === "model" ? "cost by model" : "cost by kind" }),
      el("th", { class: "n", text: "calls" }), el("th", { class: "n", text: "tokens" }), el("th", { class: "n", text: "$" }))),
    el("tbody", {}, ...rows));
}

function failureTable(b) {
  if (!b.failures.length) return null;
  const rows = b.failures.map((f) => el("tr", { "data-job": String(f.job) },
    el("td", { class: "mono clip path", text: f.path, title: f.path }),
    el("td", { class: "n", text: String(f.job) }),
    el("td", { class: "mono err", text: fmt.short(f.error, 240), title: f.error })));
  if (b.more_failures) {
    rows.push(el("tr", {}, el("td", { class: "muted", colspan: "3", text: `and ${fmt.int(b.more_failures)} more: herd eval results ${b.batch}` })));
  }
  return el("table", { class: "failures" },
    el("thead", {}, el("tr", {},
      el("th", { text: `failed documents · ${fmt.int(b.dead + b.lost)}` }), el("th", { class: "n", text: "job" }), el("th", { text: "error" }))),
    el("tbody", {}, ...rows));
}

// A batch in stages: a row per stage, its pieces' progress (answered, failed,
// cancelled, still open), cache hits, calls paid, tokens and cost. A later stage's
// pieces are made as documents reach it, so its count grows while the batch runs.
function stageTable(b) {
  if (!b.stages || !b.stages.length) return null;
  const rows = b.stages.map((s) => {
    const open = Math.max(0, s.pieces - s.done - s.failed - s.cancelled);
    const track = el("div", { class: "segbar mini", role: "img", "aria-label": `${s.done} of ${s.pieces} answered` });
    for (const [kind, n] of [["done", s.done], ["failed", s.failed], ["cancelled", s.cancelled], ["queued", open]]) {
      if (!n) continue;
      const part = el("i", { class: "seg-" + kind, title: `${n} ${kind === "done" ? "answered" : kind === "queued" ? "open" : kind}` });
      part.style.width = ((100 * n) / Math.max(1, s.pieces)).toFixed(2) + "%";
      track.append(part);
    }
    return el("tr", { "data-stage": s.stage, class: s.failed ? "has-failed" : "" },
      el("td", {}, el("span", { class: "mono", text: s.stage }),
        el("span", { class: "sub", text: `${s.kind} · ${s.model}` })),
      el("td", { class: "progress" }, track,
        el("span", { class: "sub frac", text: s.pieces ? `${fmt.int(s.done)} / ${fmt.int(s.pieces)}` : "not reached yet" })),
      el("td", { class: "n failed" + (s.failed ? " bad" : ""), text: fmt.int(s.failed) }),
      el("td", { class: "n", text: fmt.int(s.cached) }),
      el("td", { class: "n", text: fmt.int(s.calls) }),
      el("td", { class: "n", text: fmt.int(s.input_tokens + s.output_tokens) }),
      el("td", { class: "n cost", text: s.cost == null ? (s.calls ? "unpriced" : "–") : fmt.usd(s.cost) }));
  });
  return el("table", { class: "stages" },
    el("thead", {}, el("tr", {},
      el("th", { text: "stage" }), el("th", { text: "answered" }), el("th", { class: "n", text: "failed" }),
      el("th", { class: "n", text: "cached" }), el("th", { class: "n", text: "calls" }),
      el("th", { class: "n", text: "tokens" }), el("th", { class: "n", text: "$" }))),
    el("tbody", {}, ...rows));
}

function batchCard(b) {
  const finished = b.done + b.dead + b.lost + b.cancelled_items >= b.documents;
  // Running only while a job of it is leased: a batch no worker serves reads "queued".
  const state = b.parked ? b.parked === "cancelled" ? "cancelled" : "parked"
    : finished ? "finished" : b.running ? "running" : "queued";
  const [track, legend] = progress(b);
  const eta = b.parked ? "parked" : finished ? "done" : b.eta == null ? "–" : fmt.secs(b.eta);
  return el("article", { class: "batch " + state, "data-batch": b.batch },
    el("div", { class: "head" },
      el("span", { class: "name mono", text: b.batch }),
      el("span", { class: "pill b-" + state, text: state }),
      el("span", { class: "when muted", text: b.created_at ? `created ${fmt.time(b.created_at)} UTC` : "" }),
      el("span", { class: "done-of" }, el("b", { text: fmt.int(b.done) }), ` / ${fmt.int(b.documents)} answered`)),
    parkedBanner(b),
    track, legend,
    el("div", { class: "stats" },
      spend(b),
      stat("rate", b.rate == null ? "–" : `${b.rate.toFixed(2)} docs/s`, "over the last minute"),
      stat("eta", eta, b.waited_for_limits ? `${fmt.secs(b.waited_for_limits)} waited for limits` : null)),
    stageTable(b),
    costTable(b),
    failureTable(b));
}

function renderBatches(batches) {
  $("batches-card").hidden = !batches.length;
  $("batches").replaceChildren(...batches.map(batchCard));
}

// A schedule's row: its last run's outcome is its last job's status ("purged" once the
// job's retention passed); times in UTC, as everywhere on this page.
function renderSchedules(schedules) {
  $("schedules-card").hidden = !schedules.length;
  const day = (iso) => (iso ? new Date(iso).toISOString().slice(0, 19).replace("T", " ") : "–");
  fillTable("schedules", schedules.map((s) => el("tr", { "data-schedule": s.name },
    el("td", { class: "mono" }, s.name, el("div", { class: "sub", text: `${s.task} → ${s.queue}` })),
    el("td", { class: "mono", text: s.when }),
    el("td", {}, el("span", { class: "pill " + (s.paused ? "s-dead" : "s-succeeded"), text: s.paused ? "paused" : "active" })),
    el("td", { class: "mono muted", text: day(s.next_run) }),
    el("td", { class: "mono muted", title: s.last_error || "" },
      day(s.last_run_at), s.last_outcome ? el("div", { class: "sub", text: s.last_outcome }) : null),
    el("td", { class: "n", text: String(s.runs) }),
  )), 6, "no schedule");
}

// A key's row: its running jobs against its limit (full: every slot taken, its waiting
// jobs wait for one), the busiest first as the server ranks them. A key without a limit
// (max_running null: an evaluation batch's key) only gives its jobs their turns in each
// claim.
function renderKeys(keys) {
  $("keys-card").hidden = !keys.length;
  fillTable("keys", keys.map((k) => {
    const bounded = k.max_running !== null;
    const full = bounded && k.running >= k.max_running;
    return el("tr", { "data-key": `${k.queue}/${k.key}` },
      el("td", { class: "mono" }, k.key, el("div", { class: "sub", text: k.queue })),
      el("td", { class: "n", text: fmt.int(k.running) }),
      el("td", { class: "n muted", text: bounded ? fmt.int(k.max_running) : "none" }),
      el("td", { class: "n", text: fmt.int(k.waiting) }),
      el("td", { title: full ? "at its limit" : "" },
        bar(bounded ? k.running / Math.max(1, k.max_running) : 0, full ? "warn" : "ok")),
    );
  }), 5, "no key has work");
}

function render(d) {
  $("broker").textContent = `broker: ${d.broker}`;
  $("updated").textContent = `updated ${fmt.time(d.now)} UTC`;
  const banner = $("banner");
  banner.hidden = !d.problems.length;
  banner.textContent = d.problems.join(" · ");
  renderKpis(d);
  renderThroughput(d.throughput);
  renderQueues(d.queues, d.queues_hidden);
  renderRunning(d.running);
  renderDead(d.dead);
  renderRecent(d.recent);
  renderCaches(d.caches);
  renderLedger(d.ledger);
  renderLimits(d.limits);
  renderBatches(d.batches || []);
  renderSchedules(d.schedules || []);
  renderKeys(d.keys || []);
}

function setState(text, kind) {
  const state = $("state");
  state.textContent = text;
  state.className = "pill " + kind;
}

async function refresh() {
  try {
    const data = await api("/overview?minutes=30");
    fetchedAt = performance.now();
    lastData = data;
    render(data);
    setState("live", "live");
  } catch (error) {
    if (error.message !== "unauthorized") {
      setState("offline", "down");
      const banner = $("banner");
      banner.hidden = false;
      banner.textContent = `cannot read the overview: ${error.message}` + (lastData ? " (showing the last one)" : "");
    }
  }
}

let toastTimer = null;
function toast(text) {
  const node = $("toast");
  node.textContent = text;
  node.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { node.hidden = true; }, 3000);
}

async function loop() {
  await refresh();
  timer = setTimeout(loop, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    $("login").close();
    clearTimeout(timer);
    loop();
  });
  setInterval(tick, 250);
  loop();
});
