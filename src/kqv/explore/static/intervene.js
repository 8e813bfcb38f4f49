// kqv explore, "Look closer and intervene": the neuron view of one head, a token replaced, heads switched off.
// Draws the numbers of /api/neuron, /api/replace and /api/ablate (kqv.explore.interventions) and computes none of
// its own. Loaded after explore.js, whose helpers ($, el, svg, api, begin, latest, shown, activate, largest) and
// `state` it uses; explore.js calls intervene.drawn() when the views are drawn or a head is opened, and intervene.cleared()
// when a refused input clears them; a token chosen in the head view is seen through its events. Not part of a
// saved HTML file: it needs the model.
"use strict";

const intervene = (() => {
  const ours = {available: null, analysis: null, layer: 0, head: 0, neuronKey: null, timer: null,
    ablation: null, sort: {key: null, descending: true}, chosen: new Set()};
  const CELL = 18;  // pixels per row of the neuron view
  // One meaning per colour in this section: grey is an amount (an attention weight: white 0 to near-black, the
  // largest shown), red is more or positive, blue is less or negative (a change, a vector's component)
  const RAMP = [[255, 255, 255], [37, 37, 37]];
  const RED = [178, 24, 43], BLUE = [33, 102, 172];
  const labelWidth = (tokens) => 12 + 7.5 * Math.max(...tokens.map((t) => shown(t).length));
  const KINDS = ["neuron", "replace", "ablate"];
  const NEURON_OPEN_TOKENS = 256;  // the neuron view starts open up to this many tokens
  // a number to read: 4 decimals, or 3 significant digits when smaller than that shows
  const fmt = (x, sign = false) => (sign && x > 0 ? "+" : "") +
    (x !== 0 && Math.abs(x) < 5e-4 ? x.toExponential(2) : x.toFixed(4));

  // -------------------------------------------------------------------------------------------------------------
  // the section and its controls, built once

  function build() {
    const section = el("section", {id: "intervene", hidden: ""});
    section.innerHTML = `
      <h2>Look closer and intervene</h2>
      <div class="row">
        <label>layer <select id="iv-layer"></select></label>
        <label>head <select id="iv-head"></select></label>
        <span class="muted">query token: <span id="iv-token" class="token"></span> (choose it in the head view)</span>
        <span id="iv-status" role="status"></span>
      </div>
      <div id="iv-error" role="alert" hidden></div>
      <details id="neuron-box" open><summary><h3>Neuron view</h3></summary><figure>
        <figcaption>The query vector q of the chosen token, each key vector k and their elementwise
          products q \u00d7 k, whose sum is the score q\u00b7k; the scaled score (/\u221a(head dim), plus the
          position bias where the model adds one) and its softmax, the attention weight. Red positive, blue
          negative; the weights' bars grey.
        </figcaption>
        <div class="scroll"><svg id="neuron" xmlns="http://www.w3.org/2000/svg"></svg></div>
        <p id="neuron-info" class="muted">Point at a key or product for its numbers.</p>
      </figure></details>
      <div id="replace-box">
        <h3>Replace a token</h3>
        <div class="row">
          <label>token <select id="replace-position"></select></label>
          <label>with <input id="replacement" size="12" spellcheck="false"></label>
          <button id="replace" type="button">Replace</button>
        </div>
        <p id="replace-legend" class="muted">Colours here:
          <span class="key" data-colour="weight"></span> attention weight, from white (0) to black (the largest,
          as the page's colour setting scales it);
          <span class="key" data-colour="up"></span> red, more after the replacement;
          <span class="key" data-colour="down"></span> blue, less after it (the difference map and the change
          column alike).</p>
        <div class="views" id="replace-maps"></div>
        <p id="replace-predicts" class="muted"></p>
        <table id="replace-predictions"></table>
        <p id="replace-heads" class="muted"></p>
      </div>
      <div id="ablate-box">
        <h3>Switch heads off</h3>
        <div class="row">
          <label>ablation <select id="ablate-mode"><option value="zero">zero (the head outputs 0)</option>
            <option value="mean">mean (its mean output over the text)</option></select></label>
          <button id="ablate" type="button">Switch off each head in turn</button>
          <button id="ablate-chosen" type="button" disabled>Switch off the ticked heads together</button>
        </div>
        <p id="ablate-summary"></p>
        <div class="table-scroll"><table id="ablation"></table></div>
        <table id="ablate-next"></table>
      </div>`;
    $("result").append(section);
    // the first screen's way down to the heads' switches: the section is below the model view and statistics
    const jump = el("button", {id: "to-ablate", type: "button"}, "Switch heads off \u2193");
    jump.addEventListener("click", () => $("ablate-box").scrollIntoView({block: "start"}));
    $("to-model-view").after(jump);
    $("iv-layer").addEventListener("change", () => { ours.layer = +$("iv-layer").value; headOptions(); neuronSoon(); });
    $("iv-head").addEventListener("change", () => { ours.head = +$("iv-head").value; neuronSoon(); });
    $("neuron").addEventListener("mousemove", pointNeuron);
    $("neuron-box").addEventListener("toggle", () => { ours.neuronKey = null; neuronSoon(); });
    $("replace").addEventListener("click", replace);
    $("replacement").addEventListener("keydown", (e) => { if (e.key === "Enter") replace(); });
    $("ablate").addEventListener("click", () => ablate(false));
    $("ablate-chosen").addEventListener("click", () => ablate(true));
  }

  function problem(message) {
    $("iv-error").hidden = !message;
    $("iv-error").textContent = message || "";
  }

  async function ask(kind, path, body) {  // the reply, or null when a newer request of its kind replaced it
    const ticket = begin(kind);
    $("iv-status").textContent = "computing\u2026";
    try {
      const reply = await (await api(path, body, ticket.signal)).json();
      if (!latest(kind, ticket)) return null;
      problem("");
      return reply;
    } catch (error) {
      if (latest(kind, ticket) && error.name !== "AbortError") problem(error.message);
      return null;
    } finally {
      if (latest(kind, ticket)) { pending[kind] = null; $("iv-status").textContent = ""; }
    }
  }

  // -------------------------------------------------------------------------------------------------------------
  // following the page: a new analysis resets everything; a chosen cell or token moves the neuron view

  function layersOfView() {
    const v = state.analysis && state.analysis.attention.self;
    return v && v.layers ? v.layers : null;
  }

  function headOptions() {
    const layers = layersOfView(), heads = layers ? layers[ours.layer].length : 0;
    $("iv-head").replaceChildren(...[...Array(heads).keys()].map((h) => el("option", {value: h}, `${h + 1}`)));
    ours.head = Math.min(ours.head, heads - 1);
    $("iv-head").value = ours.head;
  }

  function reset() {
    const layers = layersOfView(), tokens = state.analysis.tokens;
    for (const kind of KINDS) if (pending[kind]) { pending[kind].abort(); pending[kind] = null; }  // old text
    $("iv-status").textContent = "";
    ours.analysis = state.analysis; ours.ablation = null; ours.token = null; ours.neuronKey = null;
    ours.chosen = new Set();
    ours.layer = state.cell ? state.cell.layer : state.layer;
    ours.head = state.cell ? state.cell.head : Math.min(...state.heads);
    $("iv-layer").replaceChildren(...layers.map((_, l) => el("option", {value: l}, `${l + 1}`)));
    $("iv-layer").value = ours.layer;
    headOptions();
    $("replace-position").replaceChildren(...tokens.map((t, i) => el("option", {value: i}, `${i + 1}: ${shown(t)}`)));
    // a long text's neuron view is tall (a row per token): it opens when asked for
    $("neuron-box").open = tokens.length <= NEURON_OPEN_TOKENS;
    $("replacement").placeholder = ours.available.mask_token || "one token";
    for (const id of ["neuron", "replace-maps", "replace-predictions", "ablation", "ablate-next"]) {
      $(id).replaceChildren();
    }
    for (const id of ["replace-predicts", "replace-heads", "ablate-summary"]) $(id).textContent = "";
    $("ablate-chosen").disabled = true;
    problem("");
  }

  function drawn() {
    const a = ours.available;
    const shows = a && !state.offline && state.analysis && layersOfView() && (a.neuron || a.replace || a.ablate);
    if (!$("intervene")) build();
    $("intervene").hidden = !shows;
    $("to-ablate").hidden = !shows || !a.ablate;
    if (!shows) return;
    if (ours.analysis !== state.analysis) reset();
    else if (state.cell && (state.cell.layer !== ours.cellLayer || state.cell.head !== ours.cellHead)) {
      ours.layer = state.cell.layer; ours.head = state.cell.head;  // a head opened in the page: look at it here
      $("iv-layer").value = ours.layer; headOptions();
    }
    if (state.cell) { ours.cellLayer = state.cell.layer; ours.cellHead = state.cell.head; }
    $("neuron-box").hidden = !a.neuron;
    $("replace-box").hidden = !a.replace;
    $("ablate-box").hidden = !a.ablate;
    $("iv-token").textContent = shown(state.analysis.tokens[state.token]);
    if (state.token !== ours.token) $("replace-position").value = state.token;  // a new token chosen: offer it
    ours.token = state.token;
    neuronSoon();
  }

  function cleared() {
    if ($("intervene")) $("intervene").hidden = true;
    for (const kind of KINDS) if (pending[kind]) { pending[kind].abort(); pending[kind] = null; }
    clearTimeout(ours.timer);
    ours.analysis = null;
  }

  // -------------------------------------------------------------------------------------------------------------
  // the neuron view

  function neuronSoon() {  // hovering over tokens moves the query quickly: ask once it rests for a moment
    if (!ours.available || !ours.available.neuron || !$("neuron-box").open) return;  // closed: nothing to draw
    const body = {text: state.request.text, layer: ours.layer, head: ours.head, token: state.token};
    const key = JSON.stringify(body);
    if (key === ours.neuronKey) return;
    ours.neuronKey = key;
    clearTimeout(ours.timer);
    ours.timer = setTimeout(async () => {
      const reply = await ask("neuron", "/api/neuron", body);
      if (reply) drawNeuron(reply);
    }, 120);
  }

  function diverging(value, peak) {  // [r, g, b, 255]: blue (negative) - white - red (positive), by |value| / peak
    const f = Math.min(1, Math.abs(value) / (peak || 1)), far = value < 0 ? BLUE : RED;
    return [...far.map((c) => Math.round(255 + (c - 255) * f)), 255];
  }
  function peakOf(rows, magnitude = Math.abs) {  // the largest |value| (no spread: a 1,024 x 1,024 map is too long)
    let peak = 1e-12;
    for (const row of rows) for (const value of row) peak = Math.max(peak, magnitude(value));
    return peak;
  }

  function raster(rows, rgba) {  // a canvas with one pixel per number, coloured by rgba(value) -> [r, g, b, a]
    const canvas = el("canvas", {width: rows[0].length, height: rows.length});
    const context = canvas.getContext("2d"), image = context.createImageData(canvas.width, canvas.height);
    rows.forEach((row, i) => row.forEach((value, j) => image.data.set(rgba(value), 4 * (i * canvas.width + j))));
    context.putImageData(image, 0, 0);
    return canvas;
  }

  function block(rows, x, y, width, peak, kind) {  // vectors, one per row, as one image: fast at 1,024 tokens
    return svg("image", {href: raster(rows, (v) => diverging(v, peak)).toDataURL(), x, y, class: kind,
      width: rows[0].length * width, height: rows.length * CELL, preserveAspectRatio: "none"});
  }

  function drawNeuron(n) {
    const root = $("neuron"), hd = n.head_dim, width = Math.max(3, Math.min(10, 240 / hd));
    const left = Math.max(40, labelWidth(n.tokens)), gap = 24;
    const xKeys = left, xProducts = xKeys + Math.max(hd * width, 40) + gap;
    const xScore = xProducts + Math.max(hd * width, 50) + gap;
    const top = 3 * CELL, vectors = peakOf([n.query, ...n.keys]), products = peakOf(n.products);
    ours.neuron = {n, xKeys, xProducts, width, top};
    root.replaceChildren();
    root.setAttribute("width", xScore + 330);
    root.setAttribute("height", top + CELL * n.tokens.length + 8);
    root.setAttribute("aria-label", `neuron view of layer ${n.layer + 1}, head ${n.head + 1}, query ` +
      `${n.token + 1} (${n.tokens[n.token]})`);
    root.append(svg("rect", {width: "100%", height: "100%", fill: "#ffffff"}));
    const heading = (x, text) => root.append(svg("text", {x, y: CELL * 0.8, class: "heading"}, text));
    heading(xKeys, "k");
    heading(xProducts, "q \u00d7 k");
    heading(xScore, "q\u00b7k");
    heading(xScore + 70, n.has_bias ? "scaled + bias" : "scaled");
    heading(xScore + 170, "softmax");
    root.append(block([n.query], xKeys, CELL + 2, width, vectors, "query"),
      svg("text", {x: left - 6, y: CELL * 1.8, "text-anchor": "end", class: "selected"}, "q"),
      block(n.keys, xKeys, top, width, vectors, "keys"),
      block(n.products, xProducts, top, width, products, "products"));
    n.tokens.forEach((token, j) => root.append(neuronRow(n, token, j, top + j * CELL, left, xScore)));
  }

  function neuronRow(n, token, j, y, left, xScore) {  // one key's label, score, scaled score and weight
    const allowed = n.allowed[j], text = (x, value) => svg("text", {x, y: y + CELL * 0.7}, value);
    const row = svg("g", {class: "neuron-row" + (allowed ? "" : " masked"), "data-key": j,
      "data-score": n.scores[j], "data-scaled": n.scaled[j], "data-weight": allowed ? n.weights[j] : 0});
    row.append(svg("text", {x: left - 6, y: y + CELL * 0.7, "text-anchor": "end",
      class: j === n.token ? "selected" : ""}, shown(token)));
    if (!allowed) row.append(svg("rect", {x: left, y, width: xScore - left, height: CELL, class: "veil"}));
    row.append(text(xScore, n.scores[j].toFixed(3)), text(xScore + 70, allowed ? n.scaled[j].toFixed(3) : "masked"));
    if (allowed) {
      row.append(svg("rect", {x: xScore + 170, y: y + 2, height: CELL - 6, width: 100 * n.weights[j],
        fill: "#555555", class: "weight-bar"}), text(xScore + 276, n.weights[j].toFixed(3)));  // an amount: grey
    }
    return row;
  }

  function pointNeuron(event) {  // the numbers under the mouse: one dimension of a key and of its product
    if (!ours.neuron) return;
    const {n, xKeys, xProducts, width, top} = ours.neuron, box = $("neuron").getBoundingClientRect();
    const x = event.clientX - box.left, j = Math.floor((event.clientY - box.top - top) / CELL);
    const inKeys = x >= xKeys && x < xKeys + n.head_dim * width, inProducts = x >= xProducts &&
      x < xProducts + n.head_dim * width;
    if (j < 0 || j >= n.tokens.length || !(inKeys || inProducts)) return;
    const d = Math.floor((x - (inKeys ? xKeys : xProducts)) / width);
    $("neuron-info").textContent = `key ${j + 1} (${shown(n.tokens[j])}), dimension ${d + 1}: ` +
      `q = ${n.query[d].toFixed(4)}, k = ${n.keys[j][d].toFixed(4)}, q \u00d7 k = ${n.products[j][d].toFixed(4)}`;
  }

  // -------------------------------------------------------------------------------------------------------------
  // replacing a token

  async function replace() {
    const body = {text: state.request.text, position: +$("replace-position").value, layer: ours.layer,
      head: ours.head, top_k: 5};
    if ($("replacement").value) body.replacement = $("replacement").value;
    const reply = await ask("replace", "/api/replace", body);
    if (reply) drawReplacement(reply);
  }

  function heatMap(title, rows, rgba) {  // one (queries x keys) map as a canvas, scaled up
    const figure = el("figure", {class: "replace-map"}), canvas = raster(rows, rgba);
    canvas.setAttribute("aria-label", title);
    canvas.style.width = canvas.style.height = `${Math.max(120, Math.min(320, 12 * rows.length))}px`;
    figure.append(el("figcaption", {}, title), canvas);
    return figure;
  }

  function drawReplacement(r) {  // weights scaled as the page's maps are (explore.js, `largest`)
    const peak = Math.max(largest(r.before || [[0]]), largest(r.after || [[0]])) || 1;
    const change = peakOf(r.difference || [[0]]);
    const scale = (w) => [...RAMP[0].map((c, i) => Math.round(c + (RAMP[1][i] - c) * Math.min(1, Math.max(0, w) /
      peak))), 255];
    const where = `layer ${r.layer + 1}, head ${r.head + 1}`;
    $("replace-maps").replaceChildren(...(r.before ? [
      heatMap(`before: \u201c${shown(r.tokens[r.position])}\u201d (${where})`, r.before, scale),
      heatMap(`after: \u201c${shown(r.edited_tokens[r.position])}\u201d`, r.after, scale),
      heatMap(`difference (after \u2212 before; red more, blue less, up to ${change.toFixed(3)})`, r.difference,
        (w) => diverging(w, change)),
    ] : [el("p", {class: "note"}, r.note)]));
    $("replace-predicts").textContent = r.predicts ? `Predictions: ${r.predicts}, before and after` : "";
    const table = $("replace-predictions");
    table.replaceChildren();
    if (r.predictions) {
      const head = el("tr");
      head.append(...["token", "before", "after", "change"].map((t) => el("th", {}, t)));
      table.append(el("thead", {}), el("tbody", {}));
      table.firstChild.append(head);
      for (const p of r.predictions) {
        const tr = el("tr", {"data-id": p.id});
        tr.append(el("td", {class: "token"}, shown(p.token)), el("td", {"data-key": "before"}, p.before.toFixed(4)),
          el("td", {"data-key": "after"}, p.after.toFixed(4)),
          el("td", {"data-key": "change", class: p.change < 0 ? "down" : p.change > 0 ? "up" : ""},
            fmt(p.change, true)));  // the difference map's colours: red more, blue less
        table.lastChild.append(tr);
      }
    }
    $("replace-heads").textContent = r.change ? "Heads whose attention moved most (mean total variation per " +
      "query): " + r.change.slice(0, 5).map((c) => `L${c.layer + 1} H${c.head + 1} ${c.change.toFixed(3)}`)
      .join(", ") : "";
  }

  // -------------------------------------------------------------------------------------------------------------
  // switching heads off

  const COLUMNS = [["layer", "layer"], ["head", "head"], ["loss", "loss"], ["delta", "\u0394 loss"],
    ["kl", "KL next token"], ["p_top", "p(clean top-1)"], ["top", "top-1 after"]];
  const EXPLAINED = {  // each column's meaning, as its header's tooltip
    loss: "the text's loss (nats per token) with this head off",
    delta: "the loss with this head off minus the loss with every head on",
    kl: "KL(every head on || this head off) of the next token after the text",
    p_top: "the probability, with this head off, of the token that is the top-1 next token with every head on " +
      "(the clean top-1)",
    top: "the top-1 next token with this head off",
  };

  async function ablate(together) {
    const body = {text: state.request.text, mode: $("ablate-mode").value, top_k: 5};
    if (together) body.heads = [...ours.chosen].map((key) => key.split(".").map(Number));
    const reply = await ask("ablate", "/api/ablate", body);
    if (!reply) return;
    ours.ablation = reply;
    drawAblation();
  }

  function drawAblation() {
    const a = ours.ablation, table = $("ablation");
    $("ablate-summary").textContent = `Loss of the text: ${a.loss.toFixed(4)} nats per token with every head ` +
      `on; ${a.mode} ablation of each head alone below (click a column to sort; tick heads to switch off together). ` +
      "p(clean top-1): the probability, with the head off, of the next token that is the top-1 with every head on.";
    const head = el("tr");
    head.append(el("th", {}, "off"));
    for (const [key, title] of COLUMNS) {
      const sorted = ours.sort.key === key, th = el("th", {"data-key": key, title: EXPLAINED[key] || "",
        class: sorted ? "sorted" + (ours.sort.descending ? "" : " ascending") : ""}, title);
      activate(th, `ablate-sort-${key}`, () => {
        ours.sort = {key, descending: sorted ? !ours.sort.descending : true};
        drawAblation();
      });
      head.append(th);
    }
    const rows = [...a.heads];
    if (ours.sort.key) {
      const value = (row) => row[ours.sort.key], order = ours.sort.descending ? -1 : 1;
      rows.sort((x, y) => order * (value(x) < value(y) ? -1 : value(x) > value(y) ? 1 : 0));
    }
    const body = el("tbody");
    for (const row of rows) body.append(ablationRow(row));
    table.replaceChildren(el("thead"), body);
    table.firstChild.append(head);
    drawChosen();
  }

  function ablationRow(row) {
    const key = `${row.layer}.${row.head}`, tr = el("tr", {"data-layer": row.layer, "data-head": row.head});
    const box = el("input", {type: "checkbox", "aria-label": `switch off layer ${row.layer + 1}, head ` +
      `${row.head + 1} with the other ticked heads`});
    box.checked = ours.chosen.has(key);
    box.addEventListener("change", () => {
      box.checked ? ours.chosen.add(key) : ours.chosen.delete(key);
      $("ablate-chosen").disabled = !ours.chosen.size;
    });
    const cell = el("td");
    cell.append(box);
    tr.append(cell, ...COLUMNS.map(([k]) => el("td", {"data-key": k, "data-value": row[k]}, k === "layer" ||
      k === "head" ? `${row[k] + 1}` : k === "top" ? shown(row[k]) : fmt(row[k], k === "delta"))));
    return tr;
  }

  function drawChosen() {
    const c = ours.ablation.chosen, table = $("ablate-next");
    $("ablate-chosen").disabled = !ours.chosen.size;
    table.replaceChildren();
    if (!c) return;
    const names = c.heads.map(([l, h]) => `L${l + 1} H${h + 1}`).join(", ");
    const caption = el("caption", {"data-loss": c.loss}, `${names} off together: loss ${c.loss.toFixed(4)} ` +
      `(${fmt(c.delta, true)}), KL of the next token ${fmt(c.kl)}`);
    const head = el("tr");
    head.append(...["next token", "every head on", "heads off", "change"].map((t) => el("th", {}, t)));
    const body = el("tbody");
    for (const p of c.next) {
      const tr = el("tr", {"data-id": p.id});
      tr.append(el("td", {class: "token"}, shown(p.token)), el("td", {}, p.before.toFixed(4)),
        el("td", {"data-key": "after"}, p.after.toFixed(4)), el("td", {}, fmt(p.change, true)));
      body.append(tr);
    }
    table.append(caption, el("thead"), body);
    table.children[1].append(head);
  }

  async function start() {
    if ($("kqv-data")) return;  // a saved HTML file: no model to ask
    for (const type of ["mouseover", "click", "keydown"]) {  // a token chosen in the head view: look at it here
      $("head-view").addEventListener(type, () => setTimeout(drawn));
    }
    try {
      ours.available = await (await api("/api/interventions")).json();
    } catch (error) {
      return;  // the page itself reports a server that does not answer
    }
    if (state.analysis) drawn();
  }

  start();
  return {drawn, cleared};
})();
window.intervene = intervene;
