// The Training view: a training run followed as `gpt2 train` writes it, from /v1/runs (gpt2 serve --runs DIR).
// log.jsonl gives the losses (each logged step's, and the evaluations' train and val losses) and the samples;
// probes.jsonl, a record per evaluation of the model reading one fixed probe, gives every head's scores, its
// attention and the probe's greedy continuation. While the view is shown it asks every second for the lines
// written since it last asked ("since"), and draws them; a file cut back by a resume ("reset") is read again.

import { $, LOOKS_AT, SCORES, call, colour, showError, svg } from "./api.js";

const POLL_MS = 1000;
const LINES = ["#d1495b", "#edae49", "#00798c", "#66a182", "#8d6cab", "#2e4057"];  // the heads that stand out
const STEP_INK = "#8fb3d9", TRAIN_INK = "#0b5cad", VAL_INK = "#e07b00";

const run = {
  name: null,          // the run shown
  epoch: 0,            // bumped when another run is chosen or the run is read anew: answers of before are dropped
  log: [],             // log.jsonl's records so far
  probes: [],          // probes.jsonl's
  next: { log: 0, probes: 0 },
};
const chosen = {
  evaluation: null,    // the probe record shown (an index into run.probes); null: the newest, followed
  head: null,          // {layer, head} whose attention is drawn
};
let following = false;  // the poll loop runs
let missing = false;    // the server follows no runs (no --runs): nothing to poll

const fmt = (n) => n.toLocaleString("en-US");
const fixed = (x, d = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(d));
const shown = (text) => JSON.stringify(text).slice(1, -1);  // a token with its spaces and newlines visible


// ------------------------------------------------------------------ following the run

async function tick() {
  if ($("training").hidden || missing) {
    following = false;
    return;
  }
  try {
    await listRuns();
    if (run.name !== null) {
      const epoch = run.epoch;
      await readNew("log");
      await readNew("probes");
      if (run.epoch !== epoch) await readNew("log");  // probes.jsonl was cut back: the log is read anew too
    }
    showError("", "training-error");
  } catch (e) {
    showError(`${e.message}${e.message.startsWith("401") ? " (the API key goes in the Playground's settings)" : ""}`,
      "training-error");
  }
  if (!missing) setTimeout(tick, POLL_MS);
  else following = false;
}

function follow() {
  if (following) return;
  following = true;
  tick();
}

async function listRuns() {
  const { runs } = await call("/v1/runs");
  if (runs.length === 0) {  // a run's directory is listed even before its first record: this server has none
    missing = true;
    $("training-waiting").textContent = "This server follows no training runs: start it with gpt2 serve --runs DIR, "
      + "DIR a run's directory (gpt2 train's --out) or a directory of runs.";
    return;
  }
  const select = $("training-run");
  const words = (r) => `${r.name} · ${r.iter === null ? "no records yet" : `iteration ${fmt(r.iter)}`} · `
    + `${r.evaluations} evaluation${r.evaluations === 1 ? "" : "s"}`;
  if (runs.map((r) => r.name).join("/") === [...select.options].map((o) => o.value).join("/")) {
    runs.forEach((r, i) => { if (select.options[i].text !== words(r)) select.options[i].text = words(r); });  // an open list stays open
  } else {
    select.replaceChildren(...runs.map((r) => new Option(words(r), r.name)));
  }
  if (!runs.some((r) => r.name === run.name)) choose(runs[0].name);  // at first, or the run shown went
  select.value = run.name;
}

function choose(name) {
  run.name = name;
  restart();
  chosen.head = null;
}

// Forget the run's records: the next reads start again from line 0.
function restart() {
  run.epoch += 1;
  run.log = [];
  run.probes = [];
  run.next = { log: 0, probes: 0 };
  chosen.evaluation = null;
  draw();
}

// The lines of one file written since the last read, page after page; a file cut back (a resumed run rewrote it
// shorter, or wrote it again past where it was cut: its iterations go back) is read again from its start.
async function readNew(kind) {
  let epoch = run.epoch;
  for (let pages = 0; pages < 100; pages++) {
    const answer = await call(`/v1/runs/${encodeURIComponent(run.name)}/${kind}?since=${run.next[kind]}`);
    if (epoch !== run.epoch) return;  // another run chosen meanwhile
    const held = run[kind];
    const last = held.length ? held[held.length - 1].iter : -Infinity;
    const wentBack = !answer.reset && answer.records.some((r) => r.iter < last);
    if (answer.reset || wentBack) {
      restart();
      epoch = run.epoch;
      if (wentBack) continue;  // from line 0 now; a reset's answer is that already
    }
    if (answer.records.length === 0) return;
    run[kind].push(...answer.records);
    run.next[kind] = answer.next;
    if (kind === "log") drawLog();
    else drawProbes();
  }
}

// ------------------------------------------------------------------ drawing

function draw() {
  drawLog();
  drawProbes();
}

const stepsOf = (log) => log.filter((r) => typeof r.loss === "number");
const evalsOf = (log) => log.filter((r) => "val_loss" in r);

function drawLog() {
  const steps = stepsOf(run.log);
  const evals = evalsOf(run.log);
  const settings = [...run.log].reverse().find((r) => r.settings);
  const last = run.log.length ? run.log[run.log.length - 1].iter : null;
  const view = $("training");
  view.dataset.lastIter = last === null ? "" : last;
  view.dataset.run = run.name ?? "";
  let summary = "";
  if (last !== null) {
    const of = settings && settings.settings.max_iters ? ` of ${fmt(settings.settings.max_iters)}` : "";
    const best = evals.length ? Math.min(...evals.map((r) => r.val_loss)) : null;
    summary = `Iteration ${fmt(last)}${of}; ${evals.length} evaluation${evals.length === 1 ? "" : "s"}`
      + (best === null ? "" : `, best val loss ${fixed(best, 4)}`) + (steps.length ? `, last step's loss ${fixed(steps[steps.length - 1].loss, 4)}` : "")
      + ".";
  }
  $("training-summary").textContent = summary;
  $("training-waiting").hidden = missing ? false : last !== null || run.probes.length > 0;
  if (!missing && run.name !== null) {
    $("training-waiting").textContent = `Waiting for ${run.name}'s first records: gpt2 train writes log.jsonl from its first step.`;
  }
  drawLoss();
  drawSamples();
}

function drawProbes() {
  const n = run.probes.length;
  $("training").dataset.evaluations = n;
  $("training-probes-waiting").hidden = n > 0;
  for (const part of document.querySelectorAll("#training .needs-probes")) part.hidden = n === 0;
  const slider = $("training-evaluation");
  slider.max = Math.max(0, n - 1);
  const at = chosen.evaluation === null ? n - 1 : Math.min(chosen.evaluation, n - 1);
  slider.value = Math.max(0, at);
  if (n === 0) {
    drawLoss();
    drawSamples();
    return;
  }
  const record = run.probes[at];
  const words = `iteration ${fmt(record.iter)}`;
  $("training-evaluation-iter").textContent = `${words} (${at + 1} of ${n})`;
  slider.setAttribute("aria-valuetext", words);
  drawHeads(record);
  drawScoreChart();
  drawAttention(record);
  drawLoss();  // its marker at the evaluation shown
  drawSamples();
}

// Round numbers for an axis from lo to hi, about `count` of them.
function ticks(lo, hi, count = 5) {
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => span / s <= count) || 10 * magnitude;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return { values: out, step };
}

// A chart's frame: axes with their numbers and titles, and the scales of its data, in an <svg> `width` wide.
function frame(chart, width, height, xs, ys, titles) {
  const margin = { left: 52, right: titles.right || 16, top: 12, bottom: 38 };
  const x = { lo: xs[0], hi: xs[1] > xs[0] ? xs[1] : xs[0] + 1 };
  const yt = ticks(ys[0], ys[1], 5);
  const y = { lo: ys[0], hi: ys[1] > ys[0] ? ys[1] : ys[0] + 1 };
  const X = (v) => margin.left + ((v - x.lo) / (x.hi - x.lo)) * (width - margin.left - margin.right);
  const Y = (v) => height - margin.bottom - ((v - y.lo) / (y.hi - y.lo)) * (height - margin.top - margin.bottom);
  chart.setAttribute("width", width);
  chart.setAttribute("height", height);
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const axes = svg("g", { class: "axes" });
  for (const v of yt.values) {
    axes.append(svg("line", { x1: margin.left, x2: width - margin.right, y1: Y(v), y2: Y(v), class: "grid" }));
    axes.append(svg("text", { x: margin.left - 6, y: Y(v) + 4, "text-anchor": "end" }, Number(v.toFixed(4)).toString()));
  }
  const xt = ticks(x.lo, x.hi, Math.max(2, Math.floor((width - margin.left - margin.right) / 90))).values;
  for (const v of xt.filter(Number.isInteger)) {  // iterations
    axes.append(svg("line", { x1: X(v), x2: X(v), y1: height - margin.bottom, y2: height - margin.bottom + 4, class: "tick" }));
    axes.append(svg("text", { x: X(v), y: height - margin.bottom + 16, "text-anchor": "middle" }, fmt(v)));
  }
  axes.append(svg("line", { x1: margin.left, x2: width - margin.right, y1: height - margin.bottom, y2: height - margin.bottom, class: "axis" }));
  axes.append(svg("line", { x1: margin.left, x2: margin.left, y1: margin.top, y2: height - margin.bottom, class: "axis" }));
  axes.append(svg("text", { x: (margin.left + width - margin.right) / 2, y: height - 4, "text-anchor": "middle", class: "title" }, titles.x));
  axes.append(svg("text", { x: 12, y: (margin.top + height - margin.bottom) / 2, "text-anchor": "middle", class: "title",
    transform: `rotate(-90 12 ${(margin.top + height - margin.bottom) / 2})` }, titles.y));
  chart.replaceChildren(axes);
  return { X, Y, margin };
}

const path = (points, X, Y) => points.map(([a, b], i) => `${i ? "L" : "M"}${X(a).toFixed(1)},${Y(b).toFixed(1)}`).join("");

// The evaluation the slider shows, as a dashed line across a chart.
function marker(chart, X, margin, height) {
  if (!run.probes.length) return;
  const at = run.probes[Number($("training-evaluation").value)];
  chart.append(svg("line", { x1: X(at.iter), x2: X(at.iter), y1: margin.top, y2: height - margin.bottom, class: "marker" }));
}

function chartWidth(chart) {
  return Math.max(320, Math.floor(chart.parentElement.clientWidth || 600));
}

function drawLoss() {
  const steps = stepsOf(run.log), evals = evalsOf(run.log);
  const chart = $("training-loss");
  $("training-loss-legend").hidden = steps.length + evals.length === 0;
  if (steps.length + evals.length === 0) {
    chart.replaceChildren();
    chart.setAttribute("width", 0);
    chart.setAttribute("height", 0);
    return;
  }
  const losses = [...steps.map((r) => r.loss), ...evals.flatMap((r) => [r.train_loss, r.val_loss])].filter(Number.isFinite);
  const iters = [...steps, ...evals].map((r) => r.iter);
  const lo = Math.min(...losses), hi = Math.max(...losses);
  const pad = (hi - lo) * 0.05 || 0.1;
  const height = 300;
  const { X, Y, margin } = frame(chart, chartWidth(chart), height, [Math.min(...iters), Math.max(...iters)],
    [Math.max(0, lo - pad), hi + pad], { x: "iteration", y: "loss (nats per token)" });
  chart.append(svg("path", { d: path(steps.map((r) => [r.iter, r.loss]), X, Y), class: "steps", stroke: STEP_INK }));
  for (const [key, ink] of [["train_loss", TRAIN_INK], ["val_loss", VAL_INK]]) {
    const points = evals.filter((r) => Number.isFinite(r[key]));
    chart.append(svg("path", { d: path(points.map((r) => [r.iter, r[key]]), X, Y), class: "evals", stroke: ink }));
    for (const r of points) {
      const dot = svg("circle", { cx: X(r.iter), cy: Y(r[key]), r: 3.5, fill: ink, class: key.split("_")[0],
        "data-iter": r.iter, "data-loss": r[key] });
      dot.append(svg("title", {}, `iteration ${fmt(r.iter)}: ${key.replace("_", " ")} ${fixed(r[key], 4)}`));
      chart.append(dot);
    }
  }
  marker(chart, X, margin, height);
}

// The samples, newest first: the evaluations' (log.jsonl: the continuation of the run's sample_prompt) and the
// probes' (the greedy continuation of the probe), each under its iteration.
function drawSamples() {
  const byIter = new Map();
  let prompt = "";
  for (const r of run.log) {
    if (r.settings) prompt = r.settings.sample_prompt ?? "";
    if (typeof r.sample === "string") byIter.set(r.iter, { ...byIter.get(r.iter), prompt, sample: r.sample });
  }
  for (const r of run.probes) {
    if (r.sample === null || r.sample === undefined) continue;
    const tokens = r.tokens ?? r.ids.map((i) => `[${i}]`);
    byIter.set(r.iter, { ...byIter.get(r.iter), probe: tokens.slice(-12).join(""), cut: tokens.length > 12, continuation: r.sample });
  }
  const items = [...byIter.entries()].sort((a, b) => b[0] - a[0]).slice(0, 40).map(([iter, s]) => {
    const item = document.createElement("li");
    item.dataset.iter = iter;
    item.append(Object.assign(document.createElement("span"), { className: "iter", textContent: `iteration ${fmt(iter)}` }));
    if (s.sample !== undefined) item.append(sampleLine("sample", s.prompt, false, s.sample));
    if (s.continuation !== undefined) item.append(sampleLine("probe", s.probe, s.cut, s.continuation));
    return item;
  });
  $("training-samples").replaceChildren(...items);
  $("training-samples-waiting").hidden = items.length > 0;
  $("training-samples-waiting").textContent = run.probes.length && run.probes.every((r) => r.tokens === null)
    ? "This run writes no samples: its data has no tokenizer (its ids are its tokens)."
    : "No samples yet: a run samples at each evaluation.";
}

function sampleLine(kind, given, cut, text) {
  const line = document.createElement("p");
  line.className = `sample ${kind}`;
  line.append(Object.assign(document.createElement("span"), { className: "kind", textContent: kind }),
    Object.assign(document.createElement("span"), { className: "given", textContent: (cut ? "…" : "") + given }),
    Object.assign(document.createElement("span"), { className: "text", textContent: text }));
  return line;
}

// Every head's chosen score at the slider's evaluation: a square per head, a row per layer; a click draws the
// head's attention.
function drawHeads(record) {
  const kind = $("training-score").value;
  const scores = record.head_scores[kind];
  const nLayer = scores.length, nHead = scores[0].length;
  if (!chosen.head || chosen.head.layer >= nLayer || chosen.head.head >= nHead) chosen.head = strongest(scores);
  const grid = $("training-heads");
  grid.style.gridTemplateColumns = `auto repeat(${nHead}, 2.6rem)`;
  const cells = [document.createElement("span")];
  for (let h = 0; h < nHead; h++) cells.push(Object.assign(document.createElement("span"), { className: "column", textContent: `head ${h}` }));
  scores.forEach((row, layer) => {
    cells.push(Object.assign(document.createElement("span"), { textContent: `layer ${layer}` }));
    row.forEach((score, head) => {
      const cell = document.createElement("button");
      cell.type = "button";
      Object.assign(cell.dataset, { layer, head, score: score ?? "" });
      cell.textContent = score === null ? "—" : score.toFixed(2);
      cell.style.backgroundColor = score === null ? "#d0d7de" : colour(Math.max(0, Math.min(1, score)));
      cell.style.color = score !== null && score > 0.55 ? "#fff" : "#1b1f24";
      cell.title = `layer ${layer}, head ${head}: ${SCORES[kind]} ${fixed(score)} at iteration ${fmt(record.iter)}`;
      cell.setAttribute("aria-label", cell.title);
      cell.setAttribute("aria-pressed", String(chosen.head.layer === layer && chosen.head.head === head));
      cell.addEventListener("click", () => {
        chosen.head = { layer, head };
        drawProbes();
        $("training-heads").querySelector('[aria-pressed="true"]').focus();  // drawn anew: the focus stays on it
      });
      cells.push(cell);
    });
  });
  grid.replaceChildren(...cells);
  $("training-legend-words").textContent = `the ${SCORES[kind]} score: the head's mean attention to ${LOOKS_AT[kind]}, on the probe`;
}

function strongest(scores) {
  let best = { layer: 0, head: 0 }, most = -Infinity;
  scores.forEach((row, layer) => row.forEach((s, head) => { if (s !== null && s > most) { most = s; best = { layer, head }; } }));
  return best;
}

// The chosen score of every head at each evaluation: a line per head. The heads that score most at the last
// evaluation are coloured and named; the clicked one is drawn bold.
function drawScoreChart() {
  const chart = $("training-scores");
  const kind = $("training-score").value;
  const records = run.probes;
  const nLayer = records[0].head_scores[kind].length, nHead = records[0].head_scores[kind][0].length;
  const iters = records.map((r) => r.iter);
  const height = 240;
  const { X, Y, margin } = frame(chart, chartWidth(chart), height, [Math.min(...iters), Math.max(...iters)], [0, 1],
    { x: "iteration", y: SCORES[kind], right: 58 });
  const latest = records[records.length - 1].head_scores[kind];
  const heads = [];
  for (let l = 0; l < nLayer; l++) for (let h = 0; h < nHead; h++) heads.push({ layer: l, head: h, last: latest[l][h] ?? 0 });
  heads.sort((a, b) => b.last - a.last);
  const named = heads.filter((h, i) => i === 0 || (i < LINES.length && h.last >= 0.25));  // the ones that stand out
  const labels = [];
  for (const h of [...heads].reverse()) {  // the named on top
    const index = named.indexOf(h);
    const isChosen = chosen.head && chosen.head.layer === h.layer && chosen.head.head === h.head;
    const points = records.map((r) => [r.iter, r.head_scores[kind][h.layer][h.head]]).filter(([, s]) => s !== null);
    const line = svg("path", { d: path(points, X, Y), class: `head${isChosen ? " chosen" : ""}`,
      stroke: index >= 0 ? LINES[index] : "#c4ccd4", "data-layer": h.layer, "data-head": h.head });
    line.append(svg("title", {}, `layer ${h.layer}, head ${h.head}`));
    chart.append(line);
    if (records.length === 1) {
      for (const [a, b] of points) chart.append(svg("circle", { cx: X(a), cy: Y(b), r: 2.5, fill: index >= 0 ? LINES[index] : "#c4ccd4" }));
    }
    if (index >= 0 || isChosen) labels.push({ y: Y(h.last), text: `L${h.layer} H${h.head}`, ink: index >= 0 ? LINES[index] : "#57606a" });
  }
  labels.sort((a, b) => a.y - b.y);
  for (let i = 1; i < labels.length; i++) labels[i].y = Math.max(labels[i].y, labels[i - 1].y + 12);  // apart
  const over = labels.length ? labels[labels.length - 1].y - (height - margin.bottom) : 0;
  if (over > 0) for (const l of labels) l.y -= over;  // and above the axis
  const right = Number(chart.getAttribute("width")) - margin.right;
  for (const l of labels) chart.append(svg("text", { x: right + 6, y: l.y + 4, fill: l.ink, class: "label" }, l.text));
  marker(chart, X, margin, height);
}

// The chosen head's attention at the slider's evaluation: a row per token of the probe (a query), a column per
// token it may attend to (a key), darker for more.
function drawAttention(record) {
  const { layer, head } = chosen.head;
  const weights = record.attention[layer][head];
  const T = weights.length;
  const tokens = (record.tokens ?? record.ids.map((i) => `${i}`)).map((t) => shown(t));
  const chart = $("training-attention");
  const room = chart.parentElement.clientWidth || 520;  // the panel's width, once shown
  const widest = Math.max(...tokens.map((t) => t.length));
  let cell = Math.max(6, Math.min(18, Math.floor((room - 40) / T)));
  const font = Math.max(7, Math.min(11, cell - 3));
  const label = Math.min(90, widest * font * 0.62 + 12);
  cell = Math.max(6, Math.min(18, Math.floor((room - label - 4) / T)));
  const size = label + T * cell + 4;
  chart.setAttribute("width", size);
  chart.setAttribute("height", size);
  chart.setAttribute("viewBox", `0 0 ${size} ${size}`);
  const parts = [];
  tokens.forEach((t, i) => {
    const at = label + i * cell + cell / 2;
    parts.push(svg("text", { x: label - 4, y: at + font / 3, "text-anchor": "end", "font-size": font, class: "token" }, t));
    parts.push(svg("text", { x: at + font / 3, y: label - 4, "font-size": font, class: "token", transform: `rotate(-90 ${at + font / 3} ${label - 4})` }, t));
  });
  weights.forEach((row, q) => row.forEach((w, k) => {
    parts.push(svg("rect", { x: label + k * cell, y: label + q * cell, width: cell - 1, height: cell - 1,
      fill: k > q ? "#eceff3" : colour(Math.max(0, Math.min(1, w))), "data-query": q, "data-key": k, "data-weight": w }));
  }));
  chart.replaceChildren(...parts);
  chart.dataset.layer = layer;
  chart.dataset.head = head;
  chart.dataset.iter = record.iter;
  const kinds = Object.keys(SCORES).map((k) => `${SCORES[k]} ${fixed(record.head_scores[k][layer][head])}`).join(", ");
  $("training-attention-caption").textContent = `Layer ${layer}, head ${head} at iteration ${fmt(record.iter)}: ${kinds}.`;
}

function pointAtAttention(event) {
  const rect = event.target.closest("rect");
  const record = run.probes[Number($("training-evaluation").value)];
  if (!rect || !record) return;
  const q = Number(rect.dataset.query), k = Number(rect.dataset.key);
  const tokens = record.tokens ?? record.ids.map((i) => `${i}`);
  $("training-attention-point").textContent = k > q ? `"${shown(tokens[q])}" (position ${q}) cannot look ahead at position ${k}`
    : `"${shown(tokens[q])}" (position ${q}) → "${shown(tokens[k])}" (position ${k}): ${fixed(Number(rect.dataset.weight), 4)}`;
}

// ------------------------------------------------------------------ wiring

function start() {
  const legend = $("training-legend-bar");
  legend.style.background = `linear-gradient(to right, ${colour(0)}, ${colour(0.5)}, ${colour(1)})`;
  $("training").addEventListener("viewshown", () => {
    follow();
    draw();  // the charts take the width the view has, now that it is shown
  });
  $("training-run").addEventListener("change", (e) => choose(e.target.value));
  $("training-score").addEventListener("change", drawProbes);
  $("training-evaluation").addEventListener("input", (e) => {
    const at = Number(e.target.value);
    chosen.evaluation = at === run.probes.length - 1 ? null : at;  // at the newest: follow the newest
    drawProbes();
  });
  $("training-attention").addEventListener("mousemove", pointAtAttention);
  let width = innerWidth;
  addEventListener("resize", () => { if (innerWidth !== width && !$("training").hidden) { width = innerWidth; draw(); } });
  if (!$("training").hidden) follow();  // opened by /#training before this script listened
}

start();
