"use strict";
// The report page: the verdict, then every chart on one x scale (seconds from the window's
// start) kept in step through uPlot's setScale hook. The thread lanes and the run-queue map are
// drawn in uPlot draw hooks, per device pixel column, from exact per-state time (see laneModel):
// a state shorter than a pixel still shows as its share of the column.
(function () {
  // Where the set-up's time goes (ms from the navigation's start), for the load-time test.
  const marks = { script: performance.now() };
  const D = JSON.parse(document.getElementById("data").textContent);
  marks.parsed = performance.now();
  const R = D.report, V = R.verdict, S = R;
  const DUR = Math.max(D.duration_ns, 1) / 1e9;
  const css = getComputedStyle(document.documentElement);
  const C = (n) => css.getPropertyValue("--" + n).trim();
  const charts = [];
  const page = (window.tracerPage = { charts, data: D, lanes: [], tail: [], marks });
  let syncing = false;

  function dur(ns) {
    if (ns == null || !isFinite(ns)) return "-";
    const a = Math.abs(ns);
    if (a >= 1e9) return (ns / 1e9).toFixed(2) + " s";
    if (a >= 1e6) return (ns / 1e6).toFixed(a >= 1e8 ? 0 : a >= 1e7 ? 1 : 2) + " ms";
    if (a >= 1e3) return (ns / 1e3).toFixed(1) + " µs";
    return Math.round(ns) + " ns";
  }
  const pct = (x) => (x * 100).toFixed(x < 0.1 ? 1 : 0) + " %";
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }
  const $ = (id) => document.getElementById(id);
  function undelta(v) {
    const out = new Float64Array(v.length);
    let t = 0;
    for (let i = 0; i < v.length; i++) out[i] = t += v[i];
    return out;
  }
  // First index with a[i] > x.
  function upper(a, x) {
    let lo = 0, hi = a.length;
    while (lo < hi) {
      const m = (lo + hi) >> 1;
      if (a[m] <= x) lo = m + 1; else hi = m;
    }
    return lo;
  }

  // ---- Verdict -----------------------------------------------------------------------
  const SECTION = {
    scheduling: "lanes-sec", cache_thrash: "counters-sec", gpu_saturation: "gpu-sec",
    lock_contention: "lanes-sec", runtime_pause: "lanes-sec", host_bound: "gpu-sec",
    head_of_line: "requests-sec",
    unexplained: "requests-sec",
  };
  function verdict() {
    $("headline").textContent = V.headline;
    const box = $("causes");
    const basis = V.basis === "tail_excess" ? "of the tail's excess over the median" : "of the time lost";
    for (const c of V.causes) {
      const sec = c.cause === "scheduling" && D.heat ? "heat-sec" : SECTION[c.cause] || "lanes-sec";
      box.append(el("article", { class: "card", "data-cause": c.cause },
        el("h3", { text: c.mechanism }),
        el("div", { class: "share", text: pct(c.share) + " " }, el("small", { text: basis })),
        el("p", { text: c.evidence }),
        c.acts_in ? el("p", { text: "In: " + (c.acts_in.role || "") + " PID " + c.acts_in.pid }) : null,
        el("p", { text: "What to do: " + c.advice }),
        el("p", {}, el("a", { href: "#" + sec, text: "See it on the timeline" }))));
    }
    if (V.bound) box.append(el("article", { class: "card" }, el("h3", { text: "Bound by" }), el("p", { text: V.bound })));
    if (V.not_assessed.length) {
      const ul = el("ul");
      for (const n of V.not_assessed) ul.append(el("li", {}, el("b", { text: n.signal + ": " }), n.reason));
      $("not-assessed").append(el("h2", { text: "Not assessed (not measured here, which is not the same as absent)" }), ul);
    }
  }

  // ---- Shared x axis -------------------------------------------------------------------
  function width() { return Math.max(320, document.querySelector("main").clientWidth - 40); }
  function rangeLabel(min, max) {
    $("range").textContent = min.toFixed(3) + " s to " + max.toFixed(3) + " s of " + DUR.toFixed(3) + " s";
  }
  function onScale(u, key) {
    if (key !== "x" || syncing) return;
    syncing = true;
    const { min, max } = u.scales.x;
    for (const c of charts) if (c !== u) c.setScale("x", { min, max });
    syncing = false;
    rangeLabel(min, max);
  }
  function xAxis() {
    return { label: "seconds", labelSize: 20, size: 36, stroke: C("fg"), grid: { stroke: C("line"), width: 1 }, ticks: { stroke: C("line") } };
  }
  function chart(target, opts, data) {
    opts.width = width();
    // The x range is set, never padded; a double-click goes back to the whole window (uPlot's
    // own would go to the chart's data, which for requests starts at the first one).
    opts.scales = Object.assign({ x: { time: false, auto: false, min: 0, max: DUR, range: (u, min, max) => [min, max] } }, opts.scales || {});
    const reset = (u) => () => { charts.forEach((c) => c.setScale("x", { min: 0, max: DUR })); return null; };
    // uPlot swallows a click whose press and release it placed apart, as the end of a drag
    // (`drag.click`); at the plot's right edge it could place them apart, and a click on a
    // request drawn there did nothing (the browser test's click reached u-over, and no handler
    // ran). Here a drag is a move of more than 3 px between the press and the click.
    let down = null;
    const click = (u, e) => {
      if (!down || Math.abs(e.clientX - down[0]) > 3 || Math.abs(e.clientY - down[1]) > 3) {
        e.stopPropagation();
        e.stopImmediatePropagation();
      }
    };
    opts.cursor = Object.assign({ sync: { key: "tracer" }, drag: { x: true, y: false, click }, bind: { dblclick: reset } }, opts.cursor || {});
    opts.hooks = opts.hooks || {};
    opts.hooks.setScale = [onScale];
    opts.axes[0] = Object.assign(xAxis(), opts.axes[0] || {});
    const u = new uPlot(opts, data, target);
    u.over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    charts.push(u);
    u.setScale("x", { min: 0, max: DUR });
    return u;
  }
  const tip = $("tip");
  function showTip(text, ev) {
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = ev.clientY + 14 + "px";
  }

  // ---- Thread lanes ----------------------------------------------------------------------
  // Per lane: segment boundaries B (ns), and per segment the rate of running and runnable
  // time (1/0 for exact states, the bin's share for binned lanes); cumulative sums make any
  // column's share two binary searches.
  function laneModel(L) {
    let B, rr, rq;
    if (L.bin_ns) {
      const n = L.run.length;
      B = new Float64Array(n + 1);
      rr = new Float64Array(n);
      rq = new Float64Array(n);
      for (let i = 0; i < n; i++) {
        B[i] = i * L.bin_ns;
        rr[i] = L.run[i] / L.bin_ns;
        rq[i] = L.rq[i] / L.bin_ns;
      }
      B[n] = Math.min(n * L.bin_ns, D.duration_ns);
    } else {
      B = undelta(L.t);
      const n = Math.max(B.length - 1, 0);
      rr = new Float64Array(n);
      rq = new Float64Array(n);
      for (let i = 0; i < n; i++) {
        rr[i] = L.s[i] === 0 ? 1 : 0;
        rq[i] = L.s[i] === 1 ? 1 : 0;
      }
    }
    const cum = (rate) => {
      const c = new Float64Array(B.length);
      for (let i = 0; i + 1 < B.length; i++) c[i + 1] = c[i] + rate[i] * (B[i + 1] - B[i]);
      return c;
    };
    return { B, rr, rq, cr: cum(rr), cq: cum(rq), sync: undelta(L.sync), req: undelta(L.req), gc: undelta(L.gc) };
  }
  function at(m, c, rate, t) {
    const B = m.B, n = B.length;
    if (n < 2 || t <= B[0]) return 0;
    if (t >= B[n - 1]) return c[n - 1];
    const k = upper(B, t) - 1;
    return c[k] + rate[k] * (t - B[k]);
  }
  // Share of [t0, t1) (ns) running, runnable, and inside the thread's timeline at all.
  function shares(m, t0, t1) {
    const w = Math.max(t1 - t0, 1e-9), B = m.B;
    const cov = B.length < 2 ? 0 : Math.max(0, Math.min(t1, B[B.length - 1]) - Math.max(t0, B[0]));
    return [(at(m, m.cr, m.rr, t1) - at(m, m.cr, m.rr, t0)) / w,
      (at(m, m.cq, m.rq, t1) - at(m, m.cq, m.rq, t0)) / w, cov / w];
  }
  // CSS px per lane; the x axis and its label take about 60 px under the plot.
  const LANE_PX = 20, AXIS_PX = 66;
  function lanes() {
    const L = D.lanes;
    if (!L.length) { $("lanes-note").textContent = "No timeline in this recording."; return; }
    const models = L.map(laneModel);
    page.lanes = L.map((l, i) => ({ tid: l.tid, model: models[i], drawnRun: 0 }));
    const tails = new Set();
    const rq = D.requests, p99 = S.requests && S.requests.p99_ns;
    const tailSpans = L.map(() => []);
    if (rq && p99) {
      const laneOf = new Map(L.map((l, i) => [l.tid, i]));
      for (let i = 0; i < rq.end.length; i++) {
        if (rq.wall[i] >= p99 && laneOf.has(rq.tid[i])) {
          tailSpans[laneOf.get(rq.tid[i])].push([rq.end[i] - rq.wall[i], rq.end[i]]);
          tails.add(i);
        }
      }
    }
    const n = L.length;
    const name = (i) => (L[i].role ? L[i].role + " · " : "") + L[i].tid + " " + L[i].comm;
    $("lanes-note").textContent = "One lane per thread, grouped by process, busiest first" +
      (D.lanes_left_out ? "; " + D.lanes_left_out + " quieter threads have no lane" : "") +
      ". Each pixel column shows the share of its time in each state.";
    function draw(u) {
      const ctx = u.ctx, bb = u.bbox, dpr = devicePixelRatio || 1;
      const { min, max } = u.scales.x;
      const cols = Math.floor(bb.width), left = Math.round(bb.left), top = Math.round(bb.top);
      // Each lane: a gap, a strip of requests served, a strip of CUDA syncs and garbage
      // collections (a thread is never in both: a collection holds the GIL, a sync releases it),
      // then the states.
      const laneH = Math.floor(bb.height / n), gap = Math.max(1, Math.round(dpr)), sh = Math.max(2, Math.round(2 * dpr));
      const H = laneH - gap - 2 * sh;
      const ns = (px) => (min + (px / cols) * (max - min)) * 1e9;
      ctx.save();
      const paths = { run: new Path2D(), rq: new Path2D(), blk: new Path2D(), sync: new Path2D(), gc: new Path2D(), req: new Path2D(), tail: new Path2D() };
      const strip = (path, v, y) => {
        for (let k = 0; k + 1 < v.length; k += 2) {
          if (v[k + 1] < min * 1e9 || v[k] > max * 1e9) continue;
          const x0 = Math.max(u.valToPos(v[k] / 1e9, "x", true), left);
          const x1 = Math.min(u.valToPos(v[k + 1] / 1e9, "x", true), left + cols);
          path.rect(Math.floor(x0), y, Math.max(Math.round(x1 - x0), 1), sh);
        }
      };
      for (let i = 0; i < n; i++) {
        const m = models[i], y0 = top + (i + 1) * laneH;
        // Error diffusion along the columns: the drawn pixels add up to the lane's time in
        // each state (within a pixel), and a state too short for one column still shows.
        let er = 0, eq = 0, eb = 0, drawn = 0;
        for (let c = 0; c < cols; c++) {
          const [fr, fq, cov] = shares(m, ns(c), ns(c + 1));
          const a = fr * H + er, hr = Math.round(a); er = a - hr;
          const b = (fr + fq) * H + eq, hq = Math.round(b); eq = b - hq;
          const d = cov * H + eb, hb = Math.round(d); eb = d - hb;
          if (hr > 0) paths.run.rect(left + c, y0 - hr, 1, hr);
          if (hq > hr) paths.rq.rect(left + c, y0 - hq, 1, hq - Math.max(hr, 0));
          if (hb > Math.max(hq, hr)) paths.blk.rect(left + c, y0 - hb, 1, hb - Math.max(hq, hr, 0));
          drawn += Math.max(hr, 0);
        }
        page.lanes[i].drawnRun = drawn / (H * cols);
        page.lanes[i].rows = [y0 - H, y0];
        const ys = y0 - H - 2 * sh;
        strip(paths.req, m.req, ys);
        strip(paths.tail, tailSpans[i].flat(), ys);
        strip(paths.sync, m.sync, ys + sh);
        strip(paths.gc, m.gc, ys + sh);
      }
      for (const [k, col] of [["blk", "blk"], ["rq", "rq"], ["run", "run"], ["sync", "sync"], ["gc", "gc"], ["req", "req"], ["tail", "tail"]]) {
        ctx.fillStyle = C(col);
        ctx.fill(paths[k]);
      }
      ctx.restore();
    }
    const u = (page.lanesChart = chart($("lanes"), {
      height: n * LANE_PX + AXIS_PX,
      scales: { y: { auto: false, range: [0, n] } },
      legend: { show: false },
      axes: [{}, {
        size: 220, gap: 4, stroke: C("fg"), grid: { show: false }, ticks: { show: false },
        splits: () => L.map((_, i) => n - i - 0.5),
        values: (u, sp) => sp.map((v) => name(Math.round(n - 0.5 - v))),
      }],
      series: [{}, { stroke: "transparent", points: { show: false } }],
      cursor: { y: false, points: { show: false } },
      hooks: { draw: [draw] },
    }, [[0, DUR], [null, null]]));
    u.over.addEventListener("mousemove", (ev) => {
      const i = Math.floor((ev.offsetY / u.over.clientHeight) * n);
      if (i < 0 || i >= n) return showTip(null);
      const px = 1 / devicePixelRatio, x = u.posToVal(ev.offsetX, "x");
      const w = Math.max((u.scales.x.max - u.scales.x.min) / u.over.clientWidth, px * 1e-9);
      const [fr, fq, cov] = shares(models[i], (x - w / 2) * 1e9, (x + w / 2) * 1e9);
      const s = S.threads.find((t) => t.tid === L[i].tid);
      showTip(name(i) + "\n" + x.toFixed(4) + " s: running " + pct(fr) + ", runnable " + pct(fq) +
        ", blocked " + pct(Math.max(cov - fr - fq, 0)) +
        (s ? "\nwindow: on CPU " + dur(s.oncpu_ns) + ", run-queue wait " + dur(s.runq_wait_ns) : ""), ev);
    });
    u.over.addEventListener("mouseleave", () => showTip(null));
  }

  // ---- Run-queue map -----------------------------------------------------------------------
  // Viridis stops: ordered in lightness, readable with colour-vision deficiencies.
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function viridis(k) {
    const x = Math.min(Math.max(k, 0), 1) * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
    const c = VIRIDIS[i].map((v, j) => Math.round(v + (VIRIDIS[i + 1][j] - v) * f));
    return "rgb(" + c.join(",") + ")";
  }
  function heat() {
    const H = D.heat;
    if (!H) { $("heat-note").textContent = "No run-queue waits recorded."; return; }
    const n = H.cpus.length, bin = H.bin_ns;
    const max = Math.max(1, ...H.wait.map((r) => Math.max(...r)));
    $("heat-note").textContent = "Time the target's threads waited for a CPU, on the CPU that ended each wait, per " +
      dur(bin) + " (colour: share of the cell's time, square-root scale).";
    function draw(u) {
      const ctx = u.ctx, bb = u.bbox, rowH = bb.height / n;
      ctx.save();
      for (let r = 0; r < n; r++) {
        const row = H.wait[r];
        for (let c = 0; c < row.length; c++) {
          if (!row[c]) continue;
          const x0 = u.valToPos((c * bin) / 1e9, "x", true), x1 = u.valToPos(((c + 1) * bin) / 1e9, "x", true);
          if (x1 < bb.left || x0 > bb.left + bb.width) continue;
          ctx.fillStyle = viridis(Math.sqrt(row[c] / max));
          ctx.fillRect(Math.max(x0, bb.left), bb.top + r * rowH, Math.max(x1 - x0, 1), rowH - 1);
        }
      }
      ctx.restore();
    }
    const u = chart($("heat"), {
      height: Math.max(n * 24, 48) + AXIS_PX,
      scales: { y: { auto: false, range: [0, n] } },
      legend: { show: false },
      axes: [{}, { size: 80, stroke: C("fg"), grid: { show: false }, splits: () => H.cpus.map((_, i) => n - i - 0.5),
        values: (u, sp) => sp.map((v) => "CPU " + H.cpus[Math.round(n - 0.5 - v)]) }],
      series: [{}, { stroke: "transparent", points: { show: false } }],
      cursor: { y: false, points: { show: false } },
      hooks: { draw: [draw] },
    }, [[0, DUR], [null, null]]);
    u.over.addEventListener("mousemove", (ev) => {
      const r = Math.floor((ev.offsetY / u.over.clientHeight) * n), c = Math.floor((u.posToVal(ev.offsetX, "x") * 1e9) / bin);
      const v = H.wait[r] && H.wait[r][c];
      showTip(v == null ? null : "CPU " + H.cpus[r] + ", " + ((c * bin) / 1e9).toFixed(3) + " s: " + dur(v) + " of waiting", ev);
    });
    u.over.addEventListener("mouseleave", () => showTip(null));
    const scale = el("canvas", { width: 240, height: 12, "aria-label": "colour scale" });
    const g = scale.getContext("2d");
    for (let x = 0; x < 240; x++) { g.fillStyle = viridis(x / 239); g.fillRect(x, 0, 1, 12); }
    $("heat-scale").append(el("span", { text: "0" }), scale, el("span", { text: dur(max) + " per cell" }));
  }

  // ---- Series charts -------------------------------------------------------------------
  function series(label, stroke, scale, fmt) {
    return { label, stroke, scale, width: 1.5, spanGaps: false, value: (u, v) => (v == null ? "-" : fmt(v)) };
  }
  function gpu() {
    if (!D.gpus.length) { $("gpu-note").textContent = "No GPU sampled: " + S.capabilities.gpu.reason; return; }
    $("gpu-note").textContent = "NVML polls: utilization (share of the sample period a kernel ran), the target's SM share, " +
      "SM clock, power, and the share of each poll interval a violation policy held the clocks down.";
    for (const g of D.gpus) {
      const t = g.t.map((x) => x / 1e9);
      const sm = g.t.map(() => null);
      for (const [e, p] of g.target_sm) { const k = Math.min(upper(g.t, e), g.t.length - 1); if (k >= 0) sm[k] = p; }
      const box = el("div", { class: "chart" });
      $("gpu").append(el("p", { class: "note", text: "GPU " + g.index + " (" + g.name + ")" }), box);
      chart(box, {
        height: 260,
        scales: { pct: { auto: false, range: [0, 105] }, mhz: {}, w: {} },
        axes: [{}, { scale: "pct", label: "%", stroke: C("fg"), grid: { stroke: C("line") } },
          { scale: "mhz", side: 1, label: "MHz / W", stroke: C("fg"), grid: { show: false } }],
        series: [{ label: "time", value: (u, v) => (v == null ? "-" : v.toFixed(3) + " s") },
          series("utilization", "#0072b2", "pct", (v) => v + " %"),
          series("target SM share", "#009e73", "pct", (v) => v.toFixed(0) + " %"),
          series("clocks held down", "#d55e00", "pct", (v) => v.toFixed(1) + " %"),
          series("SM clock", "#cc79a7", "mhz", (v) => v + " MHz"),
          series("power", "#e69f00", "mhz", (v) => v.toFixed(0) + " W")],
      }, [t, g.util, sm, g.violation_pct, g.sm_clock_mhz, g.power_w]);
    }
  }
  function counters() {
    const K = D.counters;
    if (!K) { $("counters-note").textContent = "Not measured: " + S.capabilities.pmu.reason; return; }
    $("counters-note").textContent = "Over the target's threads, per bin: instructions per cycle and LLC misses per thousand instructions.";
    chart($("counters"), {
      height: 200, scales: { ipc: {}, mpki: {} },
      axes: [{}, { scale: "ipc", label: "IPC", stroke: C("fg") }, { scale: "mpki", side: 1, label: "MPKI", stroke: C("fg"), grid: { show: false } }],
      series: [{}, series("IPC", "#0072b2", "ipc", (v) => v.toFixed(2)), series("MPKI", "#d55e00", "mpki", (v) => v.toFixed(2))],
    }, [K.t.map((x) => x / 1e9), K.ipc, K.mpki]);
  }

  // ---- Requests --------------------------------------------------------------------------
  const PARTS = [["oncpu_ns", "on CPU"], ["queued_oncpu_ns", "on CPU, queued behind earlier requests"],
    ["runq_contention_ns", "run queue: other tasks ran"], ["runq_migration_ns", "run queue: moved CPU"],
    ["runq_idle_cpu_ns", "run queue: CPU idle (throttled, slow wakeup)"], ["runq_throttled_ns", "run queue: cgroup throttled"], ["cuda_sync_ns", "GPU wait (CUDA sync)"],
    ["blocked_ns", "other blocked"], ["lock_wait_ns", "lock wait"], ["runtime_pause_ns", "runtime pause (GC)"],
    ["uncovered_ns", "not covered by the timeline"]];
  function who(b) {
    if (!b.by) return "others, or unseen";
    const w = b.by;
    if (w.kind === "interrupt") return "an interrupt (a device's, or on an idle CPU)";
    if (w.kind === "timer") return "a timer (its own timeout or sleep)";
    if (w.kind === "gpu_driver") return "the GPU driver";
    if (w.kind === "kernel_thread") return w.comm + " (kernel thread)";
    return "thread " + w.tid + " (" + w.comm + (w.kind === "same_process" ? "" : ", PID " + w.pid) + ")";
  }
  function detail(k) {
    const A = S.requests, d = A.slowest[k], box = $("request-detail");
    box.querySelector("table") && box.querySelector("table").remove();
    box.querySelectorAll(".blockers").forEach((e) => e.remove());
    const med = A.median.mean;
    const t = el("table", { id: "detail-table", "data-request": k },
      el("tr", {}, el("th", { text: "request " + (d.id != null ? "#" + d.id : k + 1) + " on thread " + d.tid }),
        el("th", { text: "this request" }), el("th", { text: "median request (mean of " + A.median.requests + ")" })));
    for (const [f, label] of PARTS) {
      if (!d.parts[f] && !med[f]) continue;
      t.append(el("tr", { class: "part" }, el("td", { text: label }),
        el("td", { "data-ns": d.parts[f], text: dur(d.parts[f]) }), el("td", { text: dur(med[f]) })));
    }
    t.append(el("tr", { class: "wall" }, el("th", { text: "wall time" }), el("th", { "data-ns": d.wall_ns, text: dur(d.wall_ns) }),
      el("th", { text: dur(A.median.wall_ns_mean) })));
    box.append(t);
    if (d.blocked_by && d.blocked_by.length)
      box.append(el("p", { class: "blockers", text: "Its blocked time was ended by: " + d.blocked_by.map((b) => who(b) + " " + dur(b.ns)).join(", ") }));
  }
  function requests() {
    const A = S.requests, rq = D.requests;
    if (!A || !rq || !rq.end.length) {
      $("requests-note").textContent = "No requests in this recording: give the server's request markers or latency log (see the README) to see the tail.";
      return;
    }
    $("requests-note").textContent = A.requests + " requests: p50 " + dur(A.p50_ns) + ", p99 " + dur(A.p99_ns) + ", max " +
      dur(A.max_ns) + ". Each point is a request at its end; the tail (p99 and above) in orange. Click a tail request for its decomposition.";
    const xs = rq.end.map((e) => e / 1e9), tail = [], norm = [];
    const slowIdx = new Map(rq.slowest_at.map((at, k) => [at, k]));
    for (let i = 0; i < xs.length; i++) {
      const ms = rq.wall[i] / 1e6, isTail = rq.wall[i] >= A.p99_ns;
      norm.push(isTail ? null : ms);
      tail.push(isTail ? ms : null);
    }
    const pts = (fill, size) => ({ show: true, size, fill, stroke: fill, width: 0 });
    const u = chart($("latency"), {
      height: 240,
      scales: { y: { distr: 3 } },
      axes: [{}, { label: "ms (log)", stroke: C("fg"), grid: { stroke: C("line") } }],
      series: [{ label: "time", value: (u, v) => (v == null ? "-" : v.toFixed(4) + " s") },
        { label: "request", stroke: C("req"), paths: () => null, points: pts(C("req"), 4), value: (u, v) => (v == null ? "-" : v.toFixed(3) + " ms") },
        { label: "tail request", stroke: C("tail"), paths: () => null, points: pts(C("tail"), 8), value: (u, v) => (v == null ? "-" : v.toFixed(3) + " ms") },
        { label: "p50", stroke: C("muted"), dash: [4, 4], width: 1, points: { show: false }, value: (u, v) => (v == null ? "-" : v.toFixed(3) + " ms") },
        { label: "p99", stroke: C("rq"), dash: [6, 3], width: 1, points: { show: false }, value: (u, v) => (v == null ? "-" : v.toFixed(3) + " ms") }],
    }, [xs, norm, tail, xs.map(() => A.p50_ns / 1e6), xs.map(() => A.p99_ns / 1e6)]);
    // The tail requests that have a decomposition, with where their points are.
    page.tail = [];
    for (const [at, k] of slowIdx) if (at != null) page.tail.push({ index: at, detail: k });
    page.pointOf = (j) => {
      const i = page.tail[j].index, r = u.over.getBoundingClientRect();
      return { x: r.left + u.valToPos(xs[i], "x"), y: r.top + u.valToPos(rq.wall[i] / 1e6, "y") };
    };
    u.over.addEventListener("click", (ev) => {
      let best = null, bd = 12 * 12;
      for (const t of page.tail) {
        const x = u.valToPos(xs[t.index], "x"), y = u.valToPos(rq.wall[t.index] / 1e6, "y");
        const dd = (x - ev.offsetX) ** 2 + (y - ev.offsetY) ** 2;
        if (dd < bd) { bd = dd; best = t; }
      }
      // What the last click found: the browser test checks that a click ran this, and says
      // what it found when the decomposition does not show.
      page.lastPick = { x: ev.offsetX, y: ev.offsetY, tail: page.tail.length, best: best && best.detail, dd: bd };
      if (best) detail(best.detail);
    });
    const pick = el("div", { class: "pick" }, el("span", { class: "note", text: "Slowest requests: " }));
    A.slowest.forEach((d, k) => pick.append(el("button", { type: "button", text: dur(d.wall_ns) }, null)));
    pick.querySelectorAll("button").forEach((b, k) => b.addEventListener("click", () => detail(k)));
    $("request-detail").append(pick);
  }

  function about() {
    const t = el("table");
    t.append(el("tr", {}, el("th", { text: "process" }), el("th", { text: "PID" }), el("th", { text: "role" }), el("th", { text: "threads" })));
    for (const p of S.processes || []) {
      const n = S.threads.filter((x) => x.pid === p.pid).length;
      t.append(el("tr", {}, el("td", { text: p.comm }), el("td", { text: p.pid }), el("td", { text: p.role }), el("td", { text: n })));
    }
    $("about").append(el("p", { class: "note", text: "Window " + DUR.toFixed(3) + " s; tracer " + S.tracer_version + ". The JSON summary (--json) has every number." }), t);
  }

  for (const [name, f] of [["verdict", verdict], ["requests", requests], ["lanes", lanes], ["heat", heat],
    ["gpu", gpu], ["counters", counters], ["about", about]]) {
    f();
    marks[name] = performance.now();
  }
  rangeLabel(0, DUR);
  addEventListener("resize", () => { for (const c of charts) c.setSize({ width: width(), height: c.height }); });
  // Ready once the charts' first draw (uPlot commits in a microtask) is on screen.
  requestAnimationFrame(() => setTimeout(() => {
    page.readyAt = performance.now();
    page.ready = true;
  }));
})();
