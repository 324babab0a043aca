// sao inspect: the trajectory inspector (inlined into every report; reads the JSON in #sao-data).
// The list: sortable columns, filters by step, reward and prompt. One trajectory: its tokens coloured by a
// chosen quantity, observation spans marked as the advantage estimator treats them, band-masked tokens
// struck through, every number of a token on hover (pinned on click), a sparkline of value and advantage
// per turn, and for group presets the group's rewards.
(function () {
  "use strict";
  const DOC = JSON.parse(document.getElementById("sao-data").textContent);
  const TRAJS = DOC.trajectories || [];
  const META = DOC.meta || {};
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c);
    return node;
  };
  const fmt = (x, digits = 4) => {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return String(x);
    return Number(x.toPrecision(digits)).toString();
  };

  // ---- per-token quantities the view can colour by -------------------------------------------------
  const QUANTITIES = {
    advantage: { label: "advantage", kind: "diverging" },
    ratio: { label: "DIS / PPO ratio", kind: "ratio" },
    value_after: { label: "value (used by the advantages)", kind: "sequential" },
    value_before: { label: "value before the critic steps", kind: "sequential" },
    return: { label: "return (critic target)", kind: "sequential" },
    version: { label: "policy version", kind: "sequential" },
    lag: { label: "lag (trained version − version)", kind: "sequential" },
    entropy: { label: "entropy", kind: "sequential" },
    logprob: { label: "trainer log-prob", kind: "sequential" },
    rollout_logprob: { label: "rollout log-prob", kind: "sequential" },
  };
  const STATE_NAMES = META.policy_loss === "ppo_clip"
    ? { "-1": "clipped low (r < 1−ε_low, Â < 0)", "0": "unclipped", "1": "clipped high (r > 1+ε_high, Â > 0)" }
    : { "-1": "below the band (r ≤ 1−ε_low): dropped", "0": "inside the band", "1": "above the band (r ≥ 1+ε_high): dropped" };
  const OBS_NOTE = {
    skip_observation_gae: "observation: skipped by the GAE (no value, no advantage)",
    token_gae: "observation: inside the GAE recursion, not trained",
    step_gae: "observation: outside every step, not trained",
  }[META.advantage] || "observation: not trained";

  function tokenSeries(t, name) {
    const tk = t.tokens || {};
    if (name === "lag") {
      if (t.trained_version === undefined || !tk.version) return null;
      return tk.version.map((v, i) => (tk.role[i] === "a" && v >= 0 ? t.trained_version - v : null));
    }
    if (name === "version") return tk.version ? tk.version.map((v, i) => (tk.role[i] === "a" ? v : null)) : null;
    return tk[name] || null;
  }
  function available(t) {
    return Object.keys(QUANTITIES).filter((q) => {
      const s = tokenSeries(t, q);
      return s && s.some((v) => v !== null && v !== undefined);
    });
  }

  // ---- colours -------------------------------------------------------------------------------------
  function scaleFor(t, q) {
    const s = tokenSeries(t, q) || [];
    const tk = t.tokens;
    const vals = s.filter((v, i) => v !== null && v !== undefined && tk.role[i] === "a");
    const kind = QUANTITIES[q].kind;
    if (!vals.length) return { kind, lo: 0, hi: 1, mag: 1 };
    if (kind === "ratio") {
      const mag = Math.max(1e-6, ...vals.map((v) => Math.abs(Math.log(Math.max(v, 1e-12)))));
      return { kind, mag };
    }
    if (kind === "diverging") return { kind, mag: Math.max(1e-9, ...vals.map(Math.abs)) };
    return { kind, lo: Math.min(...vals), hi: Math.max(...vals) };
  }
  function colour(scale, v) {
    if (v === null || v === undefined) return "transparent";
    let x; // in [-1, 1] for diverging, [0, 1] for sequential
    if (scale.kind === "ratio") x = Math.log(Math.max(v, 1e-12)) / scale.mag;
    else if (scale.kind === "diverging") x = v / scale.mag;
    else x = scale.hi > scale.lo ? (v - scale.lo) / (scale.hi - scale.lo) : 0.5;
    if (scale.kind === "sequential") return `rgba(124, 58, 237, ${(0.08 + 0.62 * x).toFixed(3)})`;
    x = Math.max(-1, Math.min(1, x));
    const a = (0.08 + 0.67 * Math.abs(x)).toFixed(3);
    return x >= 0 ? `rgba(220, 38, 38, ${a})` : `rgba(37, 99, 235, ${a})`;
  }
  function legend(scale, q) {
    const bar = el("span", { class: "bar" });
    let lo, hi;
    if (scale.kind === "sequential") {
      bar.style.background = "linear-gradient(90deg, rgba(124,58,237,0.08), rgba(124,58,237,0.7))";
      lo = fmt(scale.lo); hi = fmt(scale.hi);
    } else {
      bar.style.background = "linear-gradient(90deg, rgba(37,99,235,0.75), rgba(255,255,255,1), rgba(220,38,38,0.75))";
      lo = scale.kind === "ratio" ? fmt(Math.exp(-scale.mag)) : fmt(-scale.mag);
      hi = scale.kind === "ratio" ? fmt(Math.exp(scale.mag)) : fmt(scale.mag);
    }
    return el("span", { class: "legend" }, el("span", { text: `${QUANTITIES[q].label}:` }), el("span", { text: lo }), bar, el("span", { text: hi }));
  }

  // ---- the list ------------------------------------------------------------------------------------
  const COLUMNS = [
    { key: "n", label: "#", get: (t, i) => i },
    { key: "step", label: "step", get: (t) => t.step },
    { key: "prompt_id", label: "prompt", get: (t) => t.prompt_id, left: true },
    { key: "reward", label: "reward", get: (t) => t.reward },
    { key: "length", label: "tokens", get: (t) => t.length },
    { key: "turns", label: "turns", get: (t) => t.turns },
    { key: "lag_mean", label: "lag", get: (t) => t.lag_mean },
    { key: "masked_frac", label: "masked %", get: (t) => (t.masked_frac === null || t.masked_frac === undefined ? null : 100 * t.masked_frac) },
    { key: "finish_reason", label: "finish", get: (t) => t.finish_reason, left: true },
  ];
  let sortKey = "n", sortDir = 1, selected = null;

  function filtered() {
    const step = $("#f-step").value, lo = parseFloat($("#f-rmin").value), hi = parseFloat($("#f-rmax").value);
    const text = $("#f-prompt").value.trim().toLowerCase();
    const maskedOnly = $("#f-masked").checked;
    const rows = [];
    TRAJS.forEach((t, i) => {
      if (step !== "" && String(t.step) !== step) return;
      if (!Number.isNaN(lo) && !(t.reward >= lo)) return;
      if (!Number.isNaN(hi) && !(t.reward <= hi)) return;
      if (text && !String(t.prompt_id).toLowerCase().includes(text)) return;
      if (maskedOnly && !(t.masked_frac > 0)) return;
      rows.push(i);
    });
    const col = COLUMNS.find((c) => c.key === sortKey);
    rows.sort((a, b) => {
      const x = col.get(TRAJS[a], a), y = col.get(TRAJS[b], b);
      if (x === y) return a - b;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    return rows;
  }
  function renderList() {
    const rows = filtered();
    const head = el("tr", {}, ...COLUMNS.map((c) => {
      const th = el("th", { class: (c.left ? "left " : "") + (c.key === sortKey ? (sortDir > 0 ? "sorted-asc" : "sorted-desc") : ""), "data-key": c.key, text: c.label });
      th.addEventListener("click", () => { sortDir = sortKey === c.key ? -sortDir : 1; sortKey = c.key; renderList(); });
      return th;
    }));
    const body = el("tbody");
    for (const i of rows) {
      const t = TRAJS[i];
      const tr = el("tr", { class: "traj-row" + (i === selected ? " selected" : ""), "data-index": String(i) },
        ...COLUMNS.map((c) => el("td", { class: c.left ? "left" : "", text: c.key === "prompt_id" ? String(c.get(t, i)).slice(0, 28) : fmt(c.get(t, i), 3) })));
      tr.addEventListener("click", () => select(i));
      body.append(tr);
    }
    const table = $("#traj-table");
    table.replaceChildren(el("thead", {}, head), body);
    $("#list-count").textContent = `${rows.length} of ${TRAJS.length} trajectories`;
  }
  function setupFilters() {
    const steps = [...new Set(TRAJS.map((t) => t.step).filter((s) => s !== undefined))].sort((a, b) => a - b);
    const sel = $("#f-step");
    sel.append(el("option", { value: "", text: "all" }), ...steps.map((s) => el("option", { value: String(s), text: String(s) })));
    if (!steps.length) sel.disabled = true;
    for (const id of ["#f-step", "#f-rmin", "#f-rmax", "#f-prompt", "#f-masked"]) {
      $(id).addEventListener("input", renderList);
      $(id).addEventListener("change", renderList);
    }
  }

  // ---- one trajectory ------------------------------------------------------------------------------
  function segments(t) {
    const tk = t.tokens, out = [];
    for (let i = 0; i < tk.role.length; i++) {
      const role = tk.role[i], turn = tk.turn ? tk.turn[i] : -1, last = out[out.length - 1];
      if (last && last.role === role && last.turn === turn) last.end = i + 1;
      else out.push({ role, turn, start: i, end: i + 1 });
    }
    return out;
  }
  function tokenNumbers(t, i) {
    const tk = t.tokens, lines = [];
    const text = JSON.stringify(tk.text ? tk.text[i] : "");
    lines.push(`token ${i}  id ${tk.id ? tk.id[i] : "–"}  ${text}`);
    lines.push(`role ${{ p: "prompt", a: "action", o: "observation" }[tk.role[i]]}  turn ${tk.turn ? tk.turn[i] : "–"}`);
    const fields = ["version", "lag", "rollout_logprob", "logprob", "ratio", "state", "entropy", "value_before", "value_after", "return", "advantage", "token_reward", "value_mask"];
    for (const f of fields) {
      const s = f === "lag" ? tokenSeries(t, "lag") : tk[f];
      if (!s) continue;
      let v = s[i];
      if (v === null || v === undefined) continue;
      if (f === "version" && v < 0) continue;
      let shown = fmt(v, 6);
      if (f === "state") shown = `${v} (${STATE_NAMES[String(v)]})`;
      lines.push(`${f.padEnd(16)} ${shown}`);
    }
    return lines.join("\n");
  }
  function sparkline(values, colour) {
    const pts = values.map((v, i) => [i, v]).filter((p) => p[1] !== null && p[1] !== undefined);
    return { pts, colour };
  }
  function sparkSvg(series) {
    const w = 150, h = 28, pad = 2;
    const all = series.flatMap((s) => s.pts.map((p) => p[1]));
    const n = Math.max(2, ...series.map((s) => s.pts.length ? s.pts[s.pts.length - 1][0] + 1 : 0));
    const lo = Math.min(0, ...all), hi = Math.max(0, ...all);
    const y = (v) => (hi > lo ? h - pad - ((v - lo) / (hi - lo)) * (h - 2 * pad) : h / 2);
    const x = (i) => pad + (i / (n - 1)) * (w - 2 * pad);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
    const zero = document.createElementNS(ns, "line");
    zero.setAttribute("x1", 0); zero.setAttribute("x2", w); zero.setAttribute("y1", y(0)); zero.setAttribute("y2", y(0));
    zero.setAttribute("stroke", "#d1d5db"); svg.append(zero);
    for (const s of series) {
      if (!s.pts.length) continue;
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", s.pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
      line.setAttribute("fill", "none"); line.setAttribute("stroke", s.colour); line.setAttribute("stroke-width", "1.5");
      svg.append(line);
    }
    return svg;
  }
  function groupPanel(t) {
    if (!t.group || !t.group.length) return null;
    const rewards = t.group.map((m) => m.reward);
    const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
    const std = Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(rewards.length - 1, 1));
    const kept = new Map(TRAJS.map((x, i) => [x.traj_id + "@" + x.step, i]));
    const members = t.group.map((m) => {
      const j = kept.get(m.traj_id + "@" + t.step);
      const node = el("span", { class: "member" + (m.traj_id === t.traj_id ? " me" : "") + (j !== undefined ? " kept" : ""), title: m.traj_id, text: `${m.traj_id.slice(0, 6)}: ${fmt(m.reward)}` });
      if (j !== undefined && j !== selected) node.addEventListener("click", () => select(j));
      return node;
    });
    return el("div", { class: "group", id: "group-panel" },
      el("div", {}, el("b", { text: `group ${String(t.group_id).slice(0, 12)}` }), ` · ${rewards.length} trajectories · reward mean ${fmt(mean)} · std ${fmt(std)}`),
      el("div", {}, ...members));
  }
  let colourBy = null;
  function select(i) {
    selected = i;
    location.hash = `t=${i}`;
    renderList();
    renderDetail();
  }
  function renderDetail() {
    const box = $("#detail");
    if (selected === null) { box.replaceChildren(el("div", { class: "empty", text: "Click a trajectory in the list." })); return; }
    const t = TRAJS[selected], tk = t.tokens;
    if (!tk || !tk.role) { box.replaceChildren(el("div", { class: "empty", text: "This entry has no tokens." })); return; }
    const qs = available(t);
    if (!qs.includes(colourBy)) colourBy = qs[0] || null;
    const summary = el("div", { class: "summary" });
    const facts = [["trajectory", t.traj_id], ["prompt", t.prompt_id], ["step", t.step], ["trained version", t.trained_version],
      ["reward", t.reward], ["rewards", (t.rewards || []).map((r) => fmt(r)).join(", ")], ["tokens", t.length], ["action tokens", t.action_tokens],
      ["turns", t.turns], ["versions", t.version_min === null ? null : `${t.version_min}–${t.version_max}`], ["lag mean / max", t.lag_mean === undefined ? null : `${fmt(t.lag_mean)} / ${t.lag_max}`],
      ["masked", t.masked_frac === null || t.masked_frac === undefined ? null : `${fmt(100 * t.masked_frac, 3)} %`], ["finish", t.finish_reason],
      ["truncated", t.truncated], ["actor updated", t.actor_updated], ["task", t.task], ["sample", t.sample], ["success", t.success], ["error", t.error], ["session", t.session_id]];
    for (const [k, v] of facts) if (v !== null && v !== undefined && v !== "") summary.append(el("span", {}, el("b", { text: k + ": " }), fmt(v)));
    const controls = el("div", { class: "controls" });
    if (qs.length) {
      const sel = el("select", { id: "colour-by" }, ...qs.map((q) => el("option", { value: q, text: QUANTITIES[q].label })));
      sel.value = colourBy;
      sel.addEventListener("change", () => { colourBy = sel.value; renderDetail(); });
      controls.append(el("label", {}, "colour by ", sel), legend(scaleFor(t, colourBy), colourBy));
    }
    if (tk.state) controls.append(el("span", { class: "legend" }, el("span", { class: "tok masked", text: "tok" }), META.policy_loss === "ppo_clip" ? "clipped by PPO" : "outside the DIS band (dropped)"));
    const scale = colourBy ? scaleFor(t, colourBy) : null;
    const series = colourBy ? tokenSeries(t, colourBy) : null;
    const conv = el("div", { id: "conversation" });
    const panel = el("div", { id: "token-panel" });
    const tooltip = $("#tooltip");
    for (const seg of segments(t)) {
      const cls = { p: "prompt", a: "action", o: "obs" }[seg.role];
      const label = el("div", { class: "seg-label" });
      const item = (text, cls) => el("span", { class: cls || "", text });
      if (seg.role === "p") label.append(item(`prompt · ${seg.end - seg.start} tokens`));
      else if (seg.role === "o") label.append(item(`turn ${seg.turn} · ${OBS_NOTE}`, "obs-note"), item(`${seg.end - seg.start} tokens`));
      else {
        label.append(item(`turn ${seg.turn} · ${seg.end - seg.start} action tokens`));
        const adv = tk.advantage ? tk.advantage.slice(seg.start, seg.end) : null;
        if (adv && adv.length) {
          const constant = adv.every((a) => a !== null && Math.abs(a - adv[0]) <= 1e-6 * Math.max(1, Math.abs(adv[0])));
          const mean = adv.reduce((a, b) => a + (b || 0), 0) / adv.length;
          label.append(item(constant ? `advantage (one per turn) ${fmt(adv[0])}` : `advantage mean ${fmt(mean)}`, "turn-adv"));
        }
        const spark = [];
        if (tk.value_after) spark.push(sparkline(tk.value_after.slice(seg.start, seg.end), "#0d9488"));
        if (tk.advantage) spark.push(sparkline(tk.advantage.slice(seg.start, seg.end), "#ea580c"));
        if (spark.length) label.append(sparkSvg(spark), el("span", { class: "spark-key", text: (tk.value_after ? "value (teal) " : "") + (tk.advantage ? "advantage (orange)" : "") }));
      }
      const toks = el("div", { class: "tokens" });
      for (let i = seg.start; i < seg.end; i++) {
        const text = tk.text ? tk.text[i] : `<${tk.id[i]}>`;
        const span = el("span", { class: "tok", "data-i": String(i) });
        if (text.includes("\n")) { span.append(el("span", { class: "nl", text: "\u21B5" }), text); } else span.textContent = text;
        if (seg.role === "a" && series) span.style.backgroundColor = colour(scale, series[i]);
        if (tk.state && tk.state[i]) { span.classList.add("masked"); span.dataset.state = String(tk.state[i]); }
        span.addEventListener("mouseenter", (e) => { tooltip.textContent = tokenNumbers(t, i); tooltip.style.display = "block"; move(e); });
        span.addEventListener("mousemove", move);
        span.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
        span.addEventListener("click", () => {
          conv.querySelectorAll(".tok.pinned").forEach((n) => n.classList.remove("pinned"));
          span.classList.add("pinned");
          const close = el("span", { class: "close", title: "unpin", text: "\u00D7" });
          close.addEventListener("click", () => { panel.replaceChildren(); span.classList.remove("pinned"); });
          panel.replaceChildren(close, el("div", { class: "numbers", text: tokenNumbers(t, i) }));
        });
        toks.append(span);
      }
      const node = seg.role === "p" ? el("details", { class: "segment prompt", open: "" }, el("summary", { class: "seg-label" }, ...label.childNodes), toks) : el("div", { class: "segment " + cls }, label, toks);
      conv.append(node);
    }
    const nodes = [el("h2", { text: `trajectory #${selected}`, style: "font-size:15px;margin:4px 0" }), summary];
    const group = groupPanel(t);
    if (group) nodes.push(group);
    nodes.push(controls, conv, panel);
    box.replaceChildren(...nodes);
  }
  function move(e) {
    const tip = $("#tooltip");
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 10 : e.clientY + 18;
    tip.style.left = `${x}px`; tip.style.top = `${y}px`;
  }

  // ---- the run's weight checks: push probe per replica over versions, lag-0 mismatch over steps -------
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
  function lineChart(series, threshold, xLabel) {
    const w = 460, h = 120, left = 46, right = 8, top = 6, bottom = 18, ns = "http://www.w3.org/2000/svg";
    const pts = series.flatMap((s) => s.pts);
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "chart");
    if (!pts.length) return svg;
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]).concat(threshold === null ? [] : [threshold]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(...ys, 1e-12);
    const x = (v) => left + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (w - left - right);
    const y = (v) => top + (1 - Math.min(v, y1) / y1) * (h - top - bottom);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
    };
    add("rect", { x: left, y: top, width: w - left - right, height: h - top - bottom, fill: "none", stroke: "#d1d5db" });
    add("text", { x: left - 4, y: top + 9, "text-anchor": "end", class: "axis" }, fmt(y1, 3));
    add("text", { x: left - 4, y: h - bottom, "text-anchor": "end", class: "axis" }, "0");
    add("text", { x: left, y: h - 4, class: "axis" }, `${xLabel} ${x0}`);
    add("text", { x: w - right, y: h - 4, "text-anchor": "end", class: "axis" }, String(x1));
    if (threshold !== null) add("line", { x1: left, x2: w - right, y1: y(threshold), y2: y(threshold), stroke: "#b91c1c", "stroke-dasharray": "4 3" });
    for (const s of series) {
      if (!s.pts.length) continue;
      add("polyline", { points: s.pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: s.colour, "stroke-width": "1.5" });
      for (const p of s.pts) add("circle", { cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: "1.8", fill: s.colour });
    }
    return svg;
  }
  function key(series, extra) {
    return el("div", { class: "chart-key" }, ...series.map((s) => el("span", { style: `color:${s.colour}`, text: "\u25A0 " + s.name })), ...(extra ? [el("span", { text: extra })] : []));
  }
  function probePanel(wc, threshold) {
    const num = (v) => (typeof v === "number" ? v : null);
    let failing = 0;
    const head = el("tr", {}, ...["replica", "pushes checked", "last version", "last mean |Δ|", "worst mean |Δ|", "at version", "worst max |Δ|", "over threshold"].map((t, i) => el("th", { class: i ? "" : "left", text: t })));
    const body = el("tbody");
    const series = [];
    wc.replicas.forEach((name, i) => {
      const pts = wc.probe.filter((p) => num(p.mean[name]) !== null);
      const last = pts[pts.length - 1];
      let worst = null;
      for (const p of pts) if (worst === null || p.mean[name] > worst.mean[name]) worst = p;
      const maxes = pts.map((p) => num(p.max[name])).filter((v) => v !== null);
      const over = threshold === null ? null : pts.filter((p) => p.mean[name] > threshold).length;
      failing += over || 0;
      body.append(el("tr", { class: over ? "check-failed" : "", "data-replica": name },
        ...[name, pts.length, last && last.version, last && last.mean[name], worst && worst.mean[name], worst && worst.version, maxes.length ? Math.max(...maxes) : null, over]
          .map((v, j) => el("td", { class: j ? "" : "left", text: fmt(v, 3) }))));
      series.push({ name, colour: PALETTE[i % PALETTE.length], pts: pts.map((p) => [p.version ?? p.step, p.mean[name]]) });
    });
    const note = threshold === null ? "" : `threshold ${fmt(threshold)} (dashed)`;
    const node = el("div", { class: "check-block", id: "probe-panel" },
      el("h3", { text: "push probe: mean |log p_engine − log p_trainer| per replica, by pushed version" }),
      el("table", { id: "probe-table" }, el("thead", {}, head), body), lineChart(series, threshold, "version"), key(series, note));
    return { node, failing };
  }
  function mismatchPanel(wc, drift) {
    const rows = wc.mismatch.filter((m) => typeof m.abs_diff === "number");
    const ratios = wc.mismatch.filter((m) => typeof m.drift_ratio === "number");
    const lastRatio = ratios.length ? ratios[ratios.length - 1].drift_ratio : null;
    const facts = [["steps with lag-0 tokens", rows.length], ["first mean |Δ|", rows.length ? rows[0].abs_diff : null],
      ["last mean |Δ|", rows.length ? rows[rows.length - 1].abs_diff : null], ["max mean |Δ|", rows.length ? Math.max(...rows.map((m) => m.abs_diff)) : null],
      ["last k3 KL", rows.length ? rows[rows.length - 1].k3 : null], ["drift ratio", lastRatio], ["alarm factor", drift.factor ?? null]];
    const summary = el("div", { class: "summary", id: "mismatch-summary" });
    for (const [k, v] of facts) if (v !== null && v !== undefined) summary.append(el("span", {}, el("b", { text: k + ": " }), fmt(v, 3)));
    const series = [{ name: "mean |Δ log-prob|", colour: "#2563eb", pts: rows.map((m) => [m.step, m.abs_diff]) },
      { name: "k3 KL", colour: "#ea580c", pts: rows.filter((m) => typeof m.k3 === "number").map((m) => [m.step, m.k3]) }];
    const drifting = lastRatio !== null && typeof drift.factor === "number" && lastRatio > drift.factor;
    const node = el("div", { class: "check-block", id: "mismatch-panel" },
      el("h3", { text: "lag-0 mismatch: engine vs trainer log-probs on tokens sampled at the trainer's version, by step" }),
      summary, lineChart(series, null, "step"), key(series));
    return { node, drifting };
  }
  function renderChecks() {
    const wc = DOC.weight_checks, box = $("#weight-checks");
    if (!wc) return;
    const pc = wc.push_check || {}, drift = wc.mismatch_drift || {};
    const threshold = typeof pc.threshold === "number" ? pc.threshold : null;
    const parts = [], notes = [];
    let alarm = false;
    if (wc.probe.length) {
      const p = probePanel(wc, threshold);
      parts.push(p.node);
      notes.push(`${wc.probe.length} pushes probed on ${wc.replicas.length} replica(s)` + (p.failing ? `, ${p.failing} over the threshold` : ""));
      alarm = alarm || p.failing > 0;
    }
    if (wc.mismatch.length) {
      const m = mismatchPanel(wc, drift);
      parts.push(m.node);
      notes.push(`lag-0 mismatch over ${wc.mismatch.length} steps` + (m.drifting ? ", drifting" : ""));
      alarm = alarm || m.drifting;
    }
    box.replaceChildren(el("summary", { class: alarm ? "alarm" : "", text: "weight sync: " + notes.join(" · ") }), ...parts);
    box.hidden = false;
    if (alarm) box.open = true;
  }

  // ---- start ---------------------------------------------------------------------------------------
  renderChecks();
  setupFilters();
  const m = /t=(\d+)/.exec(location.hash);
  if (m && +m[1] < TRAJS.length) selected = +m[1];
  renderList();
  renderDetail();
  document.body.dataset.ready = "1";
})();
