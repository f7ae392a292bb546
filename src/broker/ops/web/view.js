// The broker's web view: reads /api/view (a page of each table, as the broker's OPS verbs
// answer) twice a second, /api/series (a sample a second) once a second and /api/cluster
// (the broker's group, as etcd holds it) every two seconds, and draws them.
// Every value is put in the page as text, never as markup.
"use strict";

const view = {
  token: null,
  workers: { offset: 0, limit: 50, kind: "" },
  tasks: { offset: 0, limit: 50, state: "", kind: "", coordinator: "" },
  sort: {},            // table id -> {key, dir}
  last: null,          // the last /api/view answer
  group: null,         // the last /api/cluster answer
  samples: [],         // [t, ...values], oldest first, at most 900
  columns: [],         // the series' columns
  charts: {},
  topicsBefore: null,  // {at, topics: {name: [messages, bytes]}} for rates
  picked: null,        // a worker id picked by a link
};

// The token comes once in the address (?token=...); it is kept for this tab only and taken
// out of the address bar at once.
function takeToken() {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem("rlbus-token", params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  view.token = sessionStorage.getItem("rlbus-token");
}

async function getJson(path) {
  const headers = view.token ? { Authorization: "Bearer " + view.token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
  const body = await res.json().catch(() => ({ error: res.statusText }));
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function problem(text) {
  const p = document.getElementById("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

// ---- formatting ----
const fmtInt = new Intl.NumberFormat();
function number(n) { return fmtInt.format(n); }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return (i === 0 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
}
// A moment `ageMs` before the broker's `nowMs`, in the browser's time zone.
function clock(nowMs, ageMs) { return new Date(nowMs - ageMs).toLocaleTimeString(); }
function duration(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}
function workerState(w) {
  if (w.quarantined) return "quarantined";
  if (w.leaving) return "leaving";
  if (w.drained) return "drained";
  return w.task ? "busy" : "idle";
}
function resourcesText(r) {
  return Object.entries(r || {}).map(([k, v]) => k + "=" + v).join(" ");
}

// ---- tables ----
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function link(row, text, onClick) {
  const td = document.createElement("td");
  if (text) {
    const a = document.createElement("a");
    a.textContent = text;
    a.addEventListener("click", onClick);
    td.appendChild(a);
  }
  row.appendChild(td);
  return td;
}
function sorted(tableId, rows) {
  const s = view.sort[tableId];
  if (!s) return rows;
  const out = rows.slice();
  out.sort((a, b) => {
    const x = a[s.key], y = b[s.key];
    const c = typeof x === "number" && typeof y === "number" ? x - y
      : String(x ?? "").localeCompare(String(y ?? ""));
    return s.dir === "asc" ? c : -c;
  });
  return out;
}
function fill(tableId, rows, draw) {
  const body = document.querySelector("#" + tableId + " tbody");
  const fresh = document.createElement("tbody");
  for (const r of sorted(tableId, rows)) {
    const tr = document.createElement("tr");
    draw(tr, r);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}
function sortable(tableId) {
  for (const th of document.querySelectorAll("#" + tableId + " th")) {
    th.addEventListener("click", () => {
      const was = view.sort[tableId];
      const dir = was && was.key === th.dataset.key && was.dir === "asc" ? "desc" : "asc";
      view.sort[tableId] = { key: th.dataset.key, dir };
      for (const h of th.parentNode.children) h.classList.remove("asc", "desc");
      th.classList.add(dir);
      if (view.last) draw(view.last);
      if (view.group) drawGroup(view.group);
    });
  }
}
function pager(name, total) {
  const p = view[name];
  const first = total === 0 ? 0 : p.offset + 1;
  const last = Math.min(p.offset + p.limit, total);
  document.getElementById(name + "-page").textContent = first + "–" + last + " of " + number(total);
  document.getElementById(name + "-prev").disabled = p.offset === 0;
  document.getElementById(name + "-next").disabled = p.offset + p.limit >= total;
  document.getElementById(name + "-total").textContent = "(" + number(total) + ")";
}

function pickWorker(id) {
  view.picked = id;
  document.getElementById("workers-find").value = id;
  if (view.last) draw(view.last);
  document.getElementById("workers").scrollIntoView({ behavior: "smooth" });
}
function pickCoordinator(id) {
  view.tasks.coordinator = id;
  view.tasks.offset = 0;
  document.getElementById("tasks-coordinator").value = id;
  refresh();
}

function drawWorkers(v) {
  const find = document.getElementById("workers-find").value.trim().toLowerCase();
  const rows = v.workers.workers.map((w) => Object.assign({}, w, {
    state: workerState(w), resources: resourcesText(w.resources) }))
    .filter((w) => !find || [w.id, w.task, w.state].some((x) => x.toLowerCase().includes(find)));
  fill("workers", rows, (tr, w) => {
    tr.dataset.id = w.id;
    tr.id = "worker-" + w.id;
    if (w.id === view.picked) tr.classList.add("picked");
    cell(tr, w.id);
    cell(tr, w.role);
    cell(tr, w.state, "state-" + w.state).dataset.col = "state";
    cell(tr, w.task).dataset.col = "task";
    cell(tr, w.attempt ? String(w.attempt) : "");
    cell(tr, clock(v.now_ms, w.heartbeat_age_ms));
    cell(tr, w.resources);
    cell(tr, "#" + w.session);
  });
  pager("workers", v.workers.total);
}

function drawTasks(v) {
  const rows = v.tasks.tasks.map((t) => Object.assign({}, t, {
    requirements: resourcesText(t.requirements) || "any" }));
  fill("tasks", rows, (tr, t) => {
    tr.dataset.id = t.id;
    cell(tr, t.id);
    cell(tr, t.kind);
    cell(tr, t.state).dataset.col = "state";
    cell(tr, String(t.attempt));
    link(tr, t.worker, () => pickWorker(t.worker)).dataset.col = "worker";
    link(tr, t.coordinator, () => pickCoordinator(t.coordinator));
    cell(tr, clock(v.now_ms, t.age_ms) + " (" + duration(t.age_ms) + " ago)");
    cell(tr, t.state === "queued" ? "" : duration(t.attempt_ms));
    cell(tr, t.requirements).dataset.col = "requirements";
  });
  pager("tasks", v.tasks.total);
  // Why the queued tasks of this page wait: no worker of their kind, or none free that has
  // what they need.
  const waiting = {};
  for (const t of rows.filter((x) => x.state === "queued")) {
    const why = v.status.peers[t.kind] === 0 ? "no " + t.kind + " has a session"
      : "a free " + t.kind + " with " + t.requirements;
    waiting[why] = (waiting[why] || 0) + 1;
  }
  document.getElementById("queued-why").textContent = Object.keys(waiting).length === 0 ? ""
    : "Queued tasks shown wait for: " + Object.entries(waiting)
      .map(([why, n]) => why + " (" + n + ")").join("; ");
  fill("ended", v.tasks.ended.slice().reverse(), (tr, e) => {
    tr.dataset.id = e.id + "/" + e.attempt + "/" + e.how;
    cell(tr, clock(v.now_ms, e.age_ms));
    cell(tr, e.id);
    cell(tr, e.how, "state-" + (e.how === "finished" ? "busy" : e.how === "failed" ? "failed"
      : "leaving")).dataset.col = "how";
    cell(tr, String(e.attempt));
    link(tr, e.worker, () => pickWorker(e.worker));
    link(tr, e.coordinator, () => pickCoordinator(e.coordinator));
    cell(tr, e.reason).dataset.col = "reason";
  });
}

function drawTopics(v) {
  const now = v.now_ms;
  const before = view.topicsBefore;
  const current = {};
  const rows = v.topics.topics.map((t) => {
    current[t.topic] = [t.messages, t.bytes];
    const was = before && before.topics[t.topic];
    const secs = before ? (now - before.at) / 1000 : 0;
    return Object.assign({}, t, {
      rate: was && secs > 0 ? (t.messages - was[0]) / secs : 0,
      byte_rate: was && secs > 0 ? (t.bytes - was[1]) / secs : 0,
    });
  });
  if (!before || now - before.at >= 1000) view.topicsBefore = { at: now, topics: current };
  fill("topics", rows, (tr, t) => {
    tr.dataset.id = t.topic;
    cell(tr, t.topic);
    cell(tr, String(t.subscribers));
    cell(tr, t.rate.toFixed(1));
    cell(tr, bytes(t.byte_rate) + "/s");
    cell(tr, number(t.messages));
    cell(tr, bytes(t.bytes));
  });
  document.getElementById("topics-total").textContent = "(" + number(v.topics.topics_total) + ")";
  fill("nodes", v.topics.nodes, (tr, n) => {
    tr.dataset.id = n.id;
    cell(tr, n.id);
    cell(tr, String(n.subscriptions));
    cell(tr, number(n.queued));
    cell(tr, bytes(n.queued_bytes));
    cell(tr, number(n.published));
    cell(tr, n.held_by);
    cell(tr, (n.holding_back || []).join(" "));
    cell(tr, String(n.stalls), n.stalled ? "state-failed" : "");
    cell(tr, number(n.dropped));
  });
  document.getElementById("nodes-total").textContent = "(" + number(v.topics.nodes_total) + ")";
}

function drawBroker(v) {
  const s = v.status;
  document.getElementById("broker").textContent = "broker " + s.version + ", epoch " +
    s.epoch + ", up " + duration(s.uptime_ms) + (s.draining ? ", draining" : "");
  for (const role of ["collector", "learner", "coordinator", "bus"])
    document.getElementById("count-" + role).textContent = number(s.peers[role]);
  document.getElementById("count-queued").textContent = number(s.tasks.queued);
  document.getElementById("count-running").textContent = number(s.tasks.running);
  document.getElementById("count-finished").textContent = number(s.counters.tasks_finished);
  document.getElementById("count-requeued").textContent = number(s.counters.tasks_requeued);
  document.getElementById("count-failed").textContent = number(s.counters.tasks_failed);
  fill("streams", s.streams.map((st) => Object.assign({}, st, { lag: st.seq - st.acked })),
    (tr, st) => {
      tr.dataset.id = st.coordinator;
      link(tr, st.coordinator, () => pickCoordinator(st.coordinator));
      cell(tr, number(st.seq));
      cell(tr, number(st.acked));
      cell(tr, number(st.lag));
      cell(tr, st.windowed ? "yes" : "no");
      cell(tr, number(st.held));
    });
  document.getElementById("streams-total").textContent = "(" + number(s.streams_total) + ")";
  fill("settings", Object.entries(s.settings).map(([key, value]) => ({ key, value })),
    (tr, x) => { cell(tr, x.key); cell(tr, x.value); });
  fill("standbys", s.standbys, (tr, x) => {
    cell(tr, x.member); cell(tr, number(x.position)); cell(tr, bytes(x.lag_bytes));
    cell(tr, x.in_sync ? "yes" : "no");
  });
  const about = document.getElementById("about");
  const items = [["version", s.version], ["epoch", s.epoch],
    ["up since", clock(v.now_ms, s.uptime_ms)], ["messages in", number(s.counters.messages_in)],
    ["messages out", number(s.counters.messages_out)], ["faults", number(s.counters.faults)],
    ["send queues", bytes(s.counters.send_queue_bytes)], ["bus queues", bytes(s.bus.queued_bytes)]];
  about.replaceChildren(...items.flatMap(([k, val]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = val;
    return [dt, dd];
  }));
}

// The group of brokers this one belongs to, when it does: who leads, and every member.
function drawGroup(g) {
  document.getElementById("group").hidden = g.group === null;
  if (g.group === null) return;
  document.getElementById("group-name").textContent = g.group;
  const l = g.leader;
  document.getElementById("group-leader").textContent =
    (l ? l.member + " leads, at " + l.advertise + " (epoch " + l.epoch + ", since " +
      new Date(l.since_ms).toLocaleTimeString() + ")"
      : "no leader: an election is under way, or no broker of the group is up") +
    (g.error ? "; " + g.error : "");
  fill("members", g.members, (tr, m) => {
    tr.dataset.id = m.member;
    cell(tr, m.member);
    cell(tr, m.role + (m.member === g.me ? " (this broker)" : ""),
      m.role === "leader" ? "state-busy" : "").dataset.col = "role";
    cell(tr, m.advertise);
    cell(tr, m.version);
    cell(tr, new Date(m.since_ms).toLocaleTimeString());
    cell(tr, m.in_sync ? "yes" : "no");
  });
}
async function refreshGroup() {
  try {
    view.group = await getJson("/api/cluster");
    drawGroup(view.group);
  } catch (e) {
    problem("cannot read the broker's group: " + e.message);
  }
}

function draw(v) {
  drawBroker(v);
  drawWorkers(v);
  drawTasks(v);
  drawTopics(v);
}

// ---- the loop ----
function viewQuery() {
  const q = new URLSearchParams();
  const w = view.workers, t = view.tasks;
  q.set("workers_offset", w.offset); q.set("workers_limit", w.limit);
  if (w.kind) q.set("workers_kind", w.kind);
  q.set("tasks_offset", t.offset); q.set("tasks_limit", t.limit);
  if (t.state) q.set("tasks_state", t.state);
  if (t.kind) q.set("tasks_kind", t.kind);
  if (t.coordinator) q.set("tasks_coordinator", t.coordinator);
  return "/api/view?" + q.toString();
}

async function refresh() {
  try {
    const v = await getJson(viewQuery());
    view.last = v;
    draw(v);
    problem("");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    problem("cannot read the broker: " + e.message);
  }
}

// ---- charts ----
function column(name) { return view.columns.findIndex((c) => c.name === name) + 1; }
// Per-second rates of counter `name` between samples, or the gauge's values; for `per`, the
// ratio of two counters' growth between samples (none where the second did not grow).
function values(name, per) {
  const i = column(name), j = per ? column(per) : 0;
  const kind = view.columns[i - 1].kind;
  const out = [];
  for (let k = 1; k < view.samples.length; ++k) {
    const a = view.samples[k - 1], b = view.samples[k];
    if (per) out.push(b[j] > a[j] ? (b[i] - a[i]) / (b[j] - a[j]) : null);
    else out.push(kind === "gauge" ? b[i] : Math.max(0, (b[i] - a[i]) * 1000 / (b[0] - a[0])));
  }
  return out;
}
const palette = ["#1a56b0", "#11722f", "#c2660a", "#a11", "#6b3fa0"];
function makeChart(id, series) {
  const datasets = series.map((s, k) => ({
    label: s.label, data: [], borderColor: palette[k], backgroundColor: palette[k],
    pointRadius: 0, borderWidth: 1.5, yAxisID: s.right ? "right" : "y" }));
  const scales = { x: { ticks: { maxTicksLimit: 6 } }, y: { beginAtZero: true } };
  if (series.some((s) => s.right))
    scales.right = { position: "right", beginAtZero: true, grid: { drawOnChartArea: false } };
  view.charts[id] = { series, chart: new Chart(document.getElementById(id), {
    type: "line", data: { labels: [], datasets },
    options: { animation: false, maintainAspectRatio: false, scales,
      plugins: { legend: { labels: { boxWidth: 10 } } } } }) };
}
function makeCharts() {
  makeChart("chart-tasks", [{ label: "started", name: "tasks_started" },
    { label: "finished", name: "tasks_finished" }, { label: "re-queued", name: "tasks_requeued" },
    { label: "failed", name: "tasks_failed" }]);
  makeChart("chart-events", [{ label: "task events", name: "task_events" },
    { label: "data items", name: "data_items" }]);
  makeChart("chart-bus", [{ label: "published", name: "bus_published" },
    { label: "delivered", name: "bus_delivered" }, { label: "dropped", name: "bus_dropped" },
    { label: "published bytes (right)", name: "bus_published_bytes", right: true }]);
  makeChart("chart-memory", [{ label: "memory budget used", name: "memory_budget_used" },
    { label: "bus memory used", name: "bus_memory_used" },
    { label: "connections (right)", name: "connections", right: true }]);
  makeChart("chart-queue", [{ label: "queued", name: "tasks_queued" },
    { label: "running", name: "tasks_running" }]);
  makeChart("chart-policy", [
    { label: "data lag, versions behind (mean)", name: "data_lag_versions", per: "data_lag_items" },
    { label: "newest policy version (right)", name: "policy_version", right: true }]);
}
function drawCharts() {
  const labels = view.samples.slice(1).map((s) => new Date(s[0]).toLocaleTimeString());
  for (const { series, chart } of Object.values(view.charts)) {
    chart.data.labels = labels;
    series.forEach((s, k) => { chart.data.datasets[k].data = values(s.name, s.per); });
    chart.update("none");
  }
}
async function refreshSeries() {
  try {
    const after = view.samples.length ? view.samples[view.samples.length - 1][0] : 0;
    const r = await getJson("/api/series?after=" + after);
    if (!view.columns.length) { view.columns = r.columns; makeCharts(); }
    view.samples.push(...r.samples);
    if (view.samples.length > 900) view.samples.splice(0, view.samples.length - 900);
    drawCharts();
  } catch (e) {
    problem("cannot read the broker's series: " + e.message);
  }
}

// ---- controls ----
function controls() {
  for (const id of ["workers", "tasks", "ended", "streams", "topics", "nodes", "settings",
    "standbys", "members"])
    sortable(id);
  const on = (id, ev, f) => document.getElementById(id).addEventListener(ev, f);
  on("workers-kind", "change", (e) => { view.workers.kind = e.target.value; view.workers.offset = 0; refresh(); });
  on("workers-find", "input", () => { view.picked = null; if (view.last) draw(view.last); });
  on("workers-prev", "click", () => { view.workers.offset = Math.max(0, view.workers.offset - view.workers.limit); refresh(); });
  on("workers-next", "click", () => { view.workers.offset += view.workers.limit; refresh(); });
  on("tasks-state", "change", (e) => { view.tasks.state = e.target.value; view.tasks.offset = 0; refresh(); });
  on("tasks-kind", "change", (e) => { view.tasks.kind = e.target.value; view.tasks.offset = 0; refresh(); });
  on("tasks-coordinator", "change", (e) => { view.tasks.coordinator = e.target.value.trim(); view.tasks.offset = 0; refresh(); });
  on("tasks-prev", "click", () => { view.tasks.offset = Math.max(0, view.tasks.offset - view.tasks.limit); refresh(); });
  on("tasks-next", "click", () => { view.tasks.offset += view.tasks.limit; refresh(); });
}

// Each loop waits for its answer before asking again: a slow broker is never asked twice.
async function every(ms, f) {
  for (;;) {
    const started = Date.now();
    await f();
    await new Promise((done) => setTimeout(done, Math.max(0, ms - (Date.now() - started))));
  }
}

takeToken();
controls();
every(500, refresh);
every(1000, refreshSeries);
every(2000, refreshGroup);
