// The playground: a prompt continued token by token through /v1/completions (streamed, with
// each token's log-probability, alternatives and id), then looked inside through /v1/inspect
// (every head's attention, the logit lens) and through /v1/circuits (every head's scores, a head's
// ablation, activation patching, logit attribution; with transcoders, a prompt's attribution graph and
// its features' contexts); /tokenize counts the prompt's tokens, for the room left in the context. Plain JavaScript, no library: read it top to bottom.

import { $, LOOKS_AT, SCORES, ServerError, call, colour, diverging, failure, send, showError, svg } from "./api.js";

const state = {
  model: null,       // the served model's card from /v1/models
  tokens: [],        // the completion: {id, text, logprob, top} each
  promptIds: null,   // the prompt's token ids, as the server read them
  controller: null,  // aborts the generation in flight (Stop)
  seed: null,        // the seed of the last sampled generation (null for greedy)
  inspection: null,  // /v1/inspect's answer for the prompt and the completion
  query: 0,          // the attention view's chosen row (a position)
  scores: null,      // /v1/circuits/scores' answer: every head's scores on the same text
  pair: null,        // the patching form's texts and answers as the page last set them
};

// ------------------------------------------------------------------ talking to the server

// Server-Sent Events: each "data: {...}" as an object, until "data: [DONE]".
async function* events(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const message = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of message.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        yield JSON.parse(line.slice(6));
      }
    }
  }
}

// An error next to what caused it (api.js's showError): the generation's (and the model's) at the top of the
// page, the Heads', Patch's and Attribute's beside their own buttons, not a screen away.

const say = (message) => { $("status").textContent = message; };
const percent = (p) => `${(100 * p).toFixed(p >= 0.9995 || p < 0.0005 ? 2 : 1)}%`;
const shown = (text) => JSON.stringify(text);  // a token with its spaces and newlines visible

// ------------------------------------------------------------------ the model

async function loadModel() {
  try {
    const models = (await call("/v1/models")).data;
    if (models.length === 0) {  // gpt2 serve --runs without --model: no model, the training runs alone
      $("model-info").textContent = "no model: the server follows training runs";
      for (const button of document.querySelectorAll("#views button")) button.disabled = button.dataset.view !== "training";
      showView("training");
      return;
    }
    const card = models[0];
    if (card.max_model_len === undefined) {  // still loading: /v1/models answers before the model is in
      $("model-info").textContent = `${card.id}: loading the model…`;
      setTimeout(loadModel, 1000);
      return;
    }
    state.model = card;
    $("model-info").textContent = `${card.id} · context ${card.max_model_len} tokens · ${count(card.num_parameters)} parameters`;
    showError("");
    // A model that comes with no tokenizer is served on token ids alone: the page, which reads and writes
    // text, says so (the server's words) and goes no further.
    const info = await send("/tokenizer_info");
    if (!info.ok) {
      showError((await failure(info)).message);
      return;
    }
    showRoom();
    choosePair();
  } catch (e) {
    state.model = null;
    $("model-info").textContent = "no model information";
    showError(e.message);
  }
}

// Max tokens' room: the context less the prompt's tokens, counted by the server as a completion
// reads the prompt (an empty one starts from <|endoftext|>, one token). Each edit asks again; only
// the latest answer is shown.
let roomAsked = 0;

async function showRoom() {
  if (!state.model) return;
  const asked = ++roomAsked;
  let tokens = null;
  try {
    tokens = Math.max(1, (await call("/tokenize", { content: $("prompt").value })).count);
  } catch (_) { /* a character the vocabulary lacks: Generate says which */ }
  if (asked !== roomAsked) return;
  const n_ctx = state.model.max_model_len;
  const room = tokens === null ? null : n_ctx - tokens;
  if (room === null) $("max-tokens").removeAttribute("max");
  else $("max-tokens").max = Math.max(0, room);
  $("room").textContent = room === null ? "" : room < 0 ? `The prompt's ${tokens} tokens are over the context's ${n_ctx}.`
    : `Max tokens: at most ${room} for this prompt (the context's ${n_ctx} tokens less the prompt's ${tokens}).`;
}

function count(n) {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}K`;
  return String(n);
}

// ------------------------------------------------------------------ generating

// The request's settings; a field left empty is the server's default (Top-k: all). A sampled
// run (temperature above 0; the server's default is 1) with no Seed gets one drawn here, which
// the status line shows, so that the run can be repeated.
function settings() {
  const body = { prompt: $("prompt").value, stream: true, logprobs: 5, return_token_ids: true };
  if (state.model) body.model = state.model.id;
  const fields = { "max-tokens": "max_tokens", temperature: "temperature", "top-k": "top_k", "top-p": "top_p", seed: "seed" };
  for (const [id, key] of Object.entries(fields)) {
    const input = $(id);
    if (input.validity.badInput) throw new ServerError(`${input.labels[0].firstChild.textContent.trim()} must be a number`);
    if (input.value.trim() !== "") body[key] = Number(input.value);
  }
  if (body.temperature !== 0 && body.seed === undefined) body.seed = crypto.getRandomValues(new Uint32Array(1))[0];
  return body;
}

async function generate(event) {
  event.preventDefault();
  if (state.controller) return;
  showError("");
  let body;
  try {
    body = settings();
  } catch (e) {
    showError(e.message);
    return;
  }
  clearViews();
  const out = $("completion");
  out.replaceChildren(Object.assign(document.createElement("span"), { className: "prompt", textContent: body.prompt }));
  state.tokens = [];
  state.promptIds = null;
  state.seed = body.temperature === 0 ? null : body.seed;
  state.controller = new AbortController();
  busy(true);
  say("generating…");
  let finish = null;
  try {
    const response = await send("/v1/completions", { method: "POST", body: JSON.stringify(body), signal: state.controller.signal });
    if (!response.ok) throw await failure(response);
    for await (const chunk of events(response.body)) {
      if (chunk.error) throw new ServerError(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      if (choice.prompt_token_ids) state.promptIds = choice.prompt_token_ids;
      addTokens(choice);
      finish = choice.finish_reason || finish;
    }
    say(`${state.tokens.length} token${state.tokens.length === 1 ? "" : "s"}; ${finish === "stop" ? "the model ended the text" : "Max tokens reached"}${seedNote()}`);
  } catch (e) {
    if (e.name !== "AbortError") {
      showError(e.message);
      say("");
    } else {
      say(`stopped after ${state.tokens.length} tokens${seedNote()}`);
    }
  } finally {
    state.controller = null;
    busy(false);
  }
  if (state.promptIds) await inspect([...state.promptIds, ...state.tokens.map((t) => t.id)]);
}

// The views that wait for a generation say so until there is one to show.
function waiting() {
  for (const note of document.querySelectorAll(".waiting")) note.hidden = state.inspection !== null;
}

const seedNote = () => (state.seed === null ? "" : `; seed ${state.seed} (type it in Seed to repeat this run)`);

function busy(on) {
  $("generate").disabled = on;
  $("stop").disabled = !on;
}

function stop() {
  if (state.controller) state.controller.abort();
}

// One chunk's tokens: usually one; more where a token ended half a character, which the
// server holds back until the character is whole (its text then comes with the next token).
// The end of the text (<|endoftext|>) is listed among the tokens but is not in the text: it is
// drawn as a mark of its own.
const END = "<|endoftext|>";

function addTokens(choice) {
  const lp = choice.logprobs;
  if (!lp) return;
  const texts = lp.tokens.filter((t) => t !== END);
  const whole = texts.every((t) => !t.startsWith("bytes:")) && texts.join("") === choice.text;
  lp.tokens.forEach((text, i) => {
    const end = text === END;
    const token = { id: choice.token_ids[i], text: end ? "" : whole ? text : i === 0 ? choice.text : "", end,
                    logprob: lp.token_logprobs[i], top: lp.top_logprobs[i] };
    state.tokens.push(token);
    $("completion").append(tokenElement(token, state.tokens.length === 1));
  });
}

function tokenElement(token, first) {
  const span = document.createElement("span");
  span.className = token.end ? "token end" : token.text.includes("\n") ? "token newline" : "token";  // marks to point at
  if (token.end) span.title = "the model ended the text here (<|endoftext|>)";
  span.textContent = token.text;
  span.tabIndex = first ? 0 : -1;  // one tab stop for the completion: the arrow keys move within it
  span.dataset.tokenId = token.id;
  span.dataset.logprob = token.logprob;
  span.style.backgroundColor = `hsl(${Math.round(120 * Math.exp(token.logprob))}, 75%, 82%)`;
  const show = () => showTip(span, token);
  span.addEventListener("mouseenter", show);
  span.addEventListener("focus", show);
  span.addEventListener("mouseleave", hideTip);
  span.addEventListener("blur", hideTip);
  return span;
}

// The arrow keys move between the completion's tokens; Escape hides the alternatives.
function moveInCompletion(event) {
  const tokens = [...$("completion").querySelectorAll(".token")];
  const at = tokens.indexOf(document.activeElement);
  if (event.key === "Escape") return hideTip();
  const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1, Home: -Infinity, End: Infinity }[event.key];
  if (at < 0 || step === undefined) return;
  event.preventDefault();
  const next = tokens[Math.max(0, Math.min(tokens.length - 1, at + step))];
  tokens[at].tabIndex = -1;
  next.tabIndex = 0;
  next.focus();
}

function showTip(span, token) {
  const tip = $("tip");
  const rows = Object.entries(token.top || {}).sort((a, b) => b[1] - a[1]);
  const table = document.createElement("table");
  for (const [text, logprob] of rows) {
    const row = table.insertRow();
    if (token.end ? text === END : text === token.text || (token.text === "" && text.startsWith("bytes:"))) row.className = "chosen";
    row.insertCell().textContent = shown(text);
    Object.assign(row.insertCell(), { className: "p", textContent: percent(Math.exp(logprob)) });
  }
  const head = document.createElement("div");
  head.textContent = `${shown(token.end ? END : token.text)} (id ${token.id}): ${percent(Math.exp(token.logprob))}; the model's top choices:`;
  tip.replaceChildren(head, table);
  tip.hidden = false;
  const box = span.getBoundingClientRect();
  tip.style.left = `${Math.max(4, Math.min(window.scrollX + box.left, window.scrollX + innerWidth - tip.offsetWidth - 4))}px`;
  tip.style.top = `${window.scrollY + box.bottom + 6}px`;
  span.setAttribute("aria-describedby", "tip");
}

function hideTip() {
  $("tip").hidden = true;
}

// ------------------------------------------------------------------ looking inside

async function inspect(ids) {
  const done = $("status").textContent;  // the generation's summary, shown again once the views are in
  say(`${done}; looking inside…`);
  try {
    state.inspection = await call("/v1/inspect", { ...(state.model ? { model: state.model.id } : {}), prompt: ids, top_k: 5 });
  } catch (e) {
    showError(`Attention and logit lens: ${e.message}`);
    return;
  } finally {
    say(done);
  }
  state.query = ids.length - 1;
  waiting();
  fillSelects();
  drawAttention();
  drawLens();
  await drawHeadGrid();
  await attribute();
}

function clearViews() {
  state.inspection = null;
  state.scores = null;
  waiting();
  for (const id of ["layer", "head"]) $(id).disabled = true;
  const canvas = $("attention");
  canvas.width = canvas.height = 0;
  canvas.style.width = canvas.style.height = "0px";
  $("attention-readout").textContent = "";
  $("attention-legend").hidden = true;
  $("lens").replaceChildren();
  delete $("lens-frame").dataset.columns;
  scrollCue("lens");
  for (const id of ["head-grid", "ablation"]) $(id).replaceChildren();
  $("head-scores").textContent = "";
  $("heads-legend").hidden = true;
  for (const id of ["heads-error", "attribution-error"]) showError("", id);
  clearAttribution();
}

function fillSelects() {
  const { attention } = state.inspection;
  const options = (select, values) => {
    const kept = select.value;
    select.replaceChildren(...values.map(([value, text]) => new Option(text, value)));
    if (values.some(([value]) => value === kept)) select.value = kept;
    select.disabled = false;
  };
  options($("layer"), attention.map((_, i) => [String(i), `layer ${i}`]));
  options($("head"), [["all", "all heads"], ...attention[0].map((_, i) => [String(i), `head ${i}`])]);
}

const label = (i) => { const t = shown(state.inspection.tokens[i]); return t.length > 14 ? `${t.slice(0, 13)}…` : t; };

// White for 0 to dark blue for 1: a probability p is the pixel's red 255 - 247 p.

// One head is drawn as it is. The thumbnails of "all heads" are small, and most weights are small
// too (a token looking evenly at 40 others gives each 2.5%, which is 2.5% colour): there a weight
// p is drawn as sqrt(p), so that 1 is full colour, 0.25 half, 0.04 a fifth, 0.01 still a tenth.
const SCALES = {
  head: { ink: (p) => p, words: "linear: the colour is the weight" },
  all: { ink: Math.sqrt, words: "square-root scale, so that small weights show: the colour is √weight" },
};

function legend(view) {
  const { ink, words } = SCALES[view];
  key($("attention-legend"), [0, 0.01, 0.04, 0.25, 1], ink, `(${words})`);
}

// A key of colours: a swatch for each value, drawn as colour(ink(value)), then the words.
function key(out, values, ink, words) {
  const swatches = values.flatMap((p) => {
    const swatch = Object.assign(document.createElement("span"), { className: "swatch" });
    swatch.style.backgroundColor = colour(ink(p));
    return [swatch, ` ${p} `];
  });
  out.replaceChildren("Colour: ", ...swatches, words);
  out.hidden = false;
}

// A canvas of css pixels width x height, sharp on a high-density screen.
function sized(canvas, width, height) {
  const scale = window.devicePixelRatio || 1;
  canvas.width = Math.ceil(width * scale);
  canvas.height = Math.ceil(height * scale);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  canvas.dataset.scale = scale;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(scale, 0, 0, scale, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  return ctx;
}

function drawAttention() {
  if (!state.inspection) return;
  const layer = Number($("layer").value);
  const head = $("head").value;
  const canvas = $("attention");
  Object.assign(canvas.dataset, { layer, head });
  const room = Math.max(260, canvas.parentElement.clientWidth - 4);
  if (head === "all") drawHeads(canvas, state.inspection.attention[layer], layer, room);
  else drawHead(canvas, state.inspection.attention[layer][Number(head)], room);
  legend(canvas.dataset.view);
  readout();
}

// One head: a row per token (the query), a column per token it may attend to (the keys).
function drawHead(canvas, pattern, room) {
  const T = pattern.length;
  const probe = canvas.getContext("2d");
  probe.font = "12px ui-monospace, Menlo, Consolas, monospace";
  const margin = Math.min(130, 8 + Math.max(...state.inspection.tokens.map((_, i) => probe.measureText(label(i)).width)));
  const cell = Math.max(3, Math.min(28, Math.floor((room - margin) / T)));
  const labelled = cell >= 9;
  const left = labelled ? margin : 0;
  const top = labelled ? margin : 0;
  const ctx = sized(canvas, left + T * cell, top + T * cell);
  Object.assign(canvas.dataset, { view: "head", cell, left, top, tokens: T });
  pattern.forEach((row, q) => row.forEach((p, k) => {
    ctx.fillStyle = colour(SCALES.head.ink(p));
    ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
  }));
  if (labelled) {
    ctx.font = "12px ui-monospace, Menlo, Consolas, monospace";
    ctx.fillStyle = "#1b1f24";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (let i = 0; i < T; i++) ctx.fillText(label(i), left - 4, top + (i + 0.5) * cell, margin - 8);
    ctx.save();
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    for (let i = 0; i < T; i++) ctx.fillText(label(i), -top + 4, left + (i + 0.5) * cell, margin - 8);
    ctx.restore();
  }
  ctx.strokeStyle = "#f0a020";
  ctx.lineWidth = 2;
  ctx.strokeRect(left + 1, top + state.query * cell + 1, T * cell - 2, cell - 2);  // the chosen row
}

// Every head of a layer, small, side by side, each titled with its layer and head: click one to look at it alone.
function drawHeads(canvas, heads, layer, room) {
  const T = heads[0].length;
  const gap = 10;
  const title = 16;
  const columns = Math.max(1, Math.min(heads.length, Math.floor((room + gap) / 120)));
  const panel = Math.floor((room - (columns - 1) * gap) / columns);
  const rows = Math.ceil(heads.length / columns);
  const ctx = sized(canvas, columns * panel + (columns - 1) * gap, rows * (panel + title + gap));
  Object.assign(canvas.dataset, { view: "all", panel, gap, title, columns, tokens: T });
  const cell = panel / T;
  ctx.font = "12px system-ui, sans-serif";
  heads.forEach((pattern, h) => {
    const x = (h % columns) * (panel + gap);
    const y = Math.floor(h / columns) * (panel + title + gap);
    ctx.fillStyle = "#1b1f24";
    ctx.fillText(`layer ${layer}, head ${h}`, x, y + 12, panel);
    pattern.forEach((row, q) => row.forEach((p, k) => {
      ctx.fillStyle = colour(SCALES.all.ink(p));
      ctx.fillRect(x + k * cell, y + title + q * cell, Math.ceil(cell), Math.ceil(cell));
    }));
    ctx.strokeStyle = "#d0d7de";
    ctx.strokeRect(x + 0.5, y + title + 0.5, panel - 1, panel - 1);
  });
}

// Where the chosen token looks, in words: its five largest attention weights.
function readout() {
  const head = $("head").value;
  const out = $("attention-readout");
  if (head === "all") {
    out.textContent = `layer ${$("layer").value}: every head, each row a token looking back. Choose a head, or click one.`;
    return;
  }
  const row = state.inspection.attention[Number($("layer").value)][Number(head)][state.query];
  const top = row.map((p, k) => [p, k]).filter(([, k]) => k <= state.query).sort((a, b) => b[0] - a[0]).slice(0, 5);
  out.textContent = `${label(state.query)} (position ${state.query}) attends to ` +
    top.map(([p, k]) => `${label(k)} (${k}) ${percent(p)}`).join(", ");
}

function pointAtAttention(event) {
  const canvas = $("attention");
  if (!state.inspection) return;
  const box = canvas.getBoundingClientRect();
  const x = event.clientX - box.left;
  const y = event.clientY - box.top;
  const d = canvas.dataset;
  if (d.view === "all") {
    if (event.type !== "click") return;
    const column = Math.floor(x / (Number(d.panel) + Number(d.gap)));
    const row = Math.floor(y / (Number(d.panel) + Number(d.title) + Number(d.gap)));
    const h = row * Number(d.columns) + column;
    if (column < Number(d.columns) && h < state.inspection.attention[0].length) {
      $("head").value = String(h);
      drawAttention();
    }
    return;
  }
  const q = Math.floor((y - Number(d.top)) / Number(d.cell));
  if (q >= 0 && q < Number(d.tokens) && q !== state.query) {
    state.query = q;
    drawAttention();
  }
}

function keyOnAttention(event) {
  if (!state.inspection || $("head").value === "all") return;
  const step = { ArrowDown: 1, ArrowUp: -1, Home: -Infinity, End: Infinity }[event.key];
  if (step === undefined) return;
  event.preventDefault();
  state.query = Math.max(0, Math.min(state.inspection.tokens.length - 1, state.query + step));
  drawAttention();
}

const th = (text, fields = {}) => Object.assign(document.createElement("th"), { textContent: text, ...fields });

// The logit lens: a row per layer (the output on top), a column per position. A column's header is
// the token there, and its cells predict the token after it, as the line above the headers says.
function drawLens() {
  const { logit_lens: lens, tokens } = state.inspection;
  const table = $("lens");
  table.replaceChildren();
  const thead = table.createTHead();
  const axis = th("", { colSpan: tokens.length, className: "axis" });
  axis.append(Object.assign(document.createElement("span"), { textContent: "predicting the token after ↓" }));
  const corner = th("", { className: "corner" });
  thead.insertRow().append(corner, axis);
  const head = thead.insertRow();
  head.append(th("layer", { scope: "col", className: "corner" }));
  tokens.forEach((_, i) => head.append(th(label(i), { scope: "col", title: `position ${i}: ${shown(tokens[i])}` })));
  const body = table.createTBody();
  for (let layer = lens.length - 1; layer >= 0; layer--) {
    const row = body.insertRow();
    const name = layer === lens.length - 1 ? "output" : `block ${layer} in`;
    row.append(Object.assign(document.createElement("th"), { scope: "row", textContent: name }));
    lens[layer].forEach((top, position) => {
      const cell = row.insertCell();
      cell.textContent = `${shown(top.token).slice(0, 10)}\n${percent(top.prob)}`;
      cell.title = `${name}, predicting the token after ${shown(tokens[position])}: ${shown(top.token)} ${percent(top.prob)}`;
      Object.assign(cell.dataset, { layer, position, tokenId: top.id, prob: top.prob });
      cell.style.backgroundColor = colour(top.prob);
      cell.style.color = top.prob > 0.5 ? "#fff" : "#1b1f24";
    });
  }
  axis.firstChild.style.left = `${corner.offsetWidth}px`;
  $("lens-frame").dataset.columns = tokens.length;
  $("lens-scroll").scrollLeft = 0;
  scrollCue("lens");
}

// The logit lens and the patching grid are often wider than their boxes (`name`-scroll): then a
// line above says so (`name`-cue), and the right edge fades while there is more to that side (the
// row names stay put, sticky, as the columns scroll). The frame holds the table's column count.
function scrollCue(name) {
  const box = $(`${name}-scroll`);
  const frame = $(`${name}-frame`);
  const hidden = box.scrollWidth - box.clientWidth;
  const cue = $(`${name}-cue`);
  cue.hidden = hidden <= 1 || !frame.dataset.columns;
  if (!cue.hidden) cue.textContent = `${frame.dataset.columns} columns, wider than this box: scroll sideways →`;
  frame.classList.toggle("more-right", box.scrollLeft < hidden - 1);
}

// ------------------------------------------------------------------ circuits (/v1/circuits)

const modelField = () => (state.model ? { model: state.model.id } : {});
function svgSize(element, width, height) {
  element.setAttribute("width", width);
  element.setAttribute("height", height);
}
const fixed = (x) => (x < 0 ? "−" : "") + Math.abs(x).toFixed(3);
// A probability with three significant digits: a random model's are all near 1 / 50257.
const precise = (p) => `${(100 * p).toPrecision(3)}%`;

// The heads as a heat map, a row per layer and a column per head, each square coloured by the
// chosen score of that head on the text (/v1/circuits/scores), as the attention is: white 0, dark
// blue 1. Each square is a button: a click asks for the head's scores and its ablation.
async function drawHeadGrid() {
  const { attention, ids } = state.inspection;
  const grid = $("head-grid");
  grid.style.gridTemplateColumns = `auto repeat(${attention[0].length}, auto)`;
  grid.replaceChildren(Object.assign(document.createElement("span"), { textContent: "head" }),
    ...attention[0].map((_, head) => Object.assign(document.createElement("span"), { className: "column", textContent: head })));
  attention.forEach((heads, layer) => {
    grid.append(Object.assign(document.createElement("span"), { textContent: `layer ${layer}` }));
    heads.forEach((_, head) => {
      const button = Object.assign(document.createElement("button"), { type: "button" });
      button.setAttribute("aria-label", `L${layer} H${head}`);  // not "layer", "head": the attention view's labels
      button.setAttribute("aria-pressed", "false");
      Object.assign(button.dataset, { layer, head });
      button.addEventListener("click", () => lookAtHead(button, layer, head));
      grid.append(button);
    });
  });
  let scores;
  try {
    scores = (await call("/v1/circuits/scores", { ...modelField(), prompt: ids })).scores;
  } catch (e) {
    showError(e.message, "heads-error");
    return;
  }
  if (state.inspection === null || state.inspection.ids !== ids) return;  // a newer generation cleared the map meanwhile
  state.scores = scores;
  paintHeads();
}

// Colour the heat map by the score chosen; a kind the text gives nothing to (no token repeats) is grey.
function paintHeads() {
  if (!state.scores) return;
  const kind = $("score-kind").value;
  const scores = state.scores[kind];
  for (const button of $("head-grid").querySelectorAll("button")) {
    const { layer, head } = button.dataset;
    const score = scores === null ? null : scores[Number(layer)][Number(head)];
    button.style.backgroundColor = score === null ? "#d0d7de" : colour(score);
    button.dataset.score = score === null ? "" : score;
    button.title = `layer ${layer}, head ${head}: ${SCORES[kind]} ${score === null ? "— (no token repeats)" : score.toFixed(3)}`;
  }
  const words = scores === null ? `no ${SCORES[kind]} score: no token of the text repeats (grey)`
    : `the ${SCORES[kind]} score, the head's mean attention to ${LOOKS_AT[kind]}`;
  key($("heads-legend"), [0, 0.25, 0.5, 0.75, 1], (p) => p, `(${words})`);
}

async function lookAtHead(button, layer, head) {
  for (const other of $("head-grid").querySelectorAll("button")) other.setAttribute("aria-pressed", String(other === button));
  let answer;
  try {
    answer = await call("/v1/circuits/head", { ...modelField(), prompt: state.inspection.ids, layer, head, top_k: 5 });
  } catch (e) {
    showError(e.message, "heads-error");
    return;
  }
  showError("", "heads-error");
  $("head-scores").textContent = `layer ${layer} head ${head}: ` + Object.entries(answer.scores)
    .map(([kind, score]) => `${SCORES[kind]} ${score === null ? "— (no token repeats)" : score.toFixed(3)}`).join(" · ");
  Object.assign($("head-scores").dataset, { layer, head });
  const table = $("ablation");
  table.replaceChildren();
  const top = table.createTHead().insertRow();
  for (const name of ["next token", "before", `head ${layer}.${head} zeroed`, "change"]) top.append(th(name, { scope: "col" }));
  const body = table.createTBody();
  for (const e of answer.next) {
    const row = body.insertRow();
    Object.assign(row.dataset, { tokenId: e.id, before: e.before, after: e.after });
    row.append(th(shown(e.token), { scope: "row" }));
    for (const text of [precise(e.before), precise(e.after)]) row.insertCell().textContent = text;
    const change = row.insertCell();
    change.textContent = `${e.after >= e.before ? "+" : "−"}${(100 * Math.abs(e.after - e.before)).toPrecision(3)} pts`;
    change.style.color = e.after >= e.before ? "#0b5cad" : "#b42318";
  }
}

// The patching form's first texts: the first pair whose answers are one token each of the served
// model's vocabulary and whose texts are of one length: the IOI prompts for GPT-2's; a pair whose
// next character differs (an earlier name copied) for a character model, where " Mary" is 5 tokens.
const PAIRS = [
  { clean: "When Mary and John went to the store, John gave a drink to", corrupted: "When Mary and John went to the store, Mary gave a drink to",
    answer: " Mary", other: " John" },
  { clean: "Romeo met Juliet; then Romeo kissed J", corrupted: "Romeo met Juliet; then Romeo kissed R", answer: "u", other: "o" },
];
const PAIR_FIELDS = ["clean", "corrupted", "answer", "other"];

function setPair(pair) {
  for (const id of PAIR_FIELDS) $(id).value = pair[id];
  state.pair = pair;
}

async function choosePair() {
  const untouched = () => PAIR_FIELDS.every((id) => $(id).value === state.pair[id]);  // a person's own texts stay
  for (const pair of PAIRS) {
    let counts;
    try {
      counts = await Promise.all(PAIR_FIELDS.map(async (id) => (await call("/tokenize", { content: pair[id] })).count));
    } catch (_) {
      continue;  // a character the vocabulary lacks
    }
    const [clean, corrupted, answer, other] = counts;
    if (clean === corrupted && clean <= state.model.max_model_len && answer === 1 && other === 1) {
      if (untouched()) setPair(pair);
      return;
    }
  }
}

// Patching: the two texts, the answer tokens and the site from the form; the grid as a table. A
// refusal clears the grid before, which is not of these texts.
async function patch(event) {
  event.preventDefault();
  const body = { ...modelField(), clean: $("clean").value, corrupted: $("corrupted").value, site: $("site").value };
  for (const id of ["answer", "other"]) if ($(id).value !== "") body[id] = $(id).value;
  let answer;
  $("patch").disabled = true;
  try {
    answer = await call("/v1/circuits/patching", body);
  } catch (e) {
    showError(e.message, "patching-error");
    clearPatching();
    return;
  } finally {
    $("patch").disabled = false;
  }
  showError("", "patching-error");
  drawPatching(answer);
}

function clearPatching() {
  $("patching").replaceChildren();
  $("patching-summary").textContent = "";
  delete $("patching-frame").dataset.columns;
  scrollCue("patching");
}

function drawPatching(answer) {
  const { clean, corrupted, grid, axes } = answer;
  const span = clean.logit_diff - corrupted.logit_diff;
  $("patching-summary").textContent = `logit(${shown(answer.answer.token)}) − logit(${shown(answer.other.token)}) at the ` +
    `last token: clean ${fixed(clean.logit_diff)}, corrupted ${fixed(corrupted.logit_diff)}; each cell, the corrupted run ` +
    `patched (${answer.site}), coloured by how much of the way to clean it goes.`;
  const table = $("patching");
  table.replaceChildren();
  const top = table.createTHead().insertRow();
  top.append(th("layer", { scope: "col" }));
  grid[0].forEach((_, i) => {
    const name = axes[1] === "head" ? `head ${i}` : shown(clean.tokens[i]);
    const differs = axes[1] === "position" && clean.ids[i] !== corrupted.ids[i];
    top.append(th(differs ? `${name}→${shown(corrupted.tokens[i])}` : name, { scope: "col" }));
  });
  const body = table.createTBody();
  grid.forEach((values, layer) => {
    const row = body.insertRow();
    row.append(th(String(layer), { scope: "row" }));
    values.forEach((value, i) => {
      const cell = row.insertCell();
      cell.textContent = fixed(value);
      Object.assign(cell.dataset, { layer, index: i, value });
      const share = span === 0 ? 0 : (value - corrupted.logit_diff) / span;
      cell.style.backgroundColor = diverging(share);
      cell.style.color = Math.abs(share) > 0.6 ? "#fff" : "#1b1f24";
      cell.title = `layer ${layer}, ${axes[1]} ${i}: ${fixed(value)} (${(100 * share).toFixed(0)}% of the way from corrupted to clean)`;
    });
  });
  $("patching-frame").dataset.columns = grid[0].length;
  $("patching-scroll").scrollLeft = 0;
  scrollCue("patching");
}

// Logit attribution of the next token after the text: the prompt and its completion once generated,
// before that the prompt as it stands. A bar per part, from a zero line.
async function attribute(event) {
  if (event) event.preventDefault();
  const body = { ...modelField(), prompt: state.inspection ? state.inspection.ids : $("prompt").value };
  for (const [id, key] of [["attribution-answer", "answer"], ["attribution-other", "other"]]) if ($(id).value !== "") body[key] = $(id).value;
  let answer;
  try {
    answer = await call("/v1/circuits/attribution", body);
  } catch (e) {
    showError(e.message, "attribution-error");
    clearAttribution();
    return;
  }
  showError("", "attribution-error");
  drawAttribution(answer);
}

function clearAttribution() {
  $("attribution").replaceChildren();
  $("attribution-summary").textContent = "";
  svgSize($("attribution"), 0, 0);
}

const MOST_BARS = 30;

function attributionParts(answer) {
  const parts = [];
  answer.heads.forEach((heads, l) => heads.forEach((value, h) => parts.push([`head ${l}.${h}`, value])));
  answer.mlps.forEach((value, l) => parts.push([`mlp ${l}`, value]));
  parts.push(["embed", answer.embed]);
  answer.biases.forEach((value, l) => parts.push([l < answer.mlps.length ? `attn bias ${l}` : "ln_f bias", value]));
  return parts;
}

function drawAttribution(answer) {
  const parts = attributionParts(answer);
  const kept = parts.length <= MOST_BARS ? parts
    : parts.filter(([, v]) => Math.abs(v) >= [...parts].map(([, x]) => Math.abs(x)).sort((a, b) => b - a)[MOST_BARS - 1]).slice(0, MOST_BARS);
  const rest = parts.filter((p) => !kept.includes(p)).reduce((sum, [, v]) => sum + v, 0);
  const what = answer.other ? `logit(${shown(answer.answer.token)}) − logit(${shown(answer.other.token)})` : `logit(${shown(answer.answer.token)})`;
  const last = answer.tokens.length - 1;  // the position attributed: the next token is predicted there
  $("attribution-summary").textContent = `${what} for the next token, after position ${last} (${shown(answer.tokens[last])}, the ` +
    `last of ${state.inspection ? "the text" : "the prompt as it stands"}) = ${fixed(answer.total)}` +
    (kept.length < parts.length ? `; the ${kept.length} largest of ${parts.length} parts (the rest sum to ${fixed(rest)})` : "");
  const chart = $("attribution");
  const row = 16, label = 90, half = 160, width = label + 2 * half + 60;
  chart.replaceChildren();
  svgSize(chart, width, kept.length * row + 4);
  const most = Math.max(...kept.map(([, v]) => Math.abs(v))) || 1;
  const zero = label + half;
  kept.forEach(([name, value], i) => {
    const y = i * row + 2;
    const length = (half * Math.abs(value)) / most;
    chart.append(Object.assign(svg("text", { x: label - 6, y: y + 11, "text-anchor": "end" }), { textContent: name }));
    const bar = svg("rect", { x: value >= 0 ? zero : zero - length, y: y + 2, width: length, height: row - 4,
                              fill: value >= 0 ? "#0b5cad" : "#b42318" });
    Object.assign(bar.dataset, { name, value });
    bar.append(Object.assign(svg("title"), { textContent: `${name}: ${fixed(value)}` }));
    chart.append(bar);
    chart.append(Object.assign(svg("text", { x: zero + (value >= 0 ? length + 4 : 4), y: y + 11 }), { textContent: fixed(value) }));
  });
  chart.append(svg("line", { x1: zero, x2: zero, y1: 0, y2: kept.length * row + 4, stroke: "#57606a" }));
}

// ------------------------------------------------------------------ the attribution graph (/v1/circuits/graph)

// circuit-tracer's node kinds (feature_type) in the page's words.
const KIND = { "cross layer transcoder": "feature", "mlp reconstruction error": "error", embedding: "token", logit: "logit" };
const GRAPH = { left: 76, right: 24, top: 84, bottom: 84, row: 64, column: 56, spot: 14 };  // pixels
let featureAsked = 0;  // only the latest click's contexts are shown

// The graph of the Graph prompt (empty: the prompt above), drawn; a refusal (a server with no
// transcoders, a prompt too long) beside the button, clearing the graph before it.
async function drawGraphOf(event) {
  event.preventDefault();
  const body = { ...modelField(), prompt: $("graph-prompt").value || $("prompt").value };
  $("draw-graph").disabled = true;
  $("graph-summary").textContent = "computing the graph…";
  let answer;
  try {
    answer = await call("/v1/circuits/graph", body);
  } catch (e) {
    showError(e.message, "graph-error");
    clearGraph();
    return;
  } finally {
    $("draw-graph").disabled = false;
  }
  showError("", "graph-error");
  clearGraph();
  drawGraph(answer);
}

function clearGraph() {
  $("graph").replaceChildren();
  svgSize($("graph"), 0, 0);
  $("graph-summary").textContent = "";
  featureAsked++;
  showError("", "feature-error");
  $("feature-summary").textContent = "";
  $("feature-contexts").replaceChildren();
}

// A node's row: the tokens (E) 0, block l's features and errors l + 1, the logits n_layer + 1 (their "layer").
const graphRow = (node) => (node.feature_type === "embedding" ? 0 : node.feature_type === "logit" ? Number(node.layer) : Number(node.layer) + 1);
const featureOf = (node) => node.node_id.split("_").map(Number);  // circuit-tracer's "{layer}_{feature}_{position}"

// Each node's place: its row and its position's column, as wide as its most crowded cell needs; the
// nodes of one cell side by side (features by index, the error last), the logits along the top row,
// the most probable above the last position.
function placeNodes(nodes, T) {
  const cells = new Map();
  for (const node of nodes) {
    const key = node.feature_type === "logit" ? "logits" : `${graphRow(node)},${node.ctx_idx}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(node);
  }
  const widths = Array(T).fill(GRAPH.column);
  for (const [key, cell] of cells) {
    if (key !== "logits") widths[cell[0].ctx_idx] = Math.max(widths[cell[0].ctx_idx], (cell.length + 1) * GRAPH.spot);
  }
  const starts = widths.map((_, p) => GRAPH.left + widths.slice(0, p).reduce((a, b) => a + b, 0));
  const centre = (p) => starts[p] + widths[p] / 2;
  const rows = Math.max(...nodes.map(graphRow)) + 1;
  const y = (row) => GRAPH.top + (rows - 1 - row) * GRAPH.row;
  const places = new Map();
  for (const [key, cell] of cells) {
    if (key === "logits") {
      cell.sort((a, b) => b.token_prob - a.token_prob);
      const step = Math.min(40, (centre(T - 1) - GRAPH.left) / Math.max(1, cell.length - 1));
      cell.forEach((node, i) => places.set(node.node_id, [centre(T - 1) - i * step, y(graphRow(node))]));
      continue;
    }
    const order = (node) => (node.feature_type === "cross layer transcoder" ? featureOf(node)[1] : Infinity);
    cell.sort((a, b) => order(a) - order(b));
    const p = cell[0].ctx_idx;
    cell.forEach((node, i) => places.set(node.node_id, [starts[p] + ((i + 1) * widths[p]) / (cell.length + 1), y(graphRow(node))]));
  }
  const width = starts[T - 1] + widths[T - 1] + GRAPH.right;
  return { places, centre, rows, width, height: GRAPH.top + (rows - 1) * GRAPH.row + GRAPH.bottom, y };
}

function nodeTitle(node, tokens) {
  const at = `position ${node.ctx_idx} (${shown(tokens[node.ctx_idx])})`;
  const influence = node.influence === null ? "" : `; cumulative influence ${fixed(node.influence)}`;
  const kind = KIND[node.feature_type];
  if (kind === "feature") {
    const [layer, feature] = featureOf(node);
    return `feature ${feature} of layer ${layer}'s transcoder, ${at}: activation ${fixed(node.activation)}${influence} (click for its contexts)`;
  }
  if (kind === "error") return `error of layer ${node.layer}'s transcoder (what it misses of the MLP), ${at}${influence}`;
  if (kind === "token") return `token ${shown(tokens[node.ctx_idx])}, layer E (the embeddings), ${at}${influence}`;
  return `logit, layer ${node.layer} (the output), after ${at}: ${node.clerp}`;
}

// The node's mark: a circle for a feature (purple) or a logit (green), a grey square for an error,
// a box for a token; a <title> says what it is. A feature is a button: its contexts.
function nodeElement(node, x, y, tokens) {
  const kind = KIND[node.feature_type] || "feature";
  const g = svg("g", { class: `node ${kind}`, "data-node-id": node.node_id });
  const shape = kind === "error" ? svg("rect", { x: x - 4.5, y: y - 4.5, width: 9, height: 9, fill: "#8c959f" })
    : kind === "token" ? svg("rect", { x: x - 7, y: y - 5, width: 14, height: 10, rx: 2, fill: "#d0d7de", stroke: "#57606a" })
    : svg("circle", { cx: x, cy: y, r: kind === "logit" ? 6 : 5, fill: kind === "logit" ? "#1a7f37" : "#8250df", stroke: "#fff" });
  g.append(shape, Object.assign(svg("title"), { textContent: nodeTitle(node, tokens) }));
  if (kind === "feature") {
    const [layer, feature] = featureOf(node);
    g.setAttribute("tabindex", "0");
    g.setAttribute("role", "button");
    g.setAttribute("aria-label", `feature ${feature} (L${layer}, position ${node.ctx_idx})`);  // not "layer": the attention view's label
    g.addEventListener("click", () => showFeature(g, layer, feature));
    g.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        showFeature(g, layer, feature);
      }
    });
  }
  return g;
}

const clipped = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

function drawGraph(answer) {
  const { nodes, links, metadata } = answer;
  const tokens = metadata.prompt_tokens;
  const T = tokens.length;
  const { places, centre, rows, width, height, y } = placeNodes(nodes, T);
  const chart = $("graph");
  svgSize(chart, width, height);
  for (let row = 0; row < rows; row++) {  // the rows' names, at the left
    const name = row === 0 ? "tokens" : row === rows - 1 ? "logits" : `layer ${row - 1}`;
    chart.append(Object.assign(svg("text", { x: GRAPH.left - 10, y: y(row) + 4, "text-anchor": "end", class: "axis" }), { textContent: name }));
  }
  tokens.forEach((token, i) => {  // the prompt along the bottom, a token under its column
    const x = centre(i), ty = y(0) + 20;
    const text = svg("text", { x, y: ty, "text-anchor": "end", transform: `rotate(-35 ${x} ${ty})`, "data-position": i });
    chart.append(Object.assign(text, { textContent: clipped(shown(token), 14) }));
  });
  const most = Math.max(...links.map((link) => Math.abs(link.weight)), 1e-12);
  for (const link of links) {  // under the nodes
    const [x1, y1] = places.get(link.source), [x2, y2] = places.get(link.target);
    const share = Math.abs(link.weight) / most;
    const line = svg("line", { x1, y1, x2, y2, class: "edge", stroke: link.weight >= 0 ? "#0b5cad" : "#b42318",
                               "stroke-width": (0.5 + 3.5 * share).toFixed(2), "stroke-opacity": (0.25 + 0.6 * share).toFixed(2),
                               "data-source": link.source, "data-target": link.target, "data-weight": link.weight });
    line.append(Object.assign(svg("title"), { textContent: `${link.source} → ${link.target}: ${fixed(link.weight)}` }));
    chart.append(line);
  }
  for (const node of nodes) {
    const [x, ny] = places.get(node.node_id);
    chart.append(nodeElement(node, x, ny, tokens));
    if (node.feature_type === "logit") {  // the next token each logit is, above it
      const text = svg("text", { x: x + 2, y: ny - 10, transform: `rotate(-35 ${x + 2} ${ny - 10})` });
      const said = /^Output (.*) \(p=[\d.]+\)$/.exec(node.clerp);  // circuit-tracer's 'Output " Paris" (p=0.421)'
      chart.append(Object.assign(text, { textContent: clipped(said ? said[1] : node.clerp, 14) }));
    }
  }
  chart.parentElement.scrollLeft = chart.parentElement.scrollWidth;  // the last position, where the logits are, in sight
  const features = nodes.filter((node) => node.feature_type === "cross layer transcoder").length;
  $("graph-summary").textContent = `${nodes.length} nodes (${features} features) and ${links.length} edges of the pruned graph ` +
    `of ${T} tokens; replacement ${fixed(answer.replacement)}, completeness ${fixed(answer.completeness)}.`;
}

// A feature's contexts (/v1/circuits/feature): where it fires most in the server's feature data, each
// token shaded by the feature's activation there (white 0 to dark blue at the largest shown).
async function showFeature(element, layer, feature) {
  for (const other of $("graph").querySelectorAll(".node.chosen")) other.classList.remove("chosen");
  element.classList.add("chosen");
  const asked = ++featureAsked;
  let answer;
  try {
    answer = await call("/v1/circuits/feature", { ...modelField(), layer, feature, top_k: 10 });
  } catch (e) {
    if (asked !== featureAsked) return;
    showError(e.message, "feature-error");
    $("feature-summary").textContent = "";
    $("feature-contexts").replaceChildren();
    return;
  }
  if (asked !== featureAsked) return;
  showError("", "feature-error");
  drawContexts(answer);
}

function drawContexts(answer) {
  const { layer, feature, contexts } = answer;
  const most = Math.max(0, ...contexts.map((c) => c.activation));
  $("feature-summary").textContent = contexts.length === 0
    ? `Feature ${feature} of layer ${layer} does not fire in the server's feature data.`
    : `Feature ${feature} of layer ${layer}: the ${contexts.length} contexts where it fires most in the server's feature ` +
      `data, each ending at the token where it fires (ringed); max activation ${fixed(most)}.`;
  $("feature-contexts").replaceChildren(...contexts.map((c) => {
    const row = document.createElement("div");
    row.className = "context";
    Object.assign(row.dataset, { row: c.row, position: c.position, activation: c.activation });
    c.ids.forEach((id, i) => {
      const text = c.tokens === null ? `token_id:${id}` : c.tokens[i];
      const a = c.activations[i];
      const span = document.createElement("span");
      span.textContent = text.replaceAll("\n", "↵");
      const shade = most > 0 ? Math.max(0, a) / most : 0;
      span.style.backgroundColor = colour(shade);
      span.style.color = shade > 0.55 ? "#fff" : "#1b1f24";
      span.title = `${shown(text)}: ${fixed(a)}`;
      span.dataset.activation = a;
      if (i === c.ids.length - 1) span.className = "at";
      row.append(span);
    });
    row.append(Object.assign(document.createElement("span"), { className: "value", textContent: fixed(c.activation) }));
    return row;
  }));
}

// ------------------------------------------------------------------ wiring

// The page's three views, one shown at a time: the playground (generation and the views after it),
// the walkthrough and training. The nav's buttons switch; #walkthrough or #training in the address
// opens that one. Each view's script hears "viewshown" on its element when it is opened.
export function showView(name) {
  for (const view of document.querySelectorAll("[data-page-view]")) view.hidden = view.id !== name;
  for (const button of document.querySelectorAll("#views button")) {
    button.setAttribute("aria-pressed", String(button.dataset.view === name));
  }
  $(name).dispatchEvent(new Event("viewshown"));
}

function start() {
  for (const button of document.querySelectorAll("#views button")) {
    button.addEventListener("click", () => {
      history.replaceState(null, "", button.dataset.view === "playground" ? location.pathname : `#${button.dataset.view}`);
      showView(button.dataset.view);
    });
  }
  if (["#walkthrough", "#training"].includes(location.hash)) showView(location.hash.slice(1));
  $("form").addEventListener("submit", generate);
  $("stop").addEventListener("click", stop);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
  });
  $("api-key").addEventListener("change", loadModel);
  $("completion").addEventListener("keydown", moveInCompletion);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") hideTip(); });
  for (const id of ["layer", "head"]) $(id).addEventListener("change", drawAttention);
  $("attention").addEventListener("mousemove", pointAtAttention);
  $("attention").addEventListener("click", pointAtAttention);
  $("attention").addEventListener("keydown", keyOnAttention);
  $("score-kind").addEventListener("change", paintHeads);
  $("prompt").addEventListener("input", showRoom);
  for (const name of ["lens", "patching"]) {
    $(`${name}-scroll`).addEventListener("scroll", () => scrollCue(name), { passive: true });
    new ResizeObserver(() => scrollCue(name)).observe($(`${name}-scroll`));
  }
  $("patching-form").addEventListener("submit", patch);
  $("attribution-form").addEventListener("submit", attribute);
  $("graph-form").addEventListener("submit", drawGraphOf);
  setPair(PAIRS[0]);
  let width = innerWidth;
  addEventListener("resize", () => { if (innerWidth !== width) { width = innerWidth; drawAttention(); } });
  loadModel();
}

start();
