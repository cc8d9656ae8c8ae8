// The walkthrough view: the seeds' forward pass on one prompt, from /v1/walk. Each step of the pass
// (its shape, formula and values at the last position, a sentence on what it is for); how BPE cut
// the prompt into tokens; the position embedding; GELU with the prompt's pre-activations on it;
// what each LayerNorm does to its input; and the tied unembedding's next-token distribution at the
// temperature a slider sets, computed here over all the logits. Plain JavaScript, no library.

import { $, call, diverging, send, showError, svg } from "./api.js";

const TOP_K = 50;  // next tokens named by the server (their text); the probabilities come from all the logits

const state = {
  walk: null,        // /v1/walk's answer now drawn
  asked: 0,          // the latest walk asked for: an answer to an older one is dropped
  readsText: null,   // whether the model has a tokenizer (null: not asked yet); without one, prompts are ids
  shown: null,       // once the view has been opened: the promise of its first showing (late controls, tokenizer)
};
const TOP_SHOWN = 10;

// ------------------------------------------------------------------ small helpers

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(e.dataset, value);
    else if (key in e) e[key] = value;
    else e.setAttribute(key, value);
  }
  e.append(...children);
  return e;
}

const shapeText = (shape) => `(${shape.join(", ")})`;
const fixed = (x, digits = 3) => (x < 0 ? "−" : "") + Math.abs(x).toFixed(digits);
const percent = (p) => `${(100 * p).toPrecision(3)}%`;
const visible = (text) => text.replaceAll(" ", "␣").replaceAll("\n", "↵").replaceAll("\t", "⇥");
const largest = (values) => values.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
const mean = (xs) => xs.reduce((s, v) => s + v, 0) / xs.length;
const std = (xs) => { const m = mean(xs); return Math.sqrt(xs.reduce((s, v) => s + (v - m) ** 2, 0) / xs.length); };

// A value is drawn in the playground's colours (api.js's diverging) as value / scale, clamped to -1..1.

// ------------------------------------------------------------------ asking

// The prompt as the server takes it: text, or, for a model with no tokenizer, ids typed with spaces
// or commas ("1 2 3", "[1, 2, 3]").
function prompt() {
  const text = $("walk-prompt").value;
  if (state.readsText === false && /^\s*\[?\s*\d+(\s*[,\s]\s*\d+)*\s*\]?\s*$/.test(text)) {
    return text.match(/\d+/g).map(Number);
  }
  return text;
}

async function walk(event) {
  event.preventDefault();
  const asked = ++state.asked;
  $("walkthrough").setAttribute("aria-busy", "true");
  showError("", "walk-error");
  try {
    await shown();  // whether the model reads text: typed ids are sent as ids only where it does not
    const answer = await call("/v1/walk", { prompt: prompt(), top_k: TOP_K });  // fewer where the vocabulary is
    if (asked !== state.asked) return;
    draw(answer);
  } catch (e) {
    if (asked !== state.asked) return;
    state.walk = null;
    $("walk-body").hidden = true;
    $("walk-summary").textContent = "";
    showError(e.message, "walk-error");
  } finally {
    if (asked === state.asked) $("walkthrough").removeAttribute("aria-busy");
  }
}

function draw(answer) {
  state.walk = answer;
  const m = answer.model, T = answer.ids.length;
  const last = answer.tokens[T - 1];
  $("walk-summary").textContent = `${T} token${T === 1 ? "" : "s"} through ${m.n_layer} blocks of ${m.n_head} heads ` +
    `(C = ${m.n_embd}, a vocabulary of ${m.n_vocab}, a context of ${m.n_ctx}). The values drawn are those of the last ` +
    `position, ${T - 1} (${JSON.stringify(last)}), whose next token the pass ends on.`;
  $("walk-waiting").hidden = true;
  $("walk-body").hidden = false;
  drawTokens(answer);
  drawPositions(answer.positions);
  drawSteps(answer);
  chooseGeluBlock(answer);
  drawLayerNorms(answer);
  drawNext();
}

// ------------------------------------------------------------------ tokens and BPE

function drawTokens(answer) {
  const words = {
    bpe: "GPT-2's byte-level BPE: the text is cut into pieces (words with their leading space, numbers, " +
      "punctuation), each piece is written as bytes, and the pair of neighbours with the lowest rank in the merge " +
      "table is merged, again and again, until no pair is in the table. A line per merge, the pair just merged marked.",
    char: "This model's tokenizer is by characters: each character is one token, no merges.",
  };
  $("walk-tokenizer").textContent = answer.tokenizer === null
    ? "This model has no tokenizer: it reads token ids, given here as the prompt." : words[answer.tokenizer];
  const box = $("walk-bpe");
  box.replaceChildren(el("div", { className: "chips tokens" }, ...answer.ids.map((id, i) =>
    el("span", { className: "chip", title: `position ${i}: id ${id}`, dataset: { tokenId: String(id) } },
      el("span", { textContent: answer.tokenizer === null ? String(id) : visible(answer.tokens[i]) }),
      el("sub", { textContent: String(id) })))));
  if (answer.bpe) box.append(...answer.bpe.map(bpeWord));
}

// One piece of the text and its merges, a line each: the pieces as chips, the one just made marked.
function bpeWord({ word, merges }) {
  const lines = merges.map((pieces, step) => {
    const before = merges[step - 1];
    const made = step === 0 ? -1 : pieces.findIndex((p, i) => p !== before[i]);
    const label = step === merges.length - 1 ? "tokens" : step === 0 ? "bytes" : `merge ${step}`;
    return el("div", { className: `merge-step${step === merges.length - 1 ? " final" : ""}`, dataset: { step: String(step) } },
      el("span", { className: "step-label", textContent: label }),
      ...pieces.map((piece, i) => el("span", {
        className: `chip${i === made ? " merged" : ""}`,
        textContent: piece,
        title: i === made ? `${before[i]} + ${before[i + 1]} → ${piece}` : piece,
      })));
  });
  return el("div", { className: "bpe-word", dataset: { word } },
    el("div", { className: "word", textContent: JSON.stringify(word) }), ...lines);
}

// ------------------------------------------------------------------ the position embedding

function drawPositions(positions) {
  const { rows, dims, heat, kind, n_ctx, n_embd } = positions;
  const canvas = $("walk-positions-heat");
  const cw = Math.max(1, Math.min(8, Math.round(224 / dims.length)));  // about 224 pixels a side, 256 at most
  const ch = Math.max(1, Math.min(8, Math.round(224 / rows.length)));
  const left = 34, top = 16, scale = largest(heat.flat()) || 1;
  canvas.width = left + dims.length * cw + 4;
  canvas.height = top + rows.length * ch + 4;
  Object.assign(canvas.dataset, { left, top, cw, ch, scale });
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  heat.forEach((row, r) => row.forEach((v, d) => {
    ctx.fillStyle = diverging(v / scale);
    ctx.fillRect(left + d * cw, top + r * ch, cw, ch);
  }));
  ctx.fillStyle = "#57606a";
  ctx.font = "10px ui-monospace, Menlo, Consolas, monospace";
  ctx.textAlign = "right";
  ctx.fillText("0", left - 4, top + 9);
  ctx.fillText(String(rows[rows.length - 1]), left - 4, top + rows.length * ch);
  ctx.textAlign = "left";
  ctx.fillText(`dimension → ${dims[dims.length - 1]}`, left, 11);
  canvas.onmousemove = (e) => {
    const d = Math.floor((e.offsetX * canvas.width / canvas.clientWidth - left) / cw);
    const r = Math.floor((e.offsetY * canvas.height / canvas.clientHeight - top) / ch);
    canvas.title = heat[r] && d >= 0 && d < dims.length
      ? `position ${rows[r]}, dimension ${dims[d]}: ${fixed(heat[r][d], 4)}` : "";
  };
  drawCurves(positions);
  const sampled = rows.length < n_ctx || dims.length < n_embd
    ? ` (sampled evenly: ${rows.length} of ${n_ctx} positions, ${dims.length} of ${n_embd} dimensions)` : "";
  $("walk-positions-caption").textContent = (kind === "sinusoidal"
    ? "Sinusoidal positions: fixed sines and cosines of falling frequency (Attention Is All You Need, 3.5), not " +
      "learned: position t, dimension 2i is sin(t / 10000^(2i/C)), 2i + 1 its cosine."
    : "Learned positions: wpe, a row of C numbers per position, trained with the model.") +
    ` Left: the table, a row per position (0 at the top), a column per dimension${sampled}; right: ` +
    `${positions.curves.dims.length} dimensions over every position.`;
}

function drawCurves({ curves, n_ctx }) {
  const box = $("walk-positions-curves");
  const W = 270, H = 200, pad = 24, scale = largest(curves.values.flat()) || 1;
  box.setAttribute("width", W);
  box.setAttribute("height", H);
  box.setAttribute("viewBox", `0 0 ${W} ${H}`);
  Object.assign(box.dataset, { pad, scale });
  const x = (t) => pad + (t / Math.max(1, n_ctx - 1)) * (W - 2 * pad);
  const y = (v) => H / 2 - (v / scale) * (H / 2 - pad);
  const hues = ["#0b5cad", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#57606a"];
  box.replaceChildren(
    svg("line", { x1: pad, x2: W - pad, y1: H / 2, y2: H / 2, class: "axis" }),
    svg("text", { x: pad, y: H - 6, class: "tick" }, "0"),
    svg("text", { x: W - pad, y: H - 6, class: "tick", "text-anchor": "end" }, `position ${n_ctx - 1}`),
    svg("text", { x: 2, y: pad - 8, class: "tick" }, `±${fixed(scale, 2)}`),
    ...curves.values.map((values, i) => svg("polyline", {
      points: values.map((v, t) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
      stroke: hues[i % hues.length], class: "curve", "data-dim": curves.dims[i],
    })),
    ...curves.dims.map((d, i) => svg("text", { x: W - 4 - 50 * (curves.dims.length - 1 - i), y: 12, class: "tick",
      fill: hues[i % hues.length], "text-anchor": "end" }, `dim ${d}`)),
  );
}

// ------------------------------------------------------------------ the steps

// The pass's steps in the seeds' groups: the embeddings, each block, the output.
function groupOf(name) {
  const block = name.match(/^h\.(\d+)(\.|$)/);
  if (block) return `Block ${block[1]}`;
  return name === "wte" || name === "wpe" ? "Embeddings" : "Output";
}

const GROUP_MATH = {
  Embeddings: "x = wte[ids] + wpe[0..T-1]",
  Output: "logits = ln_f(x) @ wte^T",
  Block: "x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))",
};

function drawSteps(answer) {
  const groups = new Map();
  for (const step of answer.steps) {
    const name = groupOf(step.name);
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push(step);
  }
  $("walk-steps").replaceChildren(...[...groups].map(([name, steps]) => el("section", {
    className: `walk-group${name.startsWith("Block") ? "" : " wide"}` },
    el("h4", {}, name, " ", el("code", { textContent: GROUP_MATH[name] ?? GROUP_MATH.Block })),
    ...steps.map((step) => stepRow(step, answer.tokens)))));
}

// A step: its name, shape and formula, its values drawn; opened (a click, or Enter), what it is for.
function stepRow(step, tokens) {
  const prefix = step.name.match(/^h\.\d+\./)?.[0] ?? "";
  const values = step.name.endsWith(".attn.pattern") ? patternGrids(step.values, tokens) : strip(step.values);
  return el("details", { className: "step", dataset: { step: step.name } },
    el("summary", {},
      el("span", { className: "name" }, el("span", { className: "prefix", textContent: prefix }),
        step.name.slice(prefix.length)),
      el("span", { className: "shape", textContent: shapeText(step.shape) }),
      el("span", { className: "math", textContent: step.math }),
      values),
    el("p", { className: "about", textContent: step.about }));
}

// A vector as a strip of cells, one colour a value (past MAX_CELLS values, a cell a run of `per`
// values, coloured by the run's largest in size), on its own scale: ± its largest value.
const MAX_CELLS = 768;

function strip(values) {
  const per = Math.ceil(values.length / MAX_CELLS), cells = Math.ceil(values.length / per);
  const cell = Math.max(1, Math.floor(MAX_CELLS / cells)), scale = largest(values) || 1;
  const canvas = el("canvas", { className: "strip", width: cells * cell, height: 1, role: "img",
    "aria-label": `${values.length} values, the largest in size ${fixed(scale)}`, dataset: { per, cell, scale } });
  const ctx = canvas.getContext("2d");
  const runs = [];
  for (let c = 0; c < cells; c++) {
    let at = c * per;
    for (let i = at; i < Math.min(values.length, (c + 1) * per); i++) if (Math.abs(values[i]) > Math.abs(values[at])) at = i;
    runs.push(at);
    ctx.fillStyle = diverging(values[at] / scale);
    ctx.fillRect(c * cell, 0, cell, 1);
  }
  canvas.onmousemove = (e) => {
    const c = Math.min(cells - 1, Math.max(0, Math.floor((e.offsetX / canvas.clientWidth) * cells)));
    const at = runs[c];
    canvas.title = per === 1 ? `[${at}] = ${fixed(values[at], 4)}`
      : `[${c * per}..${Math.min(values.length, (c + 1) * per) - 1}]: largest [${at}] = ${fixed(values[at], 4)}`;
  };
  return el("span", { className: "values" }, canvas, el("span", { className: "scale", textContent: `±${fixed(scale, 2)}` }));
}

// Each head's pattern as a T x T grid: the future, above the diagonal, hatched (the causal mask); the
// earlier queries' rows pale (the walk keeps the last position's); the last query's row, the values
// sent, drawn taller below them, white for 0 to dark blue for 1 on a square-root scale (sqrt(p): a
// weight of 1/T still shows). Past GRID_MOST positions, only that row.
const GRID_MOST = 64;

function patternGrids(rows, tokens) {
  return el("span", { className: "values heads" }, ...rows.map((row, h) => headGrid(row, h, tokens)));
}

function headGrid(row, h, tokens) {
  const T = row.length, grid = T <= GRID_MOST;
  const cw = grid ? Math.max(2, Math.min(16, Math.floor(128 / T))) : Math.max(1, Math.floor(256 / T));
  const above = grid ? (T - 1) * cw + 3 : 0, tall = Math.max(12, cw), gap = cw >= 6 ? 1 : 0;
  const canvas = el("canvas", { width: T * cw, height: above + tall, role: "img",
    "aria-label": `pattern ${h}: the last token's weights`, dataset: { head: h, cw, lastTop: above, lastHeight: tall } });
  const ctx = canvas.getContext("2d");
  const masked = ctx.createPattern(hatch(), "repeat");
  for (let q = 0; grid && q < T - 1; q++) {
    for (let k = 0; k < T; k++) {
      ctx.fillStyle = k > q ? masked : "#e6eaef";
      ctx.fillRect(k * cw, q * cw, cw - gap, cw - gap);
    }
  }
  row.forEach((p, k) => {
    ctx.fillStyle = diverging(Math.sqrt(p));
    ctx.fillRect(k * cw, above, cw - gap, tall);
  });
  canvas.onmousemove = (e) => {
    const k = Math.min(T - 1, Math.max(0, Math.floor((e.offsetX / canvas.clientWidth) * T)));
    const y = (e.offsetY / canvas.clientHeight) * canvas.height, q = y >= above ? T - 1 : Math.floor(y / cw);
    canvas.title = k > q ? `head ${h}: position ${q} may not see ${k}, after it (masked)`
      : q < T - 1 ? `head ${h}: position ${q}'s row: not drawn, the walk keeps the last position's`
      : `head ${h}: the last token looks at position ${k} (${JSON.stringify(tokens[k])}) with weight ${fixed(p(k), 4)}`;
  };
  const p = (k) => row[k];
  return el("figure", { className: "head" }, canvas, el("figcaption", { textContent: `head ${h}` }));
}

let hatching = null;

function hatch() {  // grey diagonal lines: the causal mask
  if (hatching) return hatching;
  hatching = el("canvas", { width: 4, height: 4 });
  const ctx = hatching.getContext("2d");
  ctx.fillStyle = "#f6f8fa";
  ctx.fillRect(0, 0, 4, 4);
  ctx.strokeStyle = "#a8b1bb";
  ctx.beginPath();
  ctx.moveTo(0, 4);
  ctx.lineTo(4, 0);
  ctx.stroke();
  return hatching;
}

// ------------------------------------------------------------------ GELU

const geluTanh = (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
const geluExact = (x) => 0.5 * x * (1 + erf(x / Math.SQRT2));

function erf(x) {  // Abramowitz and Stegun 7.1.26: within 1.5e-7, finer than the picture
  const t = 1 / (1 + 0.3275911 * Math.abs(x));
  const y = 1 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    * Math.exp(-x * x);
  return x < 0 ? -y : y;
}

function chooseGeluBlock(answer) {
  const select = $("walk-gelu-block"), n = answer.model.n_layer;
  const chosen = select.dataset.chosen !== undefined && Number(select.dataset.chosen) < n ? select.dataset.chosen : n - 1;
  select.replaceChildren(...Array.from({ length: n }, (_, i) => el("option", { value: String(i), textContent: `block ${i}` })));
  select.value = String(chosen);
  drawGelu();
}

// GELU's curve, x from -4 to 4 (wider where the values are), and the chosen block's pre-activations
// at the last position as dots at (c_fc, gelu): the model's own two steps, which fall on the curve.
function drawGelu() {
  const answer = state.walk;
  const block = Number($("walk-gelu-block").value);
  const values = (name) => answer.steps.find((s) => s.name === `h.${block}.mlp.${name}`).values;
  const pre = values("c_fc"), post = values("gelu");
  const f = answer.model.activation === "gelu" ? geluExact : geluTanh;
  const lo = Math.min(-4, Math.floor(Math.min(...pre))), hi = Math.max(4, Math.ceil(Math.max(...pre)));
  const W = 380, H = 230, left = 30, top = 12, bottom = 24, right = 10, ylo = -1, yhi = f(hi);
  const sx = (W - left - right) / (hi - lo), sy = (H - top - bottom) / (yhi - ylo);
  const px = (x) => left + (x - lo) * sx, py = (y) => top + (yhi - y) * sy;
  const box = $("walk-gelu");
  for (const [key, value] of Object.entries({ width: W, height: H, viewBox: `0 0 ${W} ${H}` })) box.setAttribute(key, value);
  Object.assign(box.dataset, { lo, yhi, sx, sy, left, top });
  const curve = Array.from({ length: 241 }, (_, i) => lo + ((hi - lo) * i) / 240).map((x) => `${px(x).toFixed(2)},${py(f(x)).toFixed(2)}`);
  box.replaceChildren(
    svg("line", { x1: left, x2: W - right, y1: py(0), y2: py(0), class: "axis" }),
    svg("line", { x1: px(0), x2: px(0), y1: top, y2: H - bottom, class: "axis" }),
    ...[lo, 0, hi].map((x) => svg("text", { x: px(x), y: H - 8, class: "tick", "text-anchor": "middle" }, String(x))),
    svg("text", { x: px(0) - 4, y: top + 8, class: "tick", "text-anchor": "end" }, fixed(yhi, 1)),
    svg("polyline", { points: curve.join(" "), class: "curve gelu" }),
    ...pre.map((x, i) => svg("circle", { cx: px(x).toFixed(2), cy: py(post[i]).toFixed(2), r: 2.5, class: "dot", "data-index": i })),
  );
  const below = pre.filter((x) => x < 0).length;
  $("walk-gelu-caption").textContent = `Block ${block}'s ${pre.length} pre-activations (mlp.c_fc) at the last position, ` +
    `each a dot at (c_fc, gelu): ${below} below 0, squashed towards 0; the rest through, almost unchanged. ` +
    (answer.model.activation === "gelu" ? "GELU(x) = x Φ(x), exact (erf)."
      : "GELU(x) ≈ 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), GPT-2's tanh approximation.");
}

// ------------------------------------------------------------------ LayerNorm

// Each LayerNorm with its input (the spec's relations): ln_1's is the stream entering the block
// (wte + wpe before block 0, the block before's output after), ln_2's that stream plus attention's
// output, ln_f's the last block's output.
function layerNorms(answer) {
  const v = Object.fromEntries(answer.steps.map((s) => [s.name, s.values]));
  const add = (a, b) => a.map((x, j) => x + b[j]);
  const norms = [];
  let stream = add(v.wte, v.wpe);
  for (let i = 0; i < answer.model.n_layer; i++) {
    norms.push({ name: `h.${i}.ln_1`, input: stream, output: v[`h.${i}.ln_1`] });
    norms.push({ name: `h.${i}.ln_2`, input: add(stream, v[`h.${i}.attn.c_proj`]), output: v[`h.${i}.ln_2`] });
    stream = v[`h.${i}`];
  }
  norms.push({ name: "ln_f", input: stream, output: v.ln_f });
  return norms;
}

function drawLayerNorms(answer) {
  $("walk-ln").replaceChildren(...layerNorms(answer).map(({ name, input, output }) => {
    const stats = { inMean: mean(input), inStd: std(input), outMean: mean(output), outStd: std(output) };
    const said = (m, s) => `μ ${fixed(m)}  σ ${fixed(s)}`;
    return el("div", { className: "ln", dataset: { ln: name, ...Object.fromEntries(Object.entries(stats).map(([k, x]) => [k, String(x)])) } },
      el("code", { className: "name", textContent: name }),
      lnPicture(input, output, stats),
      el("span", { className: "stats" }, el("span", { className: "in", textContent: ` in ${said(stats.inMean, stats.inStd)}` }),
        el("span", { className: "out", textContent: `out ${said(stats.outMean, stats.outStd)}` })));
  }));
}

// Input above, output below, on one axis: a tick a value, the mean a stroke, ± one deviation a bar.
function lnPicture(input, output, stats) {
  const W = 200, H = 30, pad = 4;
  const reach = Math.max(...[[stats.inMean, stats.inStd, input], [stats.outMean, stats.outStd, output]]
    .map(([m, s, xs]) => Math.min(largest(xs), Math.abs(m) + 3 * s))) || 1;
  const px = (x) => pad + ((Math.max(-reach, Math.min(reach, x)) + reach) / (2 * reach)) * (W - 2 * pad);
  const track = (xs, m, s, y, cls) => [
    svg("path", { d: xs.map((x) => `M${px(x).toFixed(1)} ${y - 4}v8`).join(""), class: `tick-mark ${cls}` }),
    svg("line", { x1: px(m - s), x2: px(m + s), y1: y, y2: y, class: `spread ${cls}` }),
    svg("line", { x1: px(m), x2: px(m), y1: y - 6, y2: y + 6, class: `mean ${cls}` }),
  ];
  const picture = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "ln-picture", "aria-hidden": "true" });
  picture.append(svg("line", { x1: px(0), x2: px(0), y1: 0, y2: H, class: "zero" }),
    ...track(input, stats.inMean, stats.inStd, 8, "in"), ...track(output, stats.outMean, stats.outStd, 22, "out"));
  return picture;
}

// ------------------------------------------------------------------ the unembedding and the next token

// softmax(logits / T) over all V logits, in float64 with the largest subtracted; the top ten of the
// tokens the server named (the most likely, by logit: a temperature does not change their order).
function drawNext() {
  const answer = state.walk;
  if (!answer) return;
  const temperature = Number($("walk-temperature").value);
  $("walk-temperature-value").textContent = temperature.toFixed(2);
  const logits = answer.steps.find((s) => s.name === "logits").values;
  let top = -Infinity, sum = 0;
  for (const l of logits) top = Math.max(top, l);
  for (const l of logits) sum += Math.exp((l - top) / temperature);
  const prob = (id) => Math.exp((logits[id] - top) / temperature) / sum;
  const shown = answer.next.map((e) => ({ ...e, p: prob(e.id) })).sort((a, b) => b.p - a.p).slice(0, TOP_SHOWN);
  $("walk-next").replaceChildren(...shown.map((e) => {
    const bar = el("span", { className: "fill" });
    bar.style.width = `${(100 * e.p) / shown[0].p}%`;
    return el("li", { dataset: { nextId: String(e.id), prob: String(e.p) }, title: `id ${e.id}, logit ${fixed(e.logit, 4)}` },
      el("code", { className: "token", textContent: answer.tokenizer === null ? e.token : JSON.stringify(e.token) }),
      el("span", { className: "bar" }, bar),
      el("span", { className: "p", textContent: percent(e.p) }));
  }));
  $("walk-next-caption").textContent = `After ${JSON.stringify(answer.tokens[answer.tokens.length - 1])}, at ` +
    `temperature ${temperature.toFixed(2)}: the ${shown.length} most likely of the ${logits.length} tokens, ` +
    "softmax over every logit. Below 1 the distribution sharpens towards the top token; above 1 it flattens.";
}

// ------------------------------------------------------------------ wiring

// Made when the view is first opened, not in the page: their names ("LayerNorm", "Walkthrough
// temperature") would also answer the playground's looser look-ups of "Layer" and "Temperature".
function makeLateControls() {
  const slider = el("input", { id: "walk-temperature", type: "range", min: "0.1", max: "3", step: "0.05", value: "1" });
  slider.addEventListener("input", drawNext);
  $("walk-next-caption").before(el("div", { className: "walk-temperature" },
    el("label", { htmlFor: "walk-temperature", textContent: "Walkthrough temperature" }), slider,
    el("output", { id: "walk-temperature-value", htmlFor: "walk-temperature", textContent: "1.00" })));
  $("walk-ln-card").append(el("div", { id: "walk-ln", className: "walk-ln", role: "group", "aria-label": "LayerNorm" }));
}

// The first time the view is opened: its late controls, and a prompt to start from (the
// playground's, or ids for a model with no tokenizer). Later calls wait for the first.
function shown() {
  state.shown ??= firstShown();
  return state.shown;
}

async function firstShown() {
  makeLateControls();
  try {
    state.readsText = (await send("/tokenizer_info")).ok;
  } catch (_) { /* no server: Walk says so */ }
  if ($("walk-prompt").value === "") {
    $("walk-prompt").value = state.readsText === false ? "1 2 3 4 5 6 1 2 3 4 5"
      : $("prompt").value.trim() || "The quick brown fox jumps over the lazy dog";
  }
}

function start() {
  $("walk-form").addEventListener("submit", walk);
  $("walk-prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {  // Enter walks; Shift+Enter is a new line of the prompt
      e.preventDefault();
      $("walk-form").requestSubmit();
    }
  });
  $("walk-gelu-block").addEventListener("change", () => {
    $("walk-gelu-block").dataset.chosen = $("walk-gelu-block").value;
    drawGelu();
  });
  $("walkthrough").addEventListener("viewshown", shown);
  if (!$("walkthrough").hidden) shown();  // opened by /#walkthrough before this module ran
}

start();
