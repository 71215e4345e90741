// Refreshes the llm_route status page from /llm_route/status every second,
// in place. It builds nodes with textContent only (no innerHTML), and the
// page's Content-Security-Policy allows no inline script or style, so this
// file is served beside the page.
"use strict";

(function () {
  const statusURL = "/llm_route/status";
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

  refresh();
  setInterval(refresh, 1000);
  setInterval(tick, 250);
})();
