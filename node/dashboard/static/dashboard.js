// The swarm dashboard: renders the snapshots node/dashboard/server.py pushes as server-sent events.
// Every value comes from peers' files and the chain: text only ever goes in through textContent.
"use strict";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
const charts = {};

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function fmt(value, digits) {
  return typeof value === "number" && isFinite(value) ? value.toFixed(digits) : "-";
}

function num(value) {
  return typeof value === "number" && isFinite(value) ? value.toLocaleString("en") : "-";
}

// Every eps on the page in one format: up to 6 significant digits, thousands grouped (8,714 and 17,428, never 8714.00).
function epsNum(value) {
  return typeof value === "number" && isFinite(value) ? value.toLocaleString("en", { maximumSignificantDigits: 6 }) : "-";
}

function epsCell(value, delta) {
  return typeof value === "number" && isFinite(value) ? `${epsNum(value)} (δ ${delta ?? 0})` : "-";
}

function short(address) {
  return typeof address === "string" && address.length > 12 ? address.slice(0, 8) + "…" + address.slice(-4) : address || "-";
}

function maxOf(table) {
  const values = Object.values(table || {}).filter((v) => typeof v === "number");
  return values.length ? Math.max(...values) : null;
}

function fillRows(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

function renderRounds(state) {
  fillRows(
    "rounds",
    state.rounds.map((r) => {
      const tr = el("tr");
      tr.dataset.round = String(r.round);
      tr.dataset.state = String(r.state);
      const eps = maxOf(r.eps);
      const record = maxOf(r.record_eps);
      const cells = [
        [r.round, "num"],
        [r.state, `state-${r.state}`],
        [r.committed ?? "-", "num"],
        [fmt(r.accuracy, 4), "num"],
        [fmt(r.loss, 4), "num"],
        [epsCell(eps, r.delta), "num eps"],
        [epsCell(record, r.record_delta), "num eps"],
        [num(r.gas), "num"],
        [num(r.bytes_fetched), "num"],
      ];
      for (const [text, cls] of cells) tr.append(el("td", text, cls));
      return tr;
    }),
  );
}

function renderPeers(state) {
  fillRows(
    "peers",
    state.peers.map((p) => {
      const last = [...p.history].reverse().find((m) => typeof m.eps_cumulative === "number") || {};
      const tr = el("tr");
      tr.dataset.peer = String(p.index);
      for (const [text, cls] of [
        [p.index, "num"],
        [short(p.address), "address"],
        [p.round ?? "-", "num"],
        [p.phase],
        [fmt(p.accuracy, 4), "num"],
        [epsCell(last.eps_cumulative, last.delta_cumulative), "num eps"],
        [epsCell(last.record_eps_cumulative, last.record_delta), "num eps"],
      ])
        tr.append(el("td", text, cls));
      tr.children[1].title = p.address || "";
      if (last.eps_protects) document.getElementById("peers-eps-scope").textContent = `protects ${last.eps_protects}`;
      if (last.record_protects) document.getElementById("peers-record-scope").textContent = last.record_protects;
      return tr;
    }),
  );
}

function renderEvents(state) {
  document.getElementById("events-note").textContent = state.events.length
    ? `(newest first, ${state.events.length} shown)`
    : state.live
      ? "(none yet)"
      : "(none recorded: swarm up and swarm node write chain-events.jsonl unless --no-chain-events; older runs did only with --dashboard)";
  fillRows(
    "events",
    [...state.events].reverse().map((e) => {
      const args = e.args || {};
      const details = Object.entries(args)
        .filter(([k]) => k !== "round" && k !== "peer")
        .map(([k, v]) => `${k}=${v}`)
        .join(" ");
      const tr = el("tr");
      for (const text of [e.block, e.event, args.round ?? "-", short(args.peer || args.by || args.account), details])
        tr.append(el("td", text));
      return tr;
    }),
  );
}

// One uPlot per chart, rebuilt only when its series change (a new peer), else given new data.
function plot(id, series, data, axes) {
  const key = JSON.stringify(series.map((s) => s.label));
  const target = document.getElementById(id);
  if (!charts[id] || charts[id].key !== key) {
    if (charts[id]) charts[id].chart.destroy();
    const opts = {
      width: 460,
      height: 240,
      scales: { x: { time: false } },
      series: [{ label: "round" }, ...series],
      axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500] }, ...axes],
    };
    charts[id] = { key, chart: new uPlot(opts, data, target) };
  } else {
    charts[id].chart.setData(data);
  }
}

function renderCharts(state) {
  if (typeof uPlot === "undefined") return;
  const ended = state.rounds.filter((r) => r.state !== "running");
  const xs = ended.map((r) => r.round);
  plot(
    "chart-accuracy",
    [
      { label: "accuracy", stroke: COLORS[0], scale: "acc", spanGaps: true },
      { label: "loss", stroke: COLORS[1], scale: "loss", spanGaps: true },
    ],
    [xs, ended.map((r) => r.accuracy ?? null), ended.map((r) => r.loss ?? null)],
    [{ scale: "acc", label: "accuracy" }, { scale: "loss", label: "loss", side: 1, grid: { show: false } }],
  );
  const rounds = [...new Set(state.peers.flatMap((p) => p.history.map((m) => m.round)))].sort((a, b) => a - b);
  const epsSeries = [];
  const epsData = [rounds];
  state.peers.forEach((p, i) => {
    const byRound = new Map(p.history.map((m) => [m.round, m]));
    const first = p.history.find((m) => typeof m.eps_cumulative === "number") || {};
    if (i === 0 && first.eps_protects)
      document.getElementById("eps-caption").textContent =
        `cumulative eps per peer: ${first.eps_protects}, delta ${first.delta_cumulative ?? 0}` +
        (state.dp_sgd ? `; dashed: record-level (DP-SGD), delta ${first.record_delta ?? 0}` : "");
    epsSeries.push({
      label: `peer ${p.index}`,
      stroke: COLORS[i % COLORS.length],
      spanGaps: true,
    });
    epsData.push(rounds.map((r) => byRound.get(r)?.eps_cumulative ?? null));
    if (state.dp_sgd) {
      epsSeries.push({
        label: `peer ${p.index} record-level`,
        stroke: COLORS[i % COLORS.length],
        dash: [6, 4],
        spanGaps: true,
      });
      epsData.push(rounds.map((r) => byRound.get(r)?.record_eps_cumulative ?? null));
    }
  });
  plot("chart-eps", epsSeries, epsData, [{ label: "eps" }]);
  plot(
    "chart-cost",
    [
      { label: "gas", stroke: COLORS[3], scale: "gas" },
      { label: "bytes fetched", stroke: COLORS[2], scale: "bytes" },
    ],
    [xs, ended.map((r) => r.gas ?? null), ended.map((r) => r.bytes_fetched ?? null)],
    [{ scale: "gas", label: "gas", size: 70 }, { scale: "bytes", label: "bytes", side: 1, size: 70, grid: { show: false } }],
  );
}

function renderHeader(state) {
  document.title = `swarm ${state.title}`;
  document.getElementById("title").textContent = `swarm ${state.kind} ${state.title}`;
  const done = state.rounds.filter((r) => r.state === "finalized" || r.state === "aborted");
  const parts = [
    state.ledger ? `ledger ${state.ledger} (chain ${state.chain_id})` : null,
    state.mechanism ? `mechanism ${state.mechanism}${state.protects ? `, eps protects ${state.protects}` : ""}` : null,
    `${done.length}${state.rounds_wanted ? ` of ${state.rounds_wanted}` : ""} rounds ended`,
    state.finished ? "finished" : state.live ? "live" : "read from the folder",
  ];
  const summary = document.getElementById("summary");
  summary.textContent = parts.filter(Boolean).join(" · ");
  if (state.failure) summary.append(el("span", ` · FAILED: ${state.failure}`, "failure"));
}

function render(state) {
  renderHeader(state);
  renderRounds(state);
  renderPeers(state);
  renderEvents(state);
  renderCharts(state);
}

let rendered = false;

function show(state) {
  render(state);
  if (!rendered) {
    rendered = true;
    performance.mark("first-data"); // when the page first showed the run (the browser test reads it)
  }
}

function connected(yes) {
  document.getElementById("connection").textContent = yes
    ? "connected: updates as the run's files change"
    : "not connected (the run may have ended): showing the last state, reconnecting…";
}

// The first data comes from one plain request, at once; the stream then pushes every change.
fetch("/api/state", { cache: "no-store" })
  .then((response) => (response.ok ? response.json() : null))
  .then((state) => state && !rendered && show(state))
  .catch(() => {});

// EventSource reconnects by itself after a dropped connection (the server asks for 1 s); when the
// browser gives up (an error status, a server that was gone too long), a new one is opened.
function listen() {
  const stream = new EventSource("/events");
  stream.addEventListener("state", (event) => {
    connected(true);
    show(JSON.parse(event.data));
  });
  stream.onerror = () => {
    connected(false);
    if (stream.readyState === EventSource.CLOSED) setTimeout(listen, 2000);
  };
}
listen();
