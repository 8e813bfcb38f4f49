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
const ramps = {};  // palette -> 256 colours (r, g, b) from low to high: a bitmap is painted by table look-up
function ramp() {
  if (!ramps[state.palette]) {
    const table = new Uint8ClampedArray(3 * 256);
    for (let k = 0; k < 256; k++) table.set(colour(k / 255), 3 * k);
    ramps[state.palette] = table;
  }
  return ramps[state.palette];
}
// The weight drawn brightest: 1, or when colours are scaled the largest weight of the rows that spread over at
// least two keys. A row with one visible key (a causal map's first query; a masked key's weight is exactly 0)
// holds a weight of 1 whatever the head does, and would pin every map's scale at 1: such rows are drawn at the
// brightest colour instead. A map with no other row (one token) is scaled by its largest weight.
function largest(rows) {
  if (!state.scale) return 1;
  let peak = 0, any = 0;
  for (const row of rows) {
    let visible = 0, top = 0;
    for (let j = 0; j < row.length; j++) if (row[j] > 0) { visible++; if (row[j] > top) top = row[j]; }
    if (visible > 1 && top > peak) peak = top;
    if (top > any) any = top;
  }
  return peak > 0 ? peak : any;
}
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

// The weights come as millionths (uint32, base64; the API's "weights": "micros"): decoded here to the numbers the
// API's lists hold (k / 1e6 is the double nearest the 6-decimal value), as [layer][head][query] rows of one array
function unpack(analysis) {
  for (const v of Object.values(analysis.attention || {})) {
    if (!v.layers || Array.isArray(v.layers)) continue;
    const [layers, heads, queries, keys] = v.layers.shape, text = atob(v.layers.data);
    const bytes = new Uint8Array(text.length);
    for (let k = 0; k < text.length; k++) bytes[k] = text.charCodeAt(k);
    const millionths = new DataView(bytes.buffer), weights = new Float64Array(bytes.length / 4);
    for (let k = 0; k < weights.length; k++) {
      const m = millionths.getUint32(4 * k, true);
      weights[k] = m === 0xFFFFFFFF ? 0 : m / 1e6;  // a weight that was not finite (the lists send null) as 0
    }
    const row = (l, h, i) => {
      const start = ((l * heads + h) * queries + i) * keys;
      return weights.subarray(start, start + keys);
    };
    v.layers = [...Array(layers).keys()].map((l) => [...Array(heads).keys()].map((h) =>
      [...Array(queries).keys()].map((i) => row(l, h, i))));
  }
  return analysis;
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
  if (state.analysis) for (const [key, value] of viewSettings()) p.set(key, value);  // a refused input has none
  if (!state.offline) history.replaceState(null, "", "#" + p.toString());
}

function viewSettings() {  // what is shown of the analysis, as the URL keeps it (and a saved HTML file)
  const p = new URLSearchParams();
  p.set("kind", state.kind); p.set("layer", state.layer); p.set("heads", [...state.heads].join(","));
  if (state.average) p.set("average", "1");
  if (state.token !== null) p.set("token", state.token);
  if (state.cell) p.set("cell", `${state.cell.layer}.${state.cell.head}`);
  p.set("palette", state.palette); if (!state.mask) p.set("mask", "0"); if (!state.scale) p.set("scale", "0");
  return p;
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
      drawHeadLines(); saveHash();
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

const headY = (i) => HEADING + ROW * (i + 1) - 4;  // the baseline of token i in the head view
const headLeft = (v) => Math.max(labelWidth(v.queries), 64);  // wide enough for the heading "queries"

const headDrawn = {analysis: null, kind: null};  // whose tokens the head view shows: kept while they stay the same

function drawHeadView() {
  const v = view(), root = $("head-view");
  if (headDrawn.analysis === state.analysis && headDrawn.kind === state.kind && root.childElementCount) {
    return drawHeadLines();  // the same tokens (another layer, head or palette): only the lines change
  }
  root.replaceChildren();
  Object.assign(headDrawn, {analysis: state.analysis, kind: state.kind});
  if (!v.layers) return;
  const left = headLeft(v), gap = 180, right = left + gap;
  const height = HEADING + ROW * Math.max(v.queries.length, v.keys.length) + ROW;
  root.setAttribute("width", right + Math.max(labelWidth(v.keys), 40) + 10);
  root.setAttribute("height", height);
  root.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}));
  root.append(svg("text", {x: left - 6, y: HEADING - 6, "text-anchor": "end", class: "heading", fill: "#555555"},
    "queries"), svg("text", {x: right + 6, y: HEADING - 6, class: "heading", fill: "#555555"}, "keys"));
  root.append(svg("g", {id: "head-lines"}));
  const queries = svg("g", {class: "queries"});
  v.queries.forEach((t, i) => queries.append(svg("text", {x: left - 6, y: headY(i), "text-anchor": "end",
    class: "query", "data-index": i, fill: "#1a1a1a", "aria-label": `query ${i + 1}: ${t}`, tabindex: 0,
    role: "button", "data-focus": `query-${i}`}, shown(t))));
  chooseByPointer(queries, v);
  root.append(queries);
  const keys = svg("g", {class: "keys"});
  v.keys.forEach((t, j) => keys.append(svg("text", {x: right + 6, y: headY(j), class: "key", "data-index": j,
    fill: "#1a1a1a"}, shown(t))));
  root.append(keys);
  drawHeadLines(left, right);
}

// one listener per column, not per token (1,024 tokens): pointing, clicking, Enter/Space, and the arrows
function chooseByPointer(queries, v) {
  const index = (event) => (event.target.dataset && event.target.dataset.index !== undefined ?
    +event.target.dataset.index : null);
  queries.addEventListener("mouseover", (event) => { if (index(event) !== null) selectToken(index(event)); });
  queries.addEventListener("click", (event) => { if (index(event) !== null) selectToken(index(event)); });
  queries.addEventListener("keydown", (event) => {
    const i = index(event);
    if (i === null) return;
    const next = event.key === "Enter" || event.key === " " ? i : i + ({ArrowDown: 1, ArrowUp: -1}[event.key] || 0);
    if (next === i && event.key !== "Enter" && event.key !== " ") return;
    if (!v.queries[next]) return;
    event.preventDefault();
    selectToken(next);
    refocus(`query-${next}`);
  });
}

function drawHeadLines(left, right) {  // the chosen token's lines to every key, and which token is chosen
  const root = $("head-view"), lines = $("head-lines");
  if (!lines) return;
  left = left ?? headLeft(view()); right = right ?? left + 180;
  lines.replaceChildren();
  const heads = state.average ? ["avg"] : [...state.heads].sort((a, b) => a - b);
  for (const head of heads) {
    headRow(state.layer, head, state.token).forEach((w, j) => {
      if (w <= 0) return;  // masked or never scored: no line
      const line = svg("line", {class: "attn", x1: left, y1: headY(state.token) - 4, x2: right, y2: headY(j) - 4,
        stroke: head === "avg" ? "#20324f" : headColour(head), "stroke-width": 2.5, "stroke-opacity": w,
        "data-head": head, "data-query": state.token, "data-key": j, "data-weight": w});
      if (head !== "avg" && head >= HEAD_COLOURS.length) line.setAttribute("stroke-dasharray", "6 3");
      lines.append(line);
    });
  }
  for (const chosen of root.querySelectorAll("text.query.selected")) chosen.classList.remove("selected");
  const chosen = root.querySelector(`text.query[data-index="${state.token}"]`);
  if (chosen) chosen.classList.add("selected");
}

function headRow(layer, head, i) {  // one query's weights: a head's, or the mean over the heads ("avg")
  const heads = view().layers[layer];
  if (head !== "avg") return heads[head][i];
  return heads[0][i].map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length);
}

function selectToken(i) {
  if (i === state.token) return;
  state.token = i;
  drawHeadLines(); drawNext(); saveHash(); showChosenToken();
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

function paint(canvas, rows, masked = null) {  // one pixel per weight; masked(i, j): drawn light grey
  const height = rows.length, width = rows[0].length, table = ramp(), peak = largest(rows);
  canvas.width = width; canvas.height = height;
  const context = canvas.getContext("2d"), image = context.createImageData(width, height), data = image.data;
  const scale = 255 / (peak > 0 ? peak : 1);
  for (let i = 0; i < height; i++) {
    const row = rows[i];
    for (let j = 0, k = 4 * i * width; j < width; j++, k += 4) {
      if (masked && masked(i, j)) {
        data[k] = data[k + 1] = data[k + 2] = 236;
      } else {
        const c = 3 * Math.min(255, Math.max(0, Math.round(row[j] * scale)));
        data[k] = table[c]; data[k + 1] = table[c + 1]; data[k + 2] = table[c + 2];
      }
      data[k + 3] = 255;
    }
  }
  context.putImageData(image, 0, 0);
  return canvas;
}

const modelDrawn = {analysis: null, key: null};  // what the model view's maps show: redrawn only when it changes

function drawModelView() {
  const v = view(), grid = $("model-view"), key = [state.kind, state.palette, state.scale].join();
  if (modelDrawn.analysis === state.analysis && modelDrawn.key === key && grid.childElementCount) {
    for (const canvas of grid.querySelectorAll("canvas")) {  // the same maps: only the open one changes
      canvas.classList.toggle("open", !!state.cell && state.cell.layer === +canvas.dataset.layer &&
        state.cell.head === +canvas.dataset.head);
    }
    return;
  }
  grid.replaceChildren();
  Object.assign(modelDrawn, {analysis: state.analysis, key});
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

function openCell(layer, head) {  // a click on the model view or the statistics, below: the head opens in sight
  state.cell = {layer, head};
  drawModelView(); drawDetail(); drawStats(); saveHash();
  window.intervene?.drawn();  // intervene.js: look closer at the opened head
  $("detail-box").scrollIntoView({block: "nearest"});
}

const SVG_CELLS = 4096;  // a detail map of up to this many weights is SVG cells (64 x 64); a larger one, one bitmap

function detailCell() {  // the head the detail shows: the one opened, else the head view's first head
  const v = view();
  if (state.cell || !v.layers) return state.cell;
  return {layer: state.layer, head: state.heads.size ? Math.min(...state.heads) : 0};
}

function drawDetail() {
  const v = view(), root = $("detail"), shownCell = detailCell();
  root.replaceChildren();
  if ($("tip")) $("tip").hidden = true;
  $("cell-info").textContent = "";
  $("scale-info").textContent = "";
  if (!v.layers || !shownCell) {  // no map: the panel shrinks back rather than keep the last one's size
    root.setAttribute("width", 0); root.setAttribute("height", 0);
    $("detail-title").textContent = v.layers ? "Click a cell of the model view (or a row of the statistics; the " +
      "button \u201cModel view and statistics \u2193\u201d above goes there)." : "";
    return;
  }
  const {layer, head} = shownCell, rows = headWeights(layer, head), n = v.queries.length * v.keys.length;
  const which = state.cell ? "" : ", the head view's (click a cell of the model view for another)";
  $("detail-title").textContent =
    `${v.label}: layer ${layer + 1}, head ${head + 1}${which} (rows: queries, columns: keys)`;
  const bitmap = n > SVG_CELLS, longest = Math.max(v.queries.length, v.keys.length);
  // a bitmap fits 720 pixels (1,024 tokens: 0.7 pixel a cell, the pointer's tooltip names the cell exactly)
  const cell = bitmap ? Math.min(ROW, 720 / longest) : Math.max(6, Math.min(ROW, 640 / rows[0].length));
  const step = Math.ceil(11 / cell);  // every step-th token is labelled: labels never overlap
  const left = labelWidth(v.queries), top = labelWidth(v.keys);
  root.setAttribute("width", left + cell * v.keys.length + 4);
  root.setAttribute("height", top + cell * v.queries.length + 4);
  root.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}));
  const future = (i, j) => v.causal && j > i + (v.keys.length - v.queries.length);
  const peak = largest(rows);
  $("scale-info").textContent = `colours from 0 to ${peak.toFixed(3)}` +
    (step > 1 ? `; every ${step === 2 ? "other" : step + "th"} token labelled, point at a cell for its tokens` : "");
  const cells = (bitmap ? bitmapCells : svgCells)(rows, cell, (i, j) => state.mask && future(i, j), peak, root);
  cells.setAttribute("transform", `translate(${left},${top})`);
  pointAt(cells, cell, [rows.length, rows[0].length], (i, j) => (step > 1 ? `query ${i + 1} ` : "") +
    `${shown(v.queries[i])} \u2192 ` + (step > 1 ? `key ${j + 1} ` : "") + `${shown(v.keys[j])}: ` +
    (future(i, j) ? "masked (a future token)" : `weight ${rows[i][j].toFixed(4)}`));
  root.append(cells);
  const font = Math.min(12, Math.max(cell, 10));
  const labels = svg("g", {class: "labels"});
  v.queries.forEach((t, i) => i % step || labels.append(svg("text", {x: left - 4, y: top + i * cell + font * 0.8,
    "text-anchor": "end", "font-size": font, fill: "#1a1a1a"}, shown(t))));
  v.keys.forEach((t, j) => j % step || labels.append(svg("text", {x: 0, y: 0, "font-size": font, fill: "#1a1a1a",
    transform: `translate(${left + j * cell + font * 0.8},${top - 4}) rotate(-90)`}, shown(t))));
  root.append(labels);
}

function svgCells(rows, cell, masked, peak, root) {  // one <rect> per weight, with its numbers as data attributes
  const defs = svg("defs"), hatch = svg("pattern", {id: "masked", width: 4, height: 4,
    patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"});
  hatch.append(svg("rect", {width: 4, height: 4, fill: "#f2f2f2"}), svg("line", {x1: 0, y1: 0, x2: 0, y2: 4,
    stroke: "#b0b0b0", "stroke-width": 1.5}));
  defs.append(hatch); root.append(defs);
  const cells = svg("g");
  rows.forEach((row, i) => row.forEach((w, j) => {
    const hidden = masked(i, j);
    cells.append(svg("rect", {x: j * cell, y: i * cell, width: cell, height: cell, class: "weight" +
      (hidden ? " masked" : ""), fill: hidden ? "url(#masked)" : rgb(colour(w, peak)), "data-query": i, "data-key": j,
      "data-weight": w}));
  }));
  return cells;
}

function bitmapCells(rows, cell, masked) {  // the weights as one image, a pixel each, scaled (up: without smoothing)
  const canvas = paint(el("canvas"), rows, masked), cells = svg("g");
  cells.append(svg("image", {class: "weights", href: canvas.toDataURL(), width: cell * rows[0].length,
    height: cell * rows.length, preserveAspectRatio: "none", "image-rendering": cell >= 1 ? "pixelated" : "auto",
    "data-rows": rows.length, "data-columns": rows[0].length}));
  return cells;
}

function pointAt(cells, cell, [rows, columns], describe) {  // the cell under the pointer, described beside it
  const tip = $("tip") || document.body.appendChild(el("div", {id: "tip", role: "tooltip", hidden: ""}));
  cells.addEventListener("mousemove", (event) => {
    const box = cells.getBoundingClientRect();
    const i = Math.floor((event.clientY - box.top) / cell), j = Math.floor((event.clientX - box.left) / cell);
    if (i < 0 || j < 0 || i >= rows || j >= columns) return;
    $("cell-info").textContent = tip.textContent = describe(i, j);
    Object.assign(tip.style, {left: `${event.pageX + 14}px`, top: `${event.pageY + 14}px`});
    tip.hidden = false;
  });
  cells.addEventListener("mouseleave", () => { tip.hidden = true; });
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
  if (state.analysis && state.request.text !== text) clearResult();  // no views of another text while this one comes
  $("status").textContent = "analysing\u2026";
  showError("");
  try {
    const analysis = unpack(await (await api("/api/analyze", {...request, weights: "micros"}, ticket.signal)).json());
    if (!latest("analyze", ticket)) return;
    state.analysis = analysis; state.request = request;
    resetView(); applySaved(saved); draw();
    const picked = saved.token !== undefined && state.token !== view().queries.length - 1;
    if (picked) showChosenToken();  // a shared view's own token; else the text's start stays in sight
    else $("head-view").parentElement.scrollTop = 0;
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
  const node = figure(id), source = new XMLSerializer().serializeToString(node);
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

const TITLE = 26, LEGEND = 40;  // pixels above an exported figure for its title, and below it for its legend

function figure(id) {  // a view as a file: its title above, its colour legend below, the view itself between
  const node = $(id), width = Math.max(+node.getAttribute("width"), 560), height = +node.getAttribute("height");
  const out = svg("svg", {xmlns: SVGNS, width, height: TITLE + height + LEGEND, "font-family": "sans-serif"});
  out.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}),
    svg("text", {x: 8, y: 18, "font-size": 14, "font-weight": "bold", fill: "#1a1a1a", class: "title"},
      figureTitle(id)));
  const body = node.cloneNode(true);
  body.removeAttribute("id"); body.setAttribute("y", TITLE);
  const legend = svg("g", {class: "legend", transform: `translate(8,${TITLE + height + 10})`});
  legend.append(...(id === "detail" ? colourLegend() : headLegend()));
  out.append(body, legend);
  return out;
}

function figureTitle(id) {
  const v = view(), run = state.info ? `${state.info.name.split(/[\\/]/).pop()} (${state.info.task})` : "kqv";
  const cell = detailCell();
  if (id === "detail" && cell) {
    return `${run}: ${v.label}, layer ${cell.layer + 1}, head ${cell.head + 1}`;
  }
  const heads = state.average ? "average of the heads" : `heads ${[...state.heads].map((h) => h + 1).join(", ")}`;
  return `${run}: ${v.label}, layer ${state.layer + 1}, ${heads}, query ${shown(v.queries[state.token] || "")}`;
}

function colourLegend() {  // the palette from 0 to the weight drawn brightest, as a gradient bar with its ends named
  const stops = PALETTES[state.palette] || PALETTES.cividis, gradient = svg("linearGradient", {id: "legend-ramp"});
  stops.forEach((c, k) => gradient.append(svg("stop", {offset: k / (stops.length - 1), "stop-color": c})));
  const cell = detailCell(), peak = cell ? largest(headWeights(cell.layer, cell.head)) : 1, defs = svg("defs");
  defs.append(gradient);
  const grey = $("detail").querySelector("image.weights") ? "light grey" : "hatched";
  const masked = view().causal && state.mask ? `; masked (future) tokens ${grey}` : "";
  return [defs, svg("rect", {width: 200, height: 12, fill: "url(#legend-ramp)", stroke: "#888888"}),
    svg("text", {x: 0, y: 26, "font-size": 11, fill: "#1a1a1a"}, "0"),
    svg("text", {x: 200, y: 26, "font-size": 11, "text-anchor": "end", fill: "#1a1a1a"}, peak.toFixed(3)),
    svg("text", {x: 210, y: 11, "font-size": 11, fill: "#1a1a1a"}, `attention weight${masked}`)];
}

function headLegend() {  // one swatch per head drawn; a line's opacity is its weight
  const heads = state.average ? ["avg"] : [...state.heads].sort((a, b) => a - b), items = [];
  heads.forEach((h, k) => items.push(svg("rect", {x: 70 * k, y: 0, width: 12, height: 12,
    fill: h === "avg" ? "#20324f" : headColour(h)}), svg("text", {x: 70 * k + 16, y: 11, "font-size": 11,
    fill: "#1a1a1a"}, h === "avg" ? "average" : `head ${h + 1}`)));
  items.push(svg("text", {x: 0, y: 28, "font-size": 11, fill: "#1a1a1a"}, "line opacity = attention weight"));
  return items;
}

async function saveHtml() {
  try {
    const body = {...state.request, view: viewSettings().toString(), weights: "micros"};  // opens on this view
    download(await (await api("/api/export", body)).blob(), "kqv-attention.html");
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
  for (const button of document.querySelectorAll("[data-jump]")) {  // scrolled to, the URL's hash left alone
    button.addEventListener("click", () => $(button.dataset.jump).scrollIntoView({block: "start"}));
  }
  $("to-token").addEventListener("click", () => {  // the chosen token in the middle of its box and of the window
    const chosen = $("head-view").querySelector("text.query.selected");
    if (chosen) chosen.scrollIntoView({block: "center"});
  });
  for (const button of document.querySelectorAll("[data-export]")) {
    button.addEventListener("click", () => exportFigure(button.dataset.export, button.dataset.format));
  }
}

async function start() {
  listen();
  const inlined = $("kqv-data");
  if (inlined) {  // a saved HTML file: draw the inlined analysis, no server to ask
    const data = JSON.parse(inlined.textContent);
    unpack(data.analysis);
    Object.assign(state, {info: data.info, analysis: data.analysis, request: data.request, offline: true});
    describe(data.info);
    $("text").value = data.request.text; $("text").readOnly = true;
    for (const id of ["analyze", "save-html", "beam-box"]) $(id).hidden = true;
    resetView(); applySaved(Object.fromEntries(new URLSearchParams(data.view || ""))); draw();
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
  else if (state.info.example) {  // an input the model reads: the first screen shows its views, no click needed
    $("text").value = state.info.example;
    await analyze();
  }
}

start();
