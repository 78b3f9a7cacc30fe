// The residency live view's script (package system/liveview). Every fetch
// is relative to the page, so the view works under any prefix.
"use strict";
const LiveView = (() => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function human(n) {
    let i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    const s = i === 0 ? String(v) : (Math.round(v * 100) / 100).toString();
    return s + " " + units[i];
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  function figure(cls, label, bytes) {
    return el("span", {class: cls, "data-bytes": String(bytes), title: bytes + " bytes"}, label + " ", el("b", {}, human(bytes)));
  }
  function pct(x, scale) { return Math.max(0, Math.min(100, 100 * x / scale)) + "%"; }

  function renderLocations(snap) {
    const box = document.getElementById("locations");
    box.replaceChildren();
    for (const l of snap.locations) {
      const has = l.budget_bytes !== null && l.budget_bytes !== undefined;
      const scale = has ? Math.max(l.budget_bytes, 1) : Math.max(l.peak_bytes, l.used_bytes + l.reserved_bytes, 1);
      const figs = el("div", {class: "figures"},
        figure("used", "used", l.used_bytes), " · ",
        figure("reserved", "reserved", l.reserved_bytes), " · ",
        has ? figure("budget", "budget", l.budget_bytes) : el("span", {class: "budget", "data-bytes": ""}, "no budget"), " · ",
        figure("peak", "peak", l.peak_bytes));
      const bar = el("div", {class: "bar" + (has ? "" : " nobudget")},
        el("div", {class: "seg used", style: "width:" + pct(l.used_bytes, scale)}),
        el("div", {class: "seg reserved", style: "left:" + pct(l.used_bytes, scale) + ";width:" + pct(l.reserved_bytes, scale)}),
        el("div", {class: "peak", style: "left:" + pct(l.peak_bytes, scale), title: "peak " + l.peak_bytes + " bytes"}));
      const resv = l.reservations.length ? el("div", {class: "figures"}, "reservations: " +
        l.reservations.map(r => r.name + " " + human(r.bytes) + (r.owner ? " (" + r.owner + ")" : "")).join(", ")) : "";
      box.append(el("div", {class: "loc", "data-location": l.location}, el("span", {class: "name"}, l.location), figs, bar, resv));
    }
  }

  function renderValues(snap) {
    const body = document.querySelector("#values tbody");
    body.replaceChildren();
    if (!snap.values.length) body.append(el("tr", {}, el("td", {colspan: 4, class: "empty"}, "no values")));
    for (const v of snap.values) {
      const mats = el("td", {});
      for (const m of v.materializations) {
        const prot = [];
        if (m.use_count) prot.push(m.use_count + (m.use_count === 1 ? " lease" : " leases"));
        if (m.hold_count) prot.push(m.hold_count + (m.hold_count === 1 ? " hold" : " holds"));
        if (m.pending_event_count) prot.push(m.pending_event_count + (m.pending_event_count === 1 ? " pending event" : " pending events"));
        mats.append(el("span", {class: "mat " + m.state, "data-location": m.location, "data-state": m.state,
          "data-leases": m.use_count, "data-holds": m.hold_count, "data-events": m.pending_event_count},
          m.location + " " + m.state, prot.length ? el("span", {class: "prot"}, " · " + prot.join(", ")) : ""));
      }
      if (!v.materializations.length) mats.append(el("span", {class: "empty"}, v.has_source ? "not resident (source " + v.source_location + ")" : "not resident"));
      body.append(el("tr", {class: "value", "data-value": v.handle},
        el("td", {}, v.handle), el("td", {class: "num", "data-bytes": v.bytes}, human(v.bytes)), el("td", {}, v.replica_mode), mats));
    }
  }

  function renderTrace(tr) {
    const body = document.querySelector("#trace tbody");
    body.replaceChildren();
    for (const t of tr.trace.slice(-10).reverse()) {
      body.append(el("tr", {}, el("td", {class: "num"}, t.version), el("td", {}, t.kind), el("td", {}, t.handle || ""),
        el("td", {}, t.location || ""), el("td", {class: "num"}, t.bytes ? human(t.bytes) : ""), el("td", {class: "reason"}, t.detail || "")));
    }
  }

  function renderCaches(cs) {
    const body = document.querySelector("#caches tbody");
    body.replaceChildren();
    if (!cs.caches.length) body.append(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "no cache shown (liveview.WithCache)")));
    for (const c of cs.caches) {
      if (!c.stats) { body.append(el("tr", {class: "cache", "data-owner": c.owner}, el("td", {}, c.owner), el("td", {colspan: 4, class: "reason"}, c.error))); continue; }
      const st = c.stats;
      body.append(el("tr", {class: "cache", "data-owner": c.owner}, el("td", {}, c.owner), el("td", {}, st.location),
        el("td", {class: "num", "data-bytes": st.reserved_bytes}, human(st.reserved_bytes) +
          (st.budget_bytes === null ? "" : " of " + human(st.budget_bytes))),
        el("td", {class: "num"}, st.resources), el("td", {class: "num"}, st.evictions)));
    }
  }

  async function getJSON(path) {
    const r = await fetch(path, {cache: "no-store"});
    if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).trim());
    return r.json();
  }

  // refresh fetches snapshot, trace and every extra feed (its relative
  // path → its renderer), then renders them together.
  async function refresh(extra) {
    const status = document.getElementById("status");
    try {
      extra = Object.assign({}, extra);
      if (document.getElementById("caches")) extra["caches"] = renderCaches;
      const names = Object.keys(extra);
      const [snap, tr, ...more] = await Promise.all([getJSON("snapshot"), getJSON("trace"), ...names.map(getJSON)]);
      renderLocations(snap);
      renderValues(snap);
      renderTrace(tr);
      names.forEach((n, i) => extra[n](more[i]));
      document.getElementById("version").textContent = snap.state_version;
      document.getElementById("manager").textContent = snap.manager_id;
      document.body.dataset.version = String(snap.state_version);
      status.textContent = "live · updated " + new Date().toLocaleTimeString();
      status.classList.remove("stale");
    } catch (e) {
      status.textContent = "not updating: " + e.message;
      status.classList.add("stale");
    }
  }

  // start polls twice a second while the page is open; extra maps the
  // relative paths of the page's own JSON feeds to their renderers.
  async function start(extra) {
    for (;;) {
      await refresh(extra || {});
      await new Promise(r => setTimeout(r, 500));
    }
  }
  return {human, el, start};
})();
