// Refreshes the llm_route status page from its status answer every second,
// in place, and draws the charts of the history answer as inline SVG. Both
// URLs are relative to the page, so it works on the admin endpoint
// (/llm_route/) and under any path the llm_route_status handler is mounted
// at. It builds nodes with textContent only (no innerHTML), and the page's
// Content-Security-Policy allows no inline script or style, so this file is
// served beside the page; the charts' colours are classes of page.css.
"use strict";

(function () {
  const statusURL = "status";
  const historyURL = "history";
  let snap = null;      // last snapshot
  let fetchedAt = 0;    // performance.now() when it arrived

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function slots(u) {
    return u.inflight + "/" + (u.limit === null ? "\u221e" : u.limit);
  }

  // Cooling counts down locally between refreshes.
  function cooling(u) {
    if (u.cooling_reason === null) return "\u2014";
    const left = u.cooling_seconds - (performance.now() - fetchedAt) / 1000;
    return Math.max(Math.ceil(left), 0) + "s (" + u.cooling_reason + ")";
  }

  function when(t) {
    return t === null ? "\u2014" : new Date(t).toISOString().replace(/\.\d+Z$/, "Z");
  }

  // The same texts as the server-rendered page (admin.go).
  function probe(u) {
    let s = u.probes.ok + " / " + u.probes.fail;
    if (u.last_probe !== null) s += ", last " + u.last_probe.result + " " + when(u.last_probe.at);
    return s;
  }

  function failure(u) {
    if (u.last_failure_at === null) return "\u2014";
    return (u.last_failure === null ? "" : u.last_failure + " ") + when(u.last_failure_at);
  }

  function oldest(m) {
    if (!(m.oldest_wait_seconds > 0)) return "";
    const age = m.oldest_wait_seconds + (performance.now() - fetchedAt) / 1000;
    return ", oldest " + Math.ceil(age) + "s";
  }

  function upstreamRow(u) {
    const tr = el("tr");
    tr.dataset.upstream = u.id;
    if (u.draining) tr.className = "draining";
    else if (u.cooling_reason !== null) tr.className = "cooling-row";
    const id = el("td", "id", u.id);
    if (u.draining) { id.append(" "); id.append(el("span", "tag", "draining")); }
    tr.append(id, el("td", "provider", u.provider), el("td", "model", u.model));
    const meter = el("meter");
    meter.min = 0;
    meter.max = u.limit === null ? Math.max(u.inflight, 1) : u.limit;
    meter.value = u.inflight;
    const s = el("td", "slots");
    s.append(meter, " ", el("span", "slot-count", slots(u)));
    tr.append(s, el("td", "cooling", cooling(u)), el("td", "fail-streak", String(u.fail_streak)),
      el("td", "probes", probe(u)), el("td", "last-failure", failure(u)));
    return tr;
  }

  function modelRow(m) {
    const tr = el("tr");
    tr.dataset.model = m.name;
    const q = m.queue_depth + " waiting" + (m.queue_size ? " (of " + m.queue_size + ")" : " (no queue)") + oldest(m);
    tr.append(el("td", "name", m.name), el("td", "route", m.upstreams.join(" \u2192 ")), el("td", "queue", q));
    return tr;
  }

  // A router model's rules (the same texts as admin.go's).
  function ruleRows(models) {
    const rows = [];
    for (const m of models) {
      for (const r of m.rules || []) {
        const tr = el("tr");
        tr.dataset.model = m.name;
        tr.dataset.rule = r.name;
        const match = Object.keys(r.match || {}).sort().map((n) => {
          const v = r.match[n];
          return n + "=" + (Array.isArray(v) ? v.join("|") : v);
        }).join(", ") || "\u2014";
        const weights = r.weights && r.weights.length ? r.weights.join("/") : "\u2014";
        const shadow = r.shadow ? r.shadow.model + " " + Math.round((r.shadow.fraction || 0) * 1000) / 10 + " %" : "\u2014";
        tr.append(el("td", "name", m.name), el("td", "rule", r.name), el("td", "priority", String(r.priority)),
          el("td", "effort", r.effort || "any"), el("td", "match", match), el("td", "route", r.use.join(" \u2192 ")),
          el("td", "weights", weights), el("td", "shadow", shadow), el("td", "requests", String(r.requests)));
        rows.push(tr);
      }
    }
    return rows;
  }

  const reasons = ["first", "least_busy", "weighted", "pinned", "warm", "cold", "waited"];

  function poolRows(pools) {
    const rows = [];
    for (const p of pools || []) {
      for (const m of p.members) {
        const tr = el("tr");
        tr.dataset.pool = p.id;
        tr.dataset.member = m.upstream;
        const placed = reasons.filter((r) => m.placements[r] > 0).map((r) => r + " " + m.placements[r]).join(", ") || "none";
        const cached = m.cached_ratio === null ? "\u2014" : Math.round(m.cached_ratio * 100) + " %";
        tr.append(el("td", "pool", p.id + " (" + p.placement + ")"), el("td", "member", m.upstream),
          el("td", "inflight", m.inflight + "/" + (m.limit === null ? "\u221e" : m.limit)),
          el("td", "placements", placed), el("td", "cached", cached));
        rows.push(tr);
      }
    }
    return rows;
  }

  function providerRow(p) {
    const tr = el("tr");
    tr.dataset.provider = p.id;
    // A key pool by index and fingerprint (never the key), with its state.
    const keys = (p.keys || []).map((k) => "#" + k.index + " " + k.fingerprint + " " + k.state +
      (k.state === "cooling" ? " " + Math.round(k.cooldown_seconds) + "s" : "")).join(", ") || "\u2014";
    tr.append(el("td", "id", p.id), el("td", "inflight", String(p.inflight)), el("td", "route", p.upstreams.join(", ")),
      el("td", "keys", keys));
    return tr;
  }

  function fill(tableID, rows, emptyText) {
    const body = document.querySelector("#" + tableID + " tbody");
    if (rows.length === 0 && emptyText) {
      const tr = el("tr", "empty");
      const td = el("td", "", emptyText);
      td.colSpan = 9;
      tr.append(td);
      rows = [tr];
    }
    body.replaceChildren(...rows);
  }

  function render() {
    if (!snap) return;
    fill("upstreams", snap.upstreams.map(upstreamRow), "no llm_route handler is running");
    fill("models", snap.models.map(modelRow));
    fill("rules", ruleRows(snap.models), "no router models");
    fill("pools", poolRows(snap.pools), "no pools");
    fill("providers", snap.providers.map(providerRow));
    document.getElementById("sessions").textContent = String(snap.sessions);
    document.getElementById("loaded").textContent = when(snap.config_loaded_at);
  }

  // Between refreshes only the countdowns move.
  function tick() {
    if (!snap) return;
    for (const u of snap.upstreams) {
      const row = document.querySelector('#upstreams tr[data-upstream="' + CSS.escape(u.id) + '"] td.cooling');
      if (row) row.textContent = cooling(u);
    }
  }

  async function refresh() {
    const updated = document.getElementById("updated");
    try {
      const resp = await fetch(statusURL, { cache: "no-store", headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      snap = await resp.json();
      fetchedAt = performance.now();
      render();
      updated.dataset.live = "true";
      updated.classList.remove("stale");
      updated.textContent = "live, updated " + new Date().toLocaleTimeString();
    } catch (err) {
      updated.classList.add("stale");
      updated.textContent = "refresh failed (" + err.message + "), retrying";
    }
  }


  // ---- charts of the last 15 minutes (the history answer) ----

  const SVG = "http://www.w3.org/2000/svg";
  const W = 270, H = 56; // one chart; 90 buckets of 3 px

  function sv(tag, attrs, cls) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (cls) e.setAttribute("class", cls);
    return e;
  }

  function chart(cls, label) {
    const s = sv("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img" }, "chart " + cls);
    s.append(sv("rect", { x: 0, y: 0, width: W, height: H }, "frame"));
    const t = sv("title");
    t.textContent = label;
    s.append(t);
    return s;
  }

  function caption(s, text) {
    const t = sv("text", { x: 3, y: 11 }, "cap");
    t.textContent = text;
    s.append(t);
  }

  function fmt(v) {
    if (v >= 100) return String(Math.round(v));
    if (v >= 10) return v.toFixed(1).replace(/\.0$/, "");
    return v.toFixed(2).replace(/\.?0+$/, "") || "0";
  }

  // Stacked bars: layers [{cls, values, name}], bottom first; per is the
  // divisor of every value (the bucket's seconds for a rate).
  function bars(svgEl, layers, per, unit) {
    const n = layers.length ? layers[0].values.length : 0;
    const bw = W / Math.max(n, 1);
    let top = 0;
    for (let k = 0; k < n; k++) {
      let sum = 0;
      for (const l of layers) sum += l.values[k] || 0;
      top = Math.max(top, sum / per);
    }
    if (top > 0) {
      for (let k = 0; k < n; k++) {
        let y = H;
        for (const l of layers) {
          const v = (l.values[k] || 0) / per;
          if (v <= 0) continue;
          const h = Math.max(v / top * (H - 14), 1);
          y -= h;
          const r = sv("rect", { x: (k * bw).toFixed(1), y: y.toFixed(1), width: Math.max(bw - 0.5, 0.5).toFixed(1), height: h.toFixed(1) }, l.cls);
          r.dataset.bucket = k;
          r.dataset.value = String(l.values[k]);
          if (l.name) r.dataset.result = l.name;
          svgEl.append(r);
        }
      }
    }
    return top;
  }

  // Step lines, one level per bucket, with gaps at null: lines [{cls,
  // values}]. A lone bucket still shows as a short level.
  function lines(svgEl, ls) {
    let top = 0;
    for (const l of ls) for (const v of l.values) if (v !== null && v > top) top = v;
    if (top <= 0) return 0;
    for (const l of ls) {
      const n = l.values.length, bw = W / Math.max(n, 1);
      let d = "", pen = false;
      l.values.forEach((v, k) => {
        if (v === null) { pen = false; return; }
        const y = (H - 2 - v / top * (H - 16)).toFixed(1);
        d += (pen ? "V" + y : "M" + (k * bw).toFixed(1) + " " + y) + "H" + ((k + 1) * bw).toFixed(1);
        pen = true;
      });
      if (d) svgEl.append(sv("path", { d: d }, l.cls));
    }
    return top;
  }

  const failKinds = ["4xx", "429", "402", "5xx", "net_err", "timeout", "auth_err"];

  function requestsChart(id, u, secs) {
    const s = chart("requests", id + ": requests per second by result");
    s.dataset.upstream = id;
    const layers = [{ cls: "c-ok", values: u.requests.ok || [], name: "ok" }];
    for (const f of failKinds) if (u.requests[f]) layers.push({ cls: "c-fail", values: u.requests[f], name: f });
    if (u.requests.cancelled) layers.push({ cls: "c-cancelled", values: u.requests.cancelled, name: "cancelled" });
    if (!u.requests.ok) layers[0].values = new Array(u.slots.length).fill(0);
    const top = bars(s, layers, secs);
    let failed = 0;
    for (const f of failKinds) for (const v of u.requests[f] || []) failed += v;
    caption(s, top > 0 ? "max " + fmt(top) + "/s" + (failed ? " \u00b7 " + failed + " failed" : "") : "no requests");
    return s;
  }

  function ttftChart(id, u) {
    const s = chart("ttft", id + ": time to first token p50 and p95");
    const top = lines(s, [{ cls: "l-p95", values: u.ttft_p95 }, { cls: "l-p50", values: u.ttft_p50 }]);
    caption(s, top > 0 ? "p50 / p95, max " + fmt(top) + " s" : "no answers");
    return s;
  }

  function tokensChart(id, u, secs) {
    const s = chart("tokens", id + ": output tokens per second");
    const top = bars(s, [{ cls: "c-tokens", values: u.output_tokens }], secs);
    caption(s, top > 0 ? "max " + fmt(top) + " tok/s" : "no tokens");
    return s;
  }

  function slotsChart(id, u) {
    const s = chart("slots", id + ": slots in use");
    const ceil = Math.max(u.limit || 0, ...u.slots, 1);
    const n = u.slots.length, bw = W / Math.max(n, 1);
    u.slots.forEach((v, k) => {
      if (v <= 0) return;
      const h = v / ceil * (H - 14);
      s.append(sv("rect", { x: (k * bw).toFixed(1), y: (H - h).toFixed(1), width: Math.max(bw - 0.5, 0.5).toFixed(1), height: h.toFixed(1) }, "c-slots"));
    });
    if (u.limit) {
      const y = (H - u.limit / ceil * (H - 14)).toFixed(1);
      s.append(sv("line", { x1: 0, x2: W, y1: y, y2: y }, "limit"));
    }
    caption(s, "max " + Math.max(...u.slots, 0) + (u.limit ? " of " + u.limit : " (no limit)"));
    return s;
  }

  // A budget as a filled bar: used of limit (null: no limit).
  function budgetBar(period, used, limit, text) {
    const bw = 180, bh = 16;
    const s = sv("svg", { viewBox: "0 0 " + bw + " " + bh, width: bw, height: bh, role: "img" }, "budget");
    s.dataset.period = period;
    s.append(sv("rect", { x: 0, y: 0, width: bw, height: bh }, "track"));
    if (limit) {
      const ratio = Math.min(used / limit, 1);
      const fill = sv("rect", { x: 0, y: 0, width: (ratio * bw).toFixed(2), height: bh },
        "fill" + (ratio >= 1 ? " full" : ratio >= 0.8 ? " high" : ""));
      fill.dataset.ratio = String(ratio);
      s.append(fill);
    }
    const t = sv("title");
    t.textContent = period + ": " + text;
    s.append(t);
    return s;
  }

  function usd(v) { return "$" + (Math.round(v * 10000) / 10000); }

  function keyRow(k, secs) {
    const tr = el("tr");
    tr.dataset.key = k.id;
    const cell = (cls, bar, text) => { const td = el("td", cls); td.append(bar, " ", el("span", "budget-text", text)); return td; };
    const day = k.spend_per_day ? usd(k.spend_today_usd) + " of " + usd(k.spend_per_day) : usd(k.spend_today_usd) + " (no limit)";
    const month = k.spend_per_month ? usd(k.spend_month_usd) + " of " + usd(k.spend_per_month) : usd(k.spend_month_usd) + " (no limit)";
    const tok = k.tokens_per_day ? k.tokens_today + " of " + k.tokens_per_day : k.tokens_today + " (no limit)";
    const s = chart("key-requests", k.id + ": requests per second, served and failed");
    const top = bars(s, [{ cls: "c-ok", values: k.served, name: "ok" }, { cls: "c-fail", values: k.failed, name: "failed" }], secs);
    caption(s, top > 0 ? "max " + fmt(top) + "/s" : "no requests");
    tr.append(el("td", "id", k.id),
      cell("day", budgetBar("day", k.spend_today_usd, k.spend_per_day, day), day),
      cell("month", budgetBar("month", k.spend_month_usd, k.spend_per_month, month), month),
      cell("tokens-day", budgetBar("tokens", k.tokens_today, k.tokens_per_day, tok), tok));
    const td = el("td", "trend");
    td.append(s);
    tr.append(td);
    return tr;
  }

  const reasonClasses = reasons.map((r) => "c-r-" + r);

  function poolRow(p, secs) {
    const tr = el("tr");
    tr.dataset.pool = p.id;
    const s = chart("placements", p.id + ": placements by reason");
    const layers = [];
    reasons.forEach((r, i) => { if (p.placements[r]) layers.push({ cls: reasonClasses[i], values: p.placements[r], name: r }); });
    const top = bars(s, layers, secs);
    caption(s, top > 0 ? Object.keys(p.placements).join(", ") : "no placements");
    const c = chart("cached", p.id + ": cached share of prompt tokens");
    const ctop = lines(c, [{ cls: "l-cached", values: p.cached_ratio.map((v) => v === null ? null : v) }]);
    caption(c, ctop > 0 ? "cached, max " + Math.round(ctop * 100) + " %" : "no cache reported");
    const a = el("td"), b = el("td");
    a.append(s);
    b.append(c);
    tr.append(el("td", "id", p.id + " (" + p.placement + ")"), a, b);
    return tr;
  }

  function renderHistory(h) {
    const secs = h.bucket_seconds;
    fill("history-upstreams", h.upstreams.map((u) => {
      const tr = el("tr");
      tr.dataset.upstream = u.id;
      const cells = [requestsChart(u.id, u, secs), ttftChart(u.id, u), tokensChart(u.id, u, secs), slotsChart(u.id, u)];
      tr.append(el("td", "id", u.id), ...cells.map((c) => { const td = el("td"); td.append(c); return td; }));
      return tr;
    }), "no upstreams");
    fill("history-keys", h.keys.map((k) => keyRow(k, secs)), "no client keys");
    fill("history-pools", h.pools.map((p) => poolRow(p, secs)), "no pools");
    document.getElementById("history").dataset.drawn = "true";
  }

  async function refreshHistory() {
    try {
      const resp = await fetch(historyURL, { cache: "no-store", headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      renderHistory(await resp.json());
    } catch (err) {
      document.getElementById("history").dataset.drawn = "failed: " + err.message;
    }
  }

  refresh();
  refreshHistory();
  setInterval(refresh, 1000);
  setInterval(refreshHistory, 2000);
  setInterval(tick, 250);
})();
