// The report's views, rendered on demand from the embedded JSON. Every text
// from a model, a tool or a dataset is set with textContent (el/append below),
// never as markup, so a prompt holding a script element is shown and never run.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("evalreplay-data").textContent);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PAGE = 100;
  const TASKS = DATA.tasks;
  const BY_NAME = new Map(TASKS.map((t) => [t.name, t]));
  const FLIPS = new Map();
  if (DATA.compare) {
    for (const t of DATA.compare.tasks) FLIPS.set(t.task, new Set(t.flips.map((f) => f.instance_id)));
  }
  const state = { task: null, metric: null, filter: "all", search: "", min: "", max: "", sort: null, desc: false, shown: PAGE };
  const searchText = new WeakMap();

  function append(node, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      node.append(typeof kid === "object" ? kid : String(kid));
    }
    return node;
  }
  function attrs(node, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    return node;
  }
  function el(tag, props, ...kids) {
    return append(attrs(document.createElement(tag), props), kids);
  }
  function svg(tag, props, ...kids) {
    return append(attrs(document.createElementNS(SVG_NS, tag), props), kids);
  }
  function fmt(x, digits) {
    if (typeof x !== "number" || !isFinite(x)) return x === null || x === undefined ? "-" : String(x);
    return Math.abs(x) >= 100 ? x.toFixed(1) : x.toFixed(digits === undefined ? 4 : digits);
  }
  function json(x) {
    return JSON.stringify(x, null, 2);
  }
  function interval(ci) {
    return Array.isArray(ci) ? "[" + fmt(ci[0]) + ", " + fmt(ci[1]) + "]" : "";
  }
  function contentText(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map((p) => (p && typeof p.text === "string" ? p.text : "")).join("\n");
    return content === null || content === undefined ? "" : json(content);
  }
  function askedText(s) {  // an lm-eval task's document says what was asked (its prompt opens with examples)
    return s.doc ? JSON.stringify(s.doc) : promptText(s);
  }
  function promptText(s) {
    if (typeof s.prompt === "string") return s.prompt;
    if (Array.isArray(s.prompt)) return s.prompt.map((m) => contentText(m && m.content)).join("\n");
    return "";
  }
  function excerpt(text, n) {
    const line = String(text || "").replace(/\s+/g, " ").trim();
    return line.length > n ? line.slice(0, n - 1) + "…" : line;
  }
  function pick(gen) {
    if (!gen || !Array.isArray(gen.ll) || !gen.ll.length) return -1;
    let best = 0;
    gen.ll.forEach((pair, i) => { if (pair[0] > gen.ll[best][0]) best = i; });
    return best;
  }
  function answerOf(s) {
    const gen = s.gens[0];
    if (!gen) return "";
    const i = pick(gen);
    return i >= 0 && s.choices ? s.choices[i] : gen.text;
  }
  function mainMetric(task) {
    // The one chosen in the samples view, else the first that reads as a share
    // right (a value in [0, 1], not pass@k / maj@k), else the first.
    if (task.metrics.some((m) => m.name === state.metric)) return state.metric;
    const share = task.metrics.find((m) => !/^(pass|maj)@/.test(m.name) && m.value >= 0 && m.value <= 1);
    return share ? share.name : task.metrics.length ? task.metrics[0].name : null;
  }
  function mainScore(task, scores) {
    if (!scores) return undefined;
    const m = mainMetric(task);
    if (m !== null && typeof scores[m] === "number") return scores[m];
    const first = Object.values(scores).find((v) => typeof v === "number");
    return first;
  }
  function go(hash) {
    location.hash = hash;
  }
  function link(hash, text) {
    return el("a", { href: "#" + hash }, text);
  }

  // ------------------------------------------------------------ charts (inline SVG)
  function intervalBar(value, ci, lo, hi) {
    const w = 220, h = 18, pad = 6;
    const x = (v) => pad + ((v - lo) / (hi - lo || 1)) * (w - 2 * pad);
    const g = svg("svg", { width: w, height: h, class: "interval-bar", role: "img" });
    g.append(svg("line", { x1: pad, x2: w - pad, y1: h / 2, y2: h / 2, stroke: "#d6dce2" }));
    if (Array.isArray(ci) && typeof ci[0] === "number" && typeof ci[1] === "number") {
      g.append(svg("line", { x1: x(ci[0]), x2: x(ci[1]), y1: h / 2, y2: h / 2, stroke: "#2456a6", "stroke-width": 4 }));
    }
    if (typeof value === "number") g.append(svg("circle", { cx: x(value), cy: h / 2, r: 4, fill: "#1d2329" }));
    return g;
  }
  function chart(points, opts) {
    // points: [{x, y, lo, hi, label}]; one <circle class=opts.cls> per point.
    const w = 560, h = 260, left = 56, right = 48, top = 14, bottom = 36;
    const ys = points.flatMap((p) => [p.y, p.lo, p.hi]).concat(opts.lines ? opts.lines.map((l) => l.y) : [])
      .filter((v) => typeof v === "number");
    let ylo = Math.min(...ys), yhi = Math.max(...ys);
    if (opts.unit) { ylo = Math.min(0, ylo); yhi = Math.max(1, yhi); }
    if (ylo === yhi) { ylo -= 1; yhi += 1; }
    const xs = points.map((p) => p.x);
    const xlo = Math.min(...xs), xhi = Math.max(...xs);
    const X = (v) => left + (xhi === xlo ? 0.5 : (v - xlo) / (xhi - xlo)) * (w - left - right);
    const Y = (v) => top + (1 - (v - ylo) / (yhi - ylo)) * (h - top - bottom);
    const g = svg("svg", { width: w, height: h, class: opts.cls + "-chart", role: "img" });
    g.append(svg("line", { x1: left, x2: left, y1: top, y2: h - bottom, stroke: "#5d6873" }));
    g.append(svg("line", { x1: left, x2: w - right, y1: h - bottom, y2: h - bottom, stroke: "#5d6873" }));
    for (const v of [ylo, (ylo + yhi) / 2, yhi]) {
      g.append(svg("text", { x: left - 6, y: Y(v) + 4, "text-anchor": "end" }, fmt(v, 2)));
    }
    for (const l of opts.lines || []) {
      g.append(svg("line", { x1: left, x2: w - right, y1: Y(l.y), y2: Y(l.y), stroke: "#c9ced4", "stroke-dasharray": "4 3" }));
      g.append(svg("text", { x: w - right, y: Y(l.y) - 3, "text-anchor": "end" }, l.label));
    }
    const path = points.map((p, i) => (i ? "L" : "M") + X(p.x) + " " + Y(p.y)).join(" ");
    if (points.length > 1) g.append(svg("path", { d: path, fill: "none", stroke: "#2456a6", "stroke-width": 1.5 }));
    for (const p of points) {
      if (typeof p.lo === "number" && typeof p.hi === "number") {
        g.append(svg("line", { x1: X(p.x), x2: X(p.x), y1: Y(p.lo), y2: Y(p.hi), stroke: "#2456a6", "stroke-width": 2, opacity: 0.5 }));
      }
      g.append(svg("circle", { cx: X(p.x), cy: Y(p.y), r: 4, fill: "#2456a6", class: opts.cls + "-point" },
        svg("title", {}, p.label)));
      g.append(svg("text", { x: X(p.x), y: h - bottom + 16, "text-anchor": "middle" }, opts.xlabel + " " + p.x));
    }
    return g;
  }

  // ------------------------------------------------------------ overview
  function overview() {
    const m = DATA.manifest;
    const runs = [...new Set(TASKS.map((t) => t.run).filter(Boolean))];
    const out = [el("h2", {}, "Run"), el("table", { class: "manifest" },
      el("tr", {}, el("th", {}, "model"), el("td", {}, m.model || "-")),
      el("tr", {}, el("th", {}, "provider"), el("td", {}, el("code", {}, JSON.stringify(m.provider)))),
      el("tr", {}, el("th", {}, "run id"), el("td", {}, runs.join(", ") || "-")),
      el("tr", {}, el("th", {}, "written"), el("td", {}, m.written)),
      el("tr", {}, el("th", {}, "run dir"), el("td", {}, DATA.run_dir)),
      Object.entries(m.extra || {}).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, el("code", {}, JSON.stringify(v))))),
    )];
    out.push(el("h2", {}, "Tasks"));
    for (const t of TASKS) {
      const c = t.counts;
      const unit = t.metrics.every((x) => typeof x.value === "number" && x.value >= 0 && x.value <= 1);
      const gate = t.gate ? el("p", { class: t.gate.passed ? "good gate" : "bad gate" }, "gate: " + t.gate.verdict) : null;
      out.push(el("section", { class: "task", "data-task": t.name },
        el("h3", {}, link("samples/" + encodeURIComponent(t.name), t.name), " ", el("span", { class: "muted" }, t.kind)),
        el("p", { class: "counts" },
          (c.instances ?? "-") + " instances, " + (c.items ?? "-") + " items, ",
          el("span", { class: c.failed ? "bad" : "" }, (c.failed ?? 0) + " failed"), ", ",
          (c.missing ?? 0) + " missing, " + (c.generated ?? 0) + " generated, " + (c.reused ?? 0) + " reused",
          t.complete === false ? el("span", { class: "bad" }, " (incomplete)") : null,
          t.sampling ? el("span", { class: "muted" }, " · sampling " + JSON.stringify(t.sampling)) : null),
        gate,
        el("table", { class: "metrics" },
          el("tr", {}, el("th", {}, "metric"), el("th", { class: "num" }, "value"), el("th", {}, "95% interval"), el("th", {}, "")),
          t.metrics.map((x) => {
            const lo = unit ? 0 : Math.min(...[x.value].concat(x.ci95 || []).filter((v) => typeof v === "number"));
            const hi = unit ? 1 : Math.max(...[x.value].concat(x.ci95 || []).filter((v) => typeof v === "number"));
            const span = hi - lo || Math.abs(hi) || 1;
            return el("tr", { class: "metric", "data-metric": x.name },
              el("td", {}, x.name), el("td", { class: "num" }, fmt(x.value)), el("td", {}, interval(x.ci95)),
              el("td", {}, intervalBar(x.value, x.ci95, unit ? 0 : lo - span * 0.1, unit ? 1 : hi + span * 0.1)));
          }))));
    }
    return out;
  }

  // ------------------------------------------------------------ samples
  function matches(task, s) {
    const f = state.filter;
    if (f === "failed" && !s.failed.length) return false;
    const score = mainScore(task, s.scores);
    if (f === "wrong" && !(typeof score === "number" && score < 1)) return false;
    if (f === "flipped" && !(FLIPS.get(task.name) || new Set()).has(s.id)) return false;
    if (state.min !== "" && !(typeof score === "number" && score >= Number(state.min))) return false;
    if (state.max !== "" && !(typeof score === "number" && score <= Number(state.max))) return false;
    if (state.search) {
      let text = searchText.get(s);
      if (text === undefined) {
        text = (s.id + "\n" + (s.doc ? JSON.stringify(s.doc) + "\n" : "") + promptText(s) + "\n" + s.gens.map((g) => g.text).join("\n")).toLowerCase();
        searchText.set(s, text);
      }
      if (!text.includes(state.search)) return false;
    }
    return true;
  }
  const SORTS = {
    id: (t, s) => s.id, stage: (t, s) => s.stage, score: (t, s) => mainScore(t, s.scores) ?? -Infinity,
    tokens: (t, s) => s.gens.reduce((n, g) => n + (g.ct || 0), 0),
  };
  function samples(taskName) {
    const task = BY_NAME.get(taskName) || TASKS[0];
    if (!task) return [el("p", {}, "no tasks")];
    if (state.task !== task.name) Object.assign(state, { task: task.name, shown: PAGE, sort: null });
    let rows = task.samples.filter((s) => matches(task, s));
    if (state.sort) {
      const key = SORTS[state.sort];
      rows = rows.map((s) => [key(task, s), s]).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)).map((p) => p[1]);
      if (state.desc) rows.reverse();
    }
    const body = el("tbody", {});
    const more = el("button", { id: "more", onclick: () => { state.shown += PAGE * 5; route(); } }, "show more");
    rows.slice(0, state.shown).forEach((s) => body.append(sampleRow(task, s)));
    const rerender = () => { state.shown = PAGE; route(); };
    const header = (key, label, cls) => el("th", { class: "sortable " + (cls || ""), "data-sort": key, onclick: () => {
      state.desc = state.sort === key ? !state.desc : false; state.sort = key; route(); } }, label);
    const filter = el("select", { id: "filter", onchange: (e) => { state.filter = e.target.value; rerender(); } },
      ["all", "failed", "wrong"].concat(DATA.compare ? ["flipped"] : []).map((f) =>
        el("option", { value: f, selected: state.filter === f }, f === "flipped" ? "flipped vs base" : f)));
    const search = el("input", { type: "search", id: "search", placeholder: "search id, prompt, answers", value: state.search });
    search.addEventListener("change", (e) => { state.search = e.target.value.toLowerCase(); rerender(); });
    const bound = (id, key, label) => {
      const input = el("input", { type: "number", step: "any", id, placeholder: label, value: state[key] });
      input.addEventListener("change", (e) => { state[key] = e.target.value; rerender(); });
      return input;
    };
    const metric = el("select", { id: "metric", onchange: (e) => { state.metric = e.target.value; rerender(); } },
      task.metrics.map((m) => el("option", { value: m.name, selected: m.name === mainMetric(task) }, m.name)));
    return [
      el("div", { class: "controls" },
        TASKS.map((t) => el("a", { href: "#samples/" + encodeURIComponent(t.name), class: t === task ? "chip good" : "chip" }, t.name)),
      ),
      el("div", { class: "controls" }, "show ", filter, " by ", metric, " from ", bound("min", "min", "min"), " to ", bound("max", "max", "max"), search,
        el("span", { id: "count" }, rows.length + " of " + task.samples.length + " samples")),
      el("table", { id: "samples", "data-task": task.name },
        el("thead", {}, el("tr", {}, header("id", "id"), header("stage", "stage", "num"), el("th", {}, "prompt"),
          el("th", {}, "answer"), header("score", (mainMetric(task) || "score") + " per rollout"), el("th", {}, "finish"),
          header("tokens", "tokens", "num"))),
        body),
      rows.length > state.shown ? more : null,
    ];
  }
  function sampleRow(task, s) {
    const chips = s.gens.map((g) => {
      const v = mainScore(task, g.scores);
      return el("span", { class: "chip " + (v === undefined ? "bad" : v >= 1 ? "good" : "") }, v === undefined ? "failed" : fmt(v, 2));
    });
    const missing = s.failed.filter((r) => !s.gens.some((g) => g.r === r))
      .map(() => el("span", { class: "chip bad" }, "failed"));
    return el("tr", { class: "sample-row", "data-id": s.id, "data-stage": s.stage,
      onclick: () => go(["sample", task.name, s.stage, s.id].map(encodeURIComponent).join("/")) },
      el("td", {}, s.id), el("td", { class: "num" }, s.stage), el("td", {}, excerpt(askedText(s), 90)),
      el("td", {}, excerpt(answerOf(s), 60)), el("td", {}, chips, missing),
      el("td", {}, [...new Set(s.gens.map((g) => g.finish))].join(", ")),
      el("td", { class: "num" }, s.gens.reduce((n, g) => n + (g.ct || 0), 0)));
  }
  function messages(list) {
    return list.map((m) => el("div", { class: "message role-" + (m && m.role) },
      el("div", { class: "role" }, (m && m.role) || "?"), el("pre", {}, contentText(m && m.content))));
  }
  function sample(taskName, stage, id) {
    const task = BY_NAME.get(taskName);
    const s = task && task.samples.find((x) => x.id === id && String(x.stage) === stage);
    if (!s) return [el("p", {}, "no such sample")];
    const out = [el("p", {}, link("samples/" + encodeURIComponent(task.name), "← " + task.name)),
      el("h2", {}, s.id + " (stage " + s.stage + ")")];
    out.push(el("table", {}, Object.entries(s.scores || {}).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num" }, fmt(v))))));
    if (s.system) out.push(el("h3", {}, "system prompt"), el("pre", { class: "system" }, s.system));
    if (s.doc) out.push(el("h3", {}, "document"), el("pre", { class: "doc" }, JSON.stringify(s.doc, null, 2)));
    out.push(el("h3", {}, "prompt"));
    out.push(typeof s.prompt === "string" ? el("pre", { class: "prompt" }, s.prompt) : el("div", { class: "prompt" }, messages(s.prompt || [])));
    if ((FLIPS.get(task.name) || new Set()).has(s.id)) out.push(el("p", {}, link("compare", "flipped vs base: see the comparison")));
    const eps = task.episodes.filter((e) => e.id === s.id && e.stage === s.stage);
    eps.forEach((e) => out.push(el("p", {}, link(["episode", task.name, task.episodes.indexOf(e)].map(encodeURIComponent).join("/"),
      "episode, rollout " + e.rollout + " (" + e.turns.length + " turns)"))));
    for (const g of s.gens) {
      const box = el("div", { class: "rollout", "data-rollout": g.r },
        el("h3", {}, "rollout " + g.r), el("p", { class: "muted" }, "finish " + (g.finish ?? "-") + " · tokens " + (g.pt ?? "-") + " / " + (g.ct ?? "-")),
        el("p", {}, g.scores ? Object.entries(g.scores).map(([k, v]) => el("span", { class: "chip" }, k + " " + fmt(v))) : el("span", { class: "chip bad" }, "scoring failed")));
      if (s.choices && Array.isArray(g.ll)) {
        const best = pick(g);
        box.append(el("table", { class: "choices" }, el("tr", {}, el("th", {}, "choice"), el("th", { class: "num" }, "log-likelihood"), el("th", {}, "greedy"), el("th", {}, "")),
          s.choices.map((c, i) => el("tr", { class: i === best ? "pick" : "" }, el("td", {}, c), el("td", { class: "num" }, fmt((g.ll[i] || [])[0])),
            el("td", {}, (g.ll[i] || [])[1] ? "yes" : ""), el("td", {}, i === best ? "← pick" : "")))));
      } else {
        box.append(el("div", { class: "muted" }, "answer (stripped)"), el("pre", { class: "text" }, g.text));
        if (g.raw !== null && g.raw !== undefined && g.raw !== g.text) box.append(el("div", { class: "muted" }, "raw"), el("pre", { class: "raw" }, g.raw));
      }
      out.push(box);
    }
    const judged = task.judge.filter((j) => j.id.split("|")[0] === s.id && j.stage === s.stage);
    if (judged.length) {
      out.push(el("h3", {}, "the judge's replies"));
      judged.forEach((j) => out.push(el("div", { class: "rollout judge", "data-judge": j.id }, el("b", {}, j.id),
        el("details", {}, el("summary", {}, "asked"), typeof j.asked === "string" ? el("pre", {}, j.asked) : messages(j.asked || [])),
        j.replies.map((r) => el("pre", { class: "reply" }, r)))));
    }
    const lost = s.failed.filter((r) => !s.gens.some((g) => g.r === r));
    if (lost.length) out.push(el("p", { class: "bad" }, "failed rollouts (nothing saved): " + lost.join(", ")));
    return out;
  }

  // ------------------------------------------------------------ agent episodes
  function episodes() {
    const out = [];
    for (const t of TASKS.filter((x) => x.episodes.length)) {
      out.push(el("h2", {}, t.name), el("table", { class: "episodes" },
        el("tr", {}, ["instance", "stage", "rollout", "turns", "tool calls", "tokens", "answer", "error"].map((h) => el("th", {}, h))),
        t.episodes.map((e, i) => el("tr", { class: "episode-row", "data-id": e.id, onclick: () => go(["episode", t.name, i].map(encodeURIComponent).join("/")) },
          el("td", {}, e.id), el("td", {}, e.stage), el("td", {}, e.rollout), el("td", {}, e.turns.length),
          el("td", {}, e.tool_results.length), el("td", {}, e.turns.reduce((n, x) => n + (x.pt || 0) + (x.ct || 0), 0)),
          el("td", {}, excerpt(e.answer, 60)), el("td", { class: e.error ? "bad" : "" }, excerpt(e.error, 80))))));
    }
    return out.length ? out : [el("p", {}, "no agent tasks in this run")];
  }
  function episode(taskName, index) {
    const task = BY_NAME.get(taskName);
    const e = task && task.episodes[Number(index)];
    if (!e) return [el("p", {}, "no such episode")];
    const byAt = new Map(e.turns.map((t) => [t.at, t]));
    const out = [el("p", {}, link("episodes", "← episodes")), el("h2", {}, task.name + ": " + e.id + " (stage " + e.stage + ", rollout " + e.rollout + ")")];
    if (e.error) out.push(el("p", { class: "bad" }, "failed: " + e.error));
    if (e.live_from) out.push(el("p", { class: "live" }, "resumed: turns before " + e.live_from + " came from the journal of an earlier run; from turn " + e.live_from + " on, this run asked the model"));
    const conv = el("div", { class: "conversation" });
    e.messages.forEach((m, i) => {
      const turn = m && m.role === "assistant" ? byAt.get(i) : undefined;
      const box = el("div", { class: "message role-" + (m && m.role) },
        el("div", { class: "role" }, (m && m.role) || "?", m && m.tool_call_id ? " (" + m.tool_call_id + ")" : ""),
        turn ? el("div", { class: "turn-info" + (e.live_from && turn.turn === e.live_from ? " went-live" : "") },
          "turn " + turn.turn + " · finish " + (turn.finish ?? "-") + " · tokens " + (turn.pt ?? "-") + " / " + (turn.ct ?? "-"),
          e.live_from && turn.turn === e.live_from ? " · went live here (resumed)" : "") : null,
        contentText(m && m.content) ? el("pre", { class: m && m.role === "tool" ? "tool-result" : "" }, contentText(m && m.content)) : null);
      for (const call of (m && m.tool_calls) || []) {
        const fn = call.function || {};
        let args = fn.arguments;
        try { args = json(JSON.parse(args)); } catch (err) { /* shown as sent */ }
        box.append(el("div", { class: "tool-call", "data-tool": fn.name }, el("b", {}, "tool call " + fn.name), " ", el("span", { class: "muted" }, call.id || ""), el("pre", {}, args)));
      }
      conv.append(box);
    });
    out.push(conv, el("h3", {}, "answer"), el("pre", { class: "answer" }, e.answer ?? "(none)"));
    return out;
  }

  // ------------------------------------------------------------ judging, pass@k
  function judging() {
    const out = [];
    for (const t of TASKS.filter((x) => x.elo || x.judge.length)) {
      out.push(el("h2", {}, t.name));
      const elo = t.elo;
      if (elo) {
        out.push(el("p", {}, "rating " + fmt(elo.rating, 1) + " " + interval(elo.ci95) + " over " + elo.num_tasks + " tasks, " + elo.num_judgments + " judgments"));
        out.push(chart(elo.stages.map((s) => ({ x: s.stage, y: s.rating, lo: (s.ci95 || [])[0], hi: (s.ci95 || [])[1],
          label: "stage " + s.stage + ": " + fmt(s.rating, 1) + " " + interval(s.ci95) })),
        { cls: "elo", xlabel: "stage", lines: (elo.references || []).map((r) => ({ y: r.elo, label: r.name })) }));
        out.push(el("table", { class: "stages" }, el("tr", {}, ["stage", "references", "tasks", "rating", "95% interval", "wins / ties / losses"].map((h) => el("th", {}, h))),
          elo.stages.map((s) => el("tr", {}, el("td", {}, s.stage), el("td", {}, (s.references || []).join(", ")), el("td", {}, (s.task_ids || []).length),
            el("td", { class: "num" }, fmt(s.rating, 1)), el("td", {}, interval(s.ci95)), el("td", {}, s.wins + " / " + s.ties + " / " + s.losses)))));
        const answers = new Map(t.samples.map((s) => [s.id, answerOf(s)]));
        out.push(el("h3", {}, "judged pairs (both positions)"), el("table", { class: "pairs" },
          el("tr", {}, ["task", "reference", "verdict", "candidate's answer"].map((h) => el("th", {}, h))),
          elo.pairs.map((p) => {
            const [w, tie, l] = p.wtl;
            const word = w && !tie && !l ? "win" : l && !w && !tie ? "loss" : tie && !w && !l ? "tie" : "mixed";
            return el("tr", {}, el("td", {}, p.task), el("td", {}, p.reference),
              el("td", { class: word === "win" ? "good" : word === "loss" ? "bad" : "" }, word + " (" + w + "/" + tie + "/" + l + ")"),
              el("td", {}, excerpt(answers.get(p.task), 80)));
          })));
      }
      if (t.judge.length) {
        out.push(el("h3", {}, "the judge's replies"));
        t.judge.forEach((j) => out.push(el("div", { class: "rollout judge" }, el("b", {}, j.id + " (stage " + j.stage + ")"),
          el("details", {}, el("summary", {}, "asked"), typeof j.asked === "string" ? el("pre", {}, j.asked) : messages(j.asked || [])),
          j.replies.map((r, i) => [el("div", { class: "muted" }, "reply " + i), el("pre", {}, r)]))));
      }
    }
    return out.length ? out : [el("p", {}, "nothing was judged in this run")];
  }
  function curves() {
    const out = [];
    for (const t of TASKS.filter((x) => Object.keys(x.curves).length)) {
      out.push(el("h2", {}, t.name));
      for (const [family, points] of Object.entries(t.curves)) {
        out.push(el("h3", {}, family), chart(points.map((p) => ({ x: p.k, y: p.value, lo: (p.ci95 || [])[0], hi: (p.ci95 || [])[1],
          label: p.name + " = " + fmt(p.value) })), { cls: "curve", xlabel: "k", unit: true }));
      }
    }
    return out.length ? out : [el("p", {}, "no pass@k or maj@k metrics in this run")];
  }

  // ------------------------------------------------------------ compare
  function compare() {
    const c = DATA.compare;
    const out = [el("p", {}, "base " + c.base.label + " (" + (c.base.model || "-") + ") → new " + c.new.label + " (" + (c.new.model || "-") + ")")];
    if (c.only_base.length) out.push(el("p", {}, "only in base: " + c.only_base.join(", ")));
    if (c.only_new.length) out.push(el("p", {}, "only in new: " + c.only_new.join(", ")));
    for (const t of c.tasks) {
      out.push(el("h2", {}, t.task), el("p", { class: "muted" }, t.num_both + " scored in both (base " + t.num_base + ", new " + t.num_new + ")"));
      out.push(el("table", { class: "diffs" }, el("tr", {}, ["metric", "base", "new", "new - base", "paired change (units)", "interval", "p (drop)", ""].map((h) => el("th", {}, h))),
        t.metrics.map((m) => {
          const p = m.paired;
          const drop = p.significant_drop, gain = p.significant_gain;
          return el("tr", { class: "diff", "data-metric": m.metric }, el("td", {}, m.metric), el("td", { class: "num" }, fmt(m.base)), el("td", { class: "num" }, fmt(m.new)),
            el("td", { class: "num" }, fmt(m.delta)), el("td", {}, p.test + " " + fmt(p.estimate) + " (" + p.n + ")"),
            el("td", {}, interval([p.lo, p.hi]) + " at " + Math.round(p.confidence * 100) + "%"),
            el("td", { class: "num" }, fmt(p.p_value)), el("td", { class: drop ? "bad" : gain ? "good" : "" }, drop ? "significant drop" : gain ? "significant gain" : ""));
        })));
      if (!t.flips.length) continue;
      out.push(el("h3", {}, t.flips.length + " flipped (regressions first)"));
      for (const f of t.flips) {
        const rollouts = (list) => list.length ? list.map((x, i) => [el("div", { class: "muted" }, "rollout " + i), el("pre", {}, x)]) : el("p", { class: "muted" }, "(no answer saved)");
        out.push(el("div", { class: "rollout flip " + (f.new < f.base ? "regressed" : "improved"), "data-id": f.instance_id },
          el("b", { class: f.new < f.base ? "bad" : "good" }, f.instance_id + ": " + f.metric + " " + fmt(f.base) + " → " + fmt(f.new)),
          el("p", { class: "muted" }, f.prompt),
          el("div", { class: "side" }, el("div", { class: "base" }, el("b", {}, "base"), rollouts(f.base_rollouts)),
            el("div", { class: "new" }, el("b", {}, "new"), rollouts(f.new_rollouts)))));
      }
    }
    return out;
  }

  // ------------------------------------------------------------ tabs and routing
  const VIEWS = [["overview", "Overview", true], ["samples", "Samples", true],
    ["episodes", "Agent episodes", TASKS.some((t) => t.episodes.length)],
    ["judging", "Judging", TASKS.some((t) => t.elo || t.judge.length)],
    ["curves", "pass@k / maj@k", TASKS.some((t) => Object.keys(t.curves).length)],
    ["compare", "Compare", !!DATA.compare]].filter((v) => v[2]);
  const PARENT = { sample: "samples", episode: "episodes" };
  function route() {
    const parts = location.hash.replace(/^#/, "").split("/").map(decodeURIComponent);
    let [name, ...rest] = parts;
    if (!VIEWS.some((v) => v[0] === (PARENT[name] || name))) name = "overview";
    const render = { overview, samples: () => samples(rest[0] || state.task), sample: () => sample(rest[0], rest[1], rest.slice(2).join("/")),
      episodes, episode: () => episode(rest[0], rest[1]), judging, curves, compare }[name];
    const tabs = document.getElementById("tabs");
    tabs.replaceChildren(...VIEWS.map(([key, label]) => el("a", { href: "#" + key, id: "tab-" + key, class: (PARENT[name] || name) === key ? "active" : "" }, label)));
    const view = document.getElementById("view");
    view.replaceChildren(...[render()].flat(Infinity).filter(Boolean));
    view.setAttribute("data-view", name);
    document.body.setAttribute("data-ready", "1");
    if (window.EVALREPLAY_FIRST_RENDER === undefined) window.EVALREPLAY_FIRST_RENDER = performance.now();  // benchmarks/
  }
  window.addEventListener("hashchange", route);
  route();
})();
