// kqv explore: draws the API's numbers (it computes none of its own). Plain JS and SVG; works offline.
// Served by `kqv explore RUN`, or inlined with the data into one HTML file by `kqv explore RUN --html`.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
// Okabe & Ito's colour-blind-safe palette, one colour per head (dashes tell heads apart beyond eight)
const HEAD_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];
const PALETTES = {  // perceptually uniform ramps, low -> high; cividis is designed for colour-vision deficiency
  cividis: ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74", "#c3b369", "#fee838"],
  viridis: ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#fde725"],
  greys: ["#ffffff", "#000000"],
};
const ROW = 18;  // pixels per token in the head view and the heat map
const HEADING = 20;  // pixels above the head view's two columns, for their headings
const $ = (id) => document.getElementById(id);
const state = {info: null, analysis: null, request: {}, kind: null, layer: 0, heads: null, average: false,
  token: null, cell: null, palette: "cividis", mask: true, scale: true, sort: {key: null, descending: true}, offline: false};

// ---------------------------------------------------------------------------------------------------------------
// small helpers

function el(tag, attributes = {}, text = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== null) node.textContent = text;
  return node;
}
const svg = (tag, attributes = {}, text = null) => el(tag, attributes, text, SVGNS);

function shown(token) {  // whitespace made visible
  const t = token.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
  return t.length > 24 ? t.slice(0, 23) + "\u2026" : (t || "\u2205");
}

function colour(weight, peak = 1) {  // peak: the weight drawn brightest (1, or the map's largest when scaled)
  const stops = PALETTES[state.palette] || PALETTES.cividis;
  const scaled = Math.min(1, Math.max(0, weight / (peak > 0 ? peak : 1)));
  const x = scaled * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2);
  const a = parseInt(stops[i].slice(1), 16), b = parseInt(stops[i + 1].slice(1), 16), f = x - i;
  const mix = (shift) => Math.round(((a >> shift) & 255) * (1 - f) + ((b >> shift) & 255) * f);
  return [mix(16), mix(8), mix(0)];
}
const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
const largest = (rows) => (state.scale ? Math.max(...rows.map((row) => Math.max(...row))) : 1);
const headColour = (h) => HEAD_COLOURS[h % HEAD_COLOURS.length];
const labelWidth = (tokens) => 12 + 7.5 * Math.max(...tokens.map((t) => shown(t).length));

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

async function api(path, body, signal) {
  const options = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify(body)};
  const response = await fetch(path, {...options, signal});
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

// Every reply is tied to the request that asked for it: a new request of a kind ("analyze", "continue") aborts the
// one before it, and a reply is drawn only while its request is still the latest of its kind. So the controls, the
// URL and the views always show the last request, whatever order the replies come back in.
const pending = {};  // kind -> the AbortController of its latest request

function begin(kind) {
  if (pending[kind]) pending[kind].abort();
  pending[kind] = new AbortController();
  return pending[kind];
}
const latest = (kind, ticket) => pending[kind] === ticket;

// keyboard use: a node that acts on click also acts on Enter and Space, and keeps the focus across the redraw
function activate(node, key, action) {
  node.setAttribute("tabindex", "0");
  if (node.tagName !== "TH" && node.tagName !== "TR") node.setAttribute("role", "button");  // tables keep theirs
  node.dataset.focus = key;
  node.addEventListener("click", action);
  node.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    event.preventDefault();
    action();
    refocus(key);
  });
}
function refocus(key) {
  const again = document.querySelector(`[data-focus="${key}"]`);
  if (again) again.focus();
}

// ---------------------------------------------------------------------------------------------------------------
// the current view: which kind of attention, layer, heads; kept in the URL, which is read back as untrusted input

function view() { return state.analysis.attention[state.kind]; }

function headWeights(layer, head) {  // (queries, keys) rows, or the mean over the heads when head is "avg"
  const heads = view().layers[layer];
  if (head !== "avg") return heads[head];
  return heads[0].map((row, i) => row.map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
}

function saveHash() {
  const p = new URLSearchParams();
  if (state.request.text) p.set("text", state.request.text);
  if (state.request.beam) p.set("beam", state.request.beam);
  if (state.request.top_k) p.set("k", state.request.top_k);
  if (!state.analysis) {  // a refused input: no view to keep
    if (!state.offline) history.replaceState(null, "", "#" + p.toString());
    return;
  }
  p.set("kind", state.kind); p.set("layer", state.layer); p.set("heads", [...state.heads].join(","));
  if (state.average) p.set("average", "1");
  if (state.token !== null) p.set("token", state.token);
  if (state.cell) p.set("cell", `${state.cell.layer}.${state.cell.head}`);
  p.set("palette", state.palette); if (!state.mask) p.set("mask", "0"); if (!state.scale) p.set("scale", "0");
  if (!state.offline) history.replaceState(null, "", "#" + p.toString());
}

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1)), saved = {};
  for (const [key, value] of p) saved[key] = value;
  return saved;
}

// a position from the URL: digits only (no sign, no decimals, no exponent) and below `size`, else null (dropped)
function index(value, size) {
  return typeof value === "string" && /^(0|[1-9][0-9]{0,5})$/.test(value) && +value < size ? +value : null;
}

function chooseOption(select, value) {  // a <select>'s value from the URL, only when it is one of its options
  if ([...select.options].some((option) => option.value === value)) select.value = value;
}

function applySaved(saved) {  // view settings from the URL, each checked against the analysis; the rest dropped
  const kinds = Object.keys(state.analysis.attention);
  if (kinds.includes(saved.kind) && saved.kind !== state.kind) { state.kind = saved.kind; resetView(); }
  const v = view(), layers = v.layers ? v.layers.length : 0, heads = v.layers ? v.layers[0].length : 0;
  const layer = index(saved.layer, layers), token = index(saved.token, v.queries.length);
  if (layer !== null) state.layer = layer;
  if (token !== null) state.token = token;
  if (saved.heads !== undefined) {
    const chosen = saved.heads.split(",").map((h) => index(h, heads)).filter((h) => h !== null);
    if (chosen.length) state.heads = new Set(chosen);
  }
  state.average = saved.average === "1";
  const cell = /^([0-9]+)\.([0-9]+)$/.exec(saved.cell || "");
  if (cell && index(cell[1], layers) !== null && index(cell[2], heads) !== null) {
    state.cell = {layer: +cell[1], head: +cell[2]};
  }
  if (PALETTES[saved.palette]) state.palette = saved.palette;
  state.mask = saved.mask !== "0";
  state.scale = saved.scale !== "0";
}

// ---------------------------------------------------------------------------------------------------------------
// controls

function resetView() {
  const kinds = Object.keys(state.analysis.attention);
  if (!kinds.includes(state.kind)) state.kind = kinds.includes("cross") ? "cross" : kinds[0];
  const v = view(), layers = v.layers ? v.layers.length : 0, heads = v.layers ? v.layers[0].length : 0;
  state.layer = Math.min(state.layer, Math.max(0, layers - 1));
  state.heads = new Set([...Array(heads).keys()]);
  state.token = v.queries.length - 1;
  state.cell = null;
}

function buildControls() {
  const kinds = Object.keys(state.analysis.attention), v = view();
  $("kind").replaceChildren(...kinds.map((k) => el("option", {value: k}, state.analysis.attention[k].label)));
  $("kind").value = state.kind;
  $("kind-box").hidden = kinds.length < 2;
  const layers = v.layers ? v.layers.length : 0, heads = v.layers ? v.layers[0].length : 0;
  $("layer").replaceChildren(...[...Array(layers).keys()].map((l) => el("option", {value: l}, `${l + 1}`)));
  $("layer").value = state.layer;
  $("heads").replaceChildren(...[...Array(heads).keys()].map((h) => {
    const box = el("input", {type: "checkbox", "data-head": h, id: `head-${h}`});
    box.checked = state.heads.has(h);
    box.addEventListener("change", () => {
      box.checked ? state.heads.add(h) : state.heads.delete(h);
      drawHeadView(); saveHash();
    });
    const swatch = el("span", {class: "swatch"});
    swatch.style.background = headColour(h);
    const label = el("label", {for: `head-${h}`});
    label.append(box, swatch, `head ${h + 1}`);
    return label;
  }));
  $("average").checked = state.average;
  $("palette").value = state.palette;
  $("mask-overlay").checked = state.mask;
  $("scale").checked = state.scale;
  $("mask-box").hidden = !v.causal;
  $("view-note").hidden = !v.note;
  $("view-note").textContent = v.note || "";
}

// ---------------------------------------------------------------------------------------------------------------
// head view: tokens on both sides, lines from the selected query token to every key it attends to

function drawHeadView() {
  const v = view(), root = $("head-view");
  root.replaceChildren();
  if (!v.layers) return;
  const left = labelWidth(v.queries), gap = 180, right = left + gap;
  const height = HEADING + ROW * Math.max(v.queries.length, v.keys.length) + ROW;
  root.setAttribute("width", right + labelWidth(v.keys) + 10);
  root.setAttribute("height", height);
  root.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}));
  root.append(svg("text", {x: left - 6, y: HEADING - 6, "text-anchor": "end", class: "heading", fill: "#555555"},
    "queries"), svg("text", {x: right + 6, y: HEADING - 6, class: "heading", fill: "#555555"}, "keys"));
  const y = (i) => HEADING + ROW * (i + 1) - 4;
  const lines = svg("g");
  const heads = state.average ? ["avg"] : [...state.heads].sort((a, b) => a - b);
  for (const head of heads) {
    const row = headWeights(state.layer, head)[state.token];
    row.forEach((w, j) => {
      if (w <= 0) return;  // masked or never scored: no line
      const line = svg("line", {class: "attn", x1: left, y1: y(state.token) - 4, x2: right, y2: y(j) - 4,
        stroke: head === "avg" ? "#20324f" : headColour(head), "stroke-width": 2.5, "stroke-opacity": w,
        "data-head": head, "data-query": state.token, "data-key": j, "data-weight": w});
      if (head !== "avg" && head >= HEAD_COLOURS.length) line.setAttribute("stroke-dasharray", "6 3");
      lines.append(line);
    });
  }
  root.append(lines);
  v.queries.forEach((t, i) => {
    const text = svg("text", {x: left - 6, y: y(i), "text-anchor": "end", class: "query" +
      (i === state.token ? " selected" : ""), "data-index": i, fill: "#1a1a1a", "aria-label": `query ${i + 1}: ${t}`},
      shown(t));
    text.addEventListener("mouseenter", () => selectToken(i));
    activate(text, `query-${i}`, () => selectToken(i));
    text.addEventListener("keydown", (event) => {  // the arrows move the chosen token
      const step = {ArrowDown: 1, ArrowUp: -1}[event.key];
      if (!step || !v.queries[i + step]) return;
      event.preventDefault();
      selectToken(i + step);
      refocus(`query-${i + step}`);
    });
    root.append(text);
  });
  v.keys.forEach((t, j) => root.append(svg("text", {x: right + 6, y: y(j), class: "key", "data-index": j,
    fill: "#1a1a1a"}, shown(t))));
}

function selectToken(i) {
  if (i === state.token) return;
  state.token = i;
  drawHeadView(); drawNext(); saveHash(); showChosenToken();
}

function showChosenToken() {  // the chosen token scrolled into the head view's box (nothing moves if it is in view)
  const chosen = $("head-view").querySelector("text.query.selected"), box = $("head-view").parentElement;
  if (!chosen || box.hidden) return;
  const top = chosen.getBBox().y - ROW, bottom = chosen.getBBox().y + 2 * ROW;
  if (top < box.scrollTop) box.scrollTop = top;
  else if (bottom > box.scrollTop + box.clientHeight) box.scrollTop = bottom - box.clientHeight;
}

// ---------------------------------------------------------------------------------------------------------------
// model view: every layer x head as a small heat map; the detail view: one of them, large

function paint(canvas, rows) {
  canvas.width = rows[0].length; canvas.height = rows.length;
  const context = canvas.getContext("2d"), image = context.createImageData(canvas.width, canvas.height);
  const peak = largest(rows);
  rows.forEach((row, i) => row.forEach((w, j) => {
    const c = colour(w, peak), k = 4 * (i * canvas.width + j);
    image.data[k] = c[0]; image.data[k + 1] = c[1]; image.data[k + 2] = c[2]; image.data[k + 3] = 255;
  }));
  context.putImageData(image, 0, 0);
  return canvas;
}

function drawModelView() {
  const v = view(), grid = $("model-view");
  grid.replaceChildren();
  if (!v.layers) return;
  const heads = v.layers[0].length;
  grid.style.gridTemplateColumns = `4em repeat(${heads}, 76px)`;
  grid.append(el("span"), ...[...Array(heads).keys()].map((h) => el("span", {class: "axis"}, `head ${h + 1}`)));
  v.layers.forEach((layer, l) => {
    grid.append(el("span", {class: "axis"}, `layer ${l + 1}`));
    layer.forEach((rows, h) => {
      const open = state.cell && state.cell.layer === l && state.cell.head === h;
      const canvas = paint(el("canvas", {class: "cell" + (open ? " open" : ""), "data-layer": l, "data-head": h,
        title: `layer ${l + 1}, head ${h + 1}`, "aria-label": `open layer ${l + 1}, head ${h + 1}`}), rows);
      activate(canvas, `cell-${l}-${h}`, () => openCell(l, h));
      grid.append(canvas);
    });
  });
}

function openCell(layer, head) {
  state.cell = {layer, head};
  drawModelView(); drawDetail(); drawStats(); saveHash();
  window.intervene?.drawn();  // intervene.js: look closer at the opened head
}

function drawDetail() {
  const v = view(), root = $("detail");
  root.replaceChildren();
  $("cell-info").textContent = "";
  $("scale-info").textContent = "";
  if (!v.layers || !state.cell) {  // no map: the panel shrinks back rather than keep the last one's size
    root.setAttribute("width", 0); root.setAttribute("height", 0);
    $("detail-title").textContent = v.layers ? "Click a cell of the model view (or a row of the statistics)." : "";
    return;
  }
  const {layer, head} = state.cell, rows = headWeights(layer, head);
  $("detail-title").textContent = `${v.label}: layer ${layer + 1}, head ${head + 1} (rows: queries, columns: keys)`;
  const left = labelWidth(v.queries), top = labelWidth(v.keys), cell = Math.max(6, Math.min(ROW, 640 / rows[0].length));
  root.setAttribute("width", left + cell * v.keys.length + 4);
  root.setAttribute("height", top + cell * v.queries.length + 4);
  root.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}));
  const defs = svg("defs"), hatch = svg("pattern", {id: "masked", width: 4, height: 4,
    patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"});
  hatch.append(svg("rect", {width: 4, height: 4, fill: "#f2f2f2"}), svg("line", {x1: 0, y1: 0, x2: 0, y2: 4,
    stroke: "#b0b0b0", "stroke-width": 1.5}));
  defs.append(hatch); root.append(defs);
  const cells = svg("g", {transform: `translate(${left},${top})`});
  const future = (i, j) => v.causal && j > i + (v.keys.length - v.queries.length);
  const peak = largest(rows);
  $("scale-info").textContent = `colours from 0 to ${peak.toFixed(3)}`;
  rows.forEach((row, i) => row.forEach((w, j) => {
    const masked = state.mask && future(i, j);
    cells.append(svg("rect", {x: j * cell, y: i * cell, width: cell, height: cell, class: "weight" +
      (masked ? " masked" : ""), fill: masked ? "url(#masked)" : rgb(colour(w, peak)), "data-query": i, "data-key": j,
      "data-weight": w}));
  }));
  cells.addEventListener("mousemove", (event) => {
    const t = event.target;
    if (!t.dataset || t.dataset.weight === undefined) return;
    const i = +t.dataset.query, j = +t.dataset.key;
    $("cell-info").textContent = `${shown(v.queries[i])} \u2192 ${shown(v.keys[j])}: ` +
      (future(i, j) ? "masked (a future token)" : `weight ${(+t.dataset.weight).toFixed(4)}`);
  });
  root.append(cells);
  const font = Math.min(12, cell);
  v.queries.forEach((t, i) => root.append(svg("text", {x: left - 4, y: top + (i + 0.8) * cell, "text-anchor": "end",
    "font-size": font, fill: "#1a1a1a"}, shown(t))));
  v.keys.forEach((t, j) => root.append(svg("text", {x: 0, y: 0, "font-size": font, fill: "#1a1a1a",
    transform: `translate(${left + (j + 0.8) * cell},${top - 4}) rotate(-90)`}, shown(t))));
}

// ---------------------------------------------------------------------------------------------------------------
// per-head statistics, sortable

const STAT_COLUMNS = [["layer", "layer"], ["head", "head"], ["entropy", "entropy (nats)"],
  ["max_weight", "max weight"], ["distance", "mean distance"], ["previous", "on previous"], ["first", "on first"],
  ["self", "on itself"], ["tags", "tags"]];

function drawStats() {
  const v = view(), table = $("stats");
  table.replaceChildren();
  if (!v.stats.length) return;
  const columns = STAT_COLUMNS.filter(([key]) => key in v.stats[0]);
  const head = el("tr");
  for (const [key, title] of columns) {
    const sorted = state.sort.key === key;
    const th = el("th", {"data-key": key, class: sorted ? "sorted" + (state.sort.descending ? "" : " ascending") : ""},
      title);
    activate(th, `sort-${key}`, () => {
      state.sort = {key, descending: sorted ? !state.sort.descending : true};
      drawStats();
    });
    head.append(th);
  }
  const rows = [...v.stats];
  if (state.sort.key) {
    const value = (s) => (state.sort.key === "tags" ? s.tags.length : s[state.sort.key]);
    rows.sort((a, b) => (state.sort.descending ? value(b) - value(a) : value(a) - value(b)));
  }
  const body = el("tbody");
  for (const s of rows) {
    const open = state.cell && state.cell.layer === s.layer && state.cell.head === s.head;
    const tr = el("tr", {class: open ? "open" : "", "data-layer": s.layer, "data-head": s.head});
    for (const [key] of columns) {
      if (key === "tags") {
        const td = el("td", {class: "tags", "data-key": key});
        td.append(...s.tags.map((t) => el("span", {class: "tag"}, t)));
        tr.append(td);
      } else {
        tr.append(el("td", {"data-key": key}, key === "layer" || key === "head" ? `${s[key] + 1}` :
          s[key].toFixed(3)));
      }
    }
    tr.setAttribute("aria-label", `open layer ${s.layer + 1}, head ${s.head + 1}`);
    activate(tr, `row-${s.layer}-${s.head}`, () => openCell(s.layer, s.head));
    body.append(tr);
  }
  table.append(el("thead", {}, null), body);
  table.firstChild.append(head);
}

// ---------------------------------------------------------------------------------------------------------------
// predictions: next tokens (LM), the masks (MLM), class probabilities (classifier); continue (LM)

function bars(list, items, label) {
  list.replaceChildren(...items.map((item) => {
    const bar = el("span", {class: "bar"});
    bar.style.width = `${(100 * item.p).toFixed(1)}%`;
    const track = el("span");
    track.append(bar);
    const li = el("li");
    li.append(el("span", {class: "token"}, label(item)), track, el("span", {}, item.p.toFixed(4)));
    return li;
  }));
}

function drawNext() {
  const a = state.analysis;
  $("next-box").hidden = !a.next_tokens;
  if (!a.next_tokens) return;
  $("next-after").textContent = shown(a.tokens[state.token]);
  bars($("next"), a.next_tokens[state.token], (item) => shown(item.token));
  $("continue").hidden = state.offline;
  $("top-k-box").hidden = state.offline;
  const s = state.info.sample || {};
  $("continue-settings").textContent = state.offline ? "" :
    `samples with the run's settings: temperature ${s.temperature}, top-k ${s.top_k}`;
}

function drawPredictions() {
  const a = state.analysis;
  $("masked-box").hidden = !a.masked || !a.masked.length;
  if (a.masked) {
    $("masked").replaceChildren(...a.masked.map((m) => {
      const tr = el("tr");
      tr.append(el("th", {}, `position ${m.position + 1}`),
        ...m.top.map((t) => el("td", {}, `${shown(t.token)} ${t.p.toFixed(3)}`)));
      return tr;
    }));
  }
  $("classes-box").hidden = !a.classes;
  if (a.classes) bars($("classes"), a.classes, (item) => item.label);
  $("translation-box").hidden = a.translation === undefined;
  if (a.translation !== undefined) $("translation").textContent = a.translation;
}

async function continueText() {
  const ticket = begin("continue"), out = $("continuation"), text = state.request.text;
  out.replaceChildren(el("span", {}, text));
  delete out.dataset.done; delete out.dataset.stopped;
  $("continue").disabled = true; $("stop").hidden = false;
  showError("");
  try {
    const response = await api("/api/continue", {text}, ticket.signal);
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done || !latest("continue", ticket)) break;
      buffer += decoder.decode(value, {stream: true});
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines.filter((l) => l.trim())) {
        if (!latest("continue", ticket)) return;
        const message = JSON.parse(line);
        if (message.error) throw new Error(message.error);
        if (message.done) out.dataset.done = "1";
        else out.append(el("span", {class: "new", "data-id": message.id}, message.token));
        out.scrollTop = out.scrollHeight;
      }
    }
  } catch (error) {
    if (!latest("continue", ticket)) return;  // a new analysis replaced it: nothing of it is shown
    if (error.name === "AbortError") out.dataset.stopped = "1";  // the Stop button
    else showError(error.message);
  } finally {
    if (latest("continue", ticket)) endContinue();
  }
}

function endContinue() {
  pending.continue = null;
  $("continue").disabled = false; $("stop").hidden = true;
}

function stopContinue() {
  if (pending.continue) pending.continue.abort();
}

function dropContinuation() {  // a new analysis: the old continuation (finished or streaming) no longer applies
  const running = pending.continue;
  endContinue();
  if (running) running.abort();
  $("continuation").replaceChildren();
  delete $("continuation").dataset.done; delete $("continuation").dataset.stopped;
}

// ---------------------------------------------------------------------------------------------------------------
// drawing, analysing, exporting

function draw() {
  if (state.request.beam) chooseOption($("beam"), `${state.request.beam}`);  // the controls show the last request
  if (state.request.top_k) chooseOption($("top-k"), `${state.request.top_k}`);
  buildControls();
  drawHeadView(); drawModelView(); drawDetail(); drawStats(); drawNext(); drawPredictions();
  $("notes").replaceChildren(...(state.analysis.notes || []).map((n) => el("li", {}, n)));
  $("result").hidden = false;
  saveHash();
  window.intervene?.drawn();  // intervene.js: its views follow the analysis
}

function clearResult() {  // a refused input: the views of the previous one no longer match the text box
  state.analysis = null;
  $("result").hidden = true;
  for (const id of ["head-view", "model-view", "detail", "stats", "next", "masked", "classes", "notes"]) {
    $(id).replaceChildren();
  }
  $("detail").setAttribute("width", 0); $("detail").setAttribute("height", 0);
  $("translation").textContent = "";
  window.intervene?.cleared();  // intervene.js: its views no longer match the text either
}

async function analyze(saved = {}) {
  const text = $("text").value, request = {text};
  if (state.info.task === "mt") request.beam = +$("beam").value;
  if (state.info.views.includes("next")) request.top_k = +$("top-k").value;
  const ticket = begin("analyze");
  dropContinuation();
  $("status").textContent = "analysing\u2026";
  showError("");
  try {
    const analysis = await (await api("/api/analyze", request, ticket.signal)).json();
    if (!latest("analyze", ticket)) return;
    state.analysis = analysis; state.request = request;
    resetView(); applySaved(saved); draw(); showChosenToken();
  } catch (error) {
    if (!latest("analyze", ticket)) return;  // superseded: the newer request owns the page
    state.request = request;
    clearResult(); saveHash();
    showError(error.message);
  } finally {
    if (latest("analyze", ticket)) { pending.analyze = null; $("status").textContent = ""; }
  }
}

function reanalyze() {  // a setting that the server computes (beam, top-k) changed: ask again, keeping the view
  if ($("text").value.trim()) analyze(state.analysis ? readHash() : {});
}

function download(blob, name) {
  const link = el("a", {href: URL.createObjectURL(blob), download: name});
  document.body.append(link); link.click(); link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function exportFigure(id, format) {
  const node = $(id), source = new XMLSerializer().serializeToString(node);
  const blob = new Blob([source], {type: "image/svg+xml"});
  if (format === "svg") return download(blob, `kqv-${id}.svg`);
  const image = new Image(), url = URL.createObjectURL(blob);
  image.onload = () => {
    const canvas = el("canvas", {width: node.getAttribute("width"), height: node.getAttribute("height")});
    canvas.getContext("2d").drawImage(image, 0, 0);
    URL.revokeObjectURL(url);
    canvas.toBlob((png) => download(png, `kqv-${id}.png`));
  };
  image.src = url;
}

async function saveHtml() {
  try {
    download(await (await api("/api/export", state.request)).blob(), "kqv-attention.html");
  } catch (error) { showError(error.message); }
}

function describe(info) {
  const c = info.config;
  $("run").textContent = `${info.task}: ${info.name}`;
  $("summary").textContent = `${info.model}, ${c.n_layers || c.encoder_layers || ""} layers, ` +
    `${c.n_heads || 1} heads, d_model ${c.d_model || c.d_hidden}, attention ${c.attention || "additive"}`;
  $("limit").textContent = `at most ${info.max_tokens} tokens`;
  $("beam-box").hidden = info.task !== "mt";
  if (info.decode) chooseOption($("beam"), `${info.decode.beam_size}`);
  $("text-label").textContent = info.task === "mt" ? "Source sentence" :
    info.task === "mlm" ? `Text (write ${info.mask_token} where a token should be guessed)` :
    info.task === "vit" ? `Test image number (0 to ${info.images - 1})` : "Text";
}

function listen() {
  $("analyze").addEventListener("click", () => analyze());
  $("text").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) analyze(); });
  $("kind").addEventListener("change", () => { state.kind = $("kind").value; resetView(); draw(); });
  $("layer").addEventListener("change", () => { state.layer = +$("layer").value; draw(); });
  $("average").addEventListener("change", () => { state.average = $("average").checked; draw(); });
  $("palette").addEventListener("change", () => { state.palette = $("palette").value; draw(); });
  $("mask-overlay").addEventListener("change", () => { state.mask = $("mask-overlay").checked; draw(); });
  $("scale").addEventListener("change", () => { state.scale = $("scale").checked; draw(); });
  $("continue").addEventListener("click", continueText);
  $("stop").addEventListener("click", stopContinue);
  $("beam").addEventListener("change", reanalyze);
  $("top-k").addEventListener("change", reanalyze);
  $("save-html").addEventListener("click", saveHtml);
  for (const button of document.querySelectorAll("[data-export]")) {
    button.addEventListener("click", () => exportFigure(button.dataset.export, button.dataset.format));
  }
}

async function start() {
  listen();
  const inlined = $("kqv-data");
  if (inlined) {  // a saved HTML file: draw the inlined analysis, no server to ask
    const data = JSON.parse(inlined.textContent);
    Object.assign(state, {info: data.info, analysis: data.analysis, request: data.request, offline: true});
    describe(data.info);
    $("text").value = data.request.text; $("text").readOnly = true;
    for (const id of ["analyze", "save-html", "beam-box"]) $(id).hidden = true;
    resetView(); draw();
    return;
  }
  try {
    state.info = await (await api("/api/info")).json();
  } catch (error) {
    showError(error.message);
    return;
  }
  describe(state.info);
  const saved = readHash();
  chooseOption($("beam"), saved.beam);
  chooseOption($("top-k"), saved.k);
  if (saved.text) { $("text").value = saved.text; await analyze(saved); }
}

start();
