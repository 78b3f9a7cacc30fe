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

  function count(n, one, many) { return n + " " + (n === 1 ? one : many); }
  function clock(t) { return t === null ? "" : new Date(t).toLocaleTimeString(); }
  function keepAlive(ns) { return ns === null ? "kept until evicted" : ns === 0 ? "unloads when idle" : "keep-alive " + (ns / 1e9) + " s"; }

  function renderEntries(entries) {
    const td = el("td", {colspan: 5});
    if (!entries.length) td.append(el("span", {class: "empty"}, "no entries"));
    for (const e of entries) {
      const prot = [];
      if (e.leases) prot.push(count(e.leases, "lease", "leases"));
      if (e.pins) prot.push(count(e.pins, "pin", "pins"));
      if (e.keep_alives) prot.push(count(e.keep_alives, "keep-alive", "keep-alives"));
      const when = [keepAlive(e.keep_alive_ns)];
      if (e.expiry !== null) when.push("expires " + clock(e.expiry));
      if (e.evict_when_idle) when.push("leaves when idle");
      td.append(el("span", {class: "entry mat " + e.state, "data-key": e.key, "data-state": e.state, "data-bytes": e.bytes,
        "data-leases": e.leases, "data-pins": e.pins, "data-keepalives": e.keep_alives, "data-expiry": e.expiry === null ? "" : e.expiry,
        "data-evict-when-idle": String(e.evict_when_idle), title: e.last_use === null ? "loading" : "last use " + e.last_use},
        e.key + " " + e.state + (e.state === "ready" ? " " + human(e.bytes) : ""),
        prot.length ? el("span", {class: "prot"}, " · " + prot.join(", ")) : "",
        el("span", {class: "reason"}, " · " + when.join(", "))));
    }
    return td;
  }

  function renderCaches(cs) {
    const body = document.querySelector("#caches tbody");
    body.replaceChildren();
    if (!cs.caches.length) body.append(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "no cache shown (liveview.WithCache)")));
    for (const c of cs.caches) {
      if (!c.stats) {
        body.append(el("tr", {class: "cache", "data-owner": c.owner}, el("td", {}, c.owner), el("td", {colspan: 4, class: "reason"}, c.error)));
      } else {
        const st = c.stats;
        body.append(el("tr", {class: "cache", "data-owner": c.owner}, el("td", {}, c.owner), el("td", {}, st.location),
          el("td", {class: "num", "data-bytes": st.reserved_bytes}, human(st.reserved_bytes) +
            (st.budget_bytes === null ? "" : " of " + human(st.budget_bytes))),
          el("td", {class: "num"}, st.resources), el("td", {class: "num"}, st.evictions)));
      }
      body.append(el("tr", {class: "entries", "data-owner": c.owner}, renderEntries(c.entries || [])));
    }
  }

  // fields lists a replay Object ({key: n, …}) as spans of class cls.
  function fields(cls, attr, obj) {
    return Object.entries(obj).map(([k, n]) => el("span", {class: cls + (n ? "" : " zero"), ["data-" + attr]: k, "data-count": n}, k + " " + n + " "));
  }

  function renderPipelines(ps) {
    const body = document.querySelector("#pipelines tbody");
    body.replaceChildren();
    if (!ps.pipelines.length) body.append(el("tr", {}, el("td", {colspan: 6, class: "empty"}, "no pipeline shown (liveview.WithPipeline)")));
    for (const p of ps.pipelines) {
      const st = p.stats;
      body.append(el("tr", {class: "pipeline", "data-pipeline": p.pipeline},
        el("td", {}, "#" + p.pipeline, st.failure === null ? "" : el("div", {class: "failure prot"}, "failed: " + st.failure)),
        el("td", {class: "tasks"}, ...fields("task", "state", st.tasks)),
        el("td", {class: "slots num", "data-slots": st.slots, "data-free": st.free_slots, "data-holders": st.slot_holders},
          st.free_slots + " of " + st.slots + " free · " + count(st.slot_holders, "holder", "holders")),
        el("td", {class: "clone num", "data-used": st.clone_bytes, "data-peak": st.peak_clone_bytes, "data-cap": st.clone_budget_bytes},
          human(st.clone_bytes) + " · peak " + human(st.peak_clone_bytes) + " · cap " + human(st.clone_budget_bytes)),
        el("td", {class: "drops"}, ...fields("drop", "reason", st.drops)),
        el("td", {class: "num"}, st.written + " written · " + st.failed + " failed · " + st.flushes + " flushed")));
    }
  }

  // renderWaiters shows /waiters: the callers waiting for room, in queue
  // order; one held up by a waiter ahead is marked so.
  function renderWaiters(ws) {
    const body = document.querySelector("#waiters tbody");
    body.replaceChildren();
    if (!ws.waiters.length) body.append(el("tr", {}, el("td", {colspan: 6, class: "empty"}, "nobody waits")));
    ws.waiters.forEach((w, i) => {
      const notes = [];
      if (!w.eligible) notes.push("held up");
      if (w.allow_bypass) notes.push("may be bypassed");
      body.append(el("tr", {class: "waiter", "data-name": w.name, "data-class": w.class, "data-locations": w.locations.join(","),
        "data-since": w.since === null ? "" : w.since, "data-tries": w.tries, "data-eligible": String(w.eligible), "data-bypass": String(w.allow_bypass)},
        el("td", {class: "num"}, String(i + 1)),
        el("td", {}, w.name, notes.length ? el("span", {class: "reason"}, " · " + notes.join(", ")) : ""),
        el("td", {class: "num"}, String(w.class)), el("td", {}, w.locations.join(", ")),
        el("td", {title: w.since === null ? "" : w.since}, clock(w.since)), el("td", {class: "num"}, String(w.tries))));
    });
  }

  // renderDiagnosis shows /diagnose: undefined when the view has no
  // evidence source (404), null while there is no failure.
  function renderDiagnosis(d) {
    const box = document.getElementById("diagnosis");
    box.replaceChildren();
    box.className = d ? "" : "empty";
    box.dataset.class = d ? d.class : "";
    if (d === undefined) { box.append("no evidence source (liveview.WithEvidence)"); return; }
    if (d === null) { box.append("no failure to diagnose"); return; }
    const steps = el("ol", {class: "steps"});
    for (const s of d.steps) {
      const finds = el("ul", {});
      for (const f of s.findings) finds.append(el("li", {}, f.what + (f.verdict ? ": " + f.verdict : "")));
      steps.append(el("li", {class: "step", value: s.number, "data-number": s.number}, el("b", {}, s.title), finds));
    }
    box.append(el("div", {class: "head"}, el("span", {class: "class"}, d.class), " at state version " + d.state_version + " · ",
      el("a", {href: "diagnose?format=text"}, "as text")),
      el("div", {class: "message"}, d.message),
      el("div", {class: "first"}, "first: " + d.first_action), steps);
  }

  // getJSON fetches a feed; an optional one the view does not serve
  // (404) reads as undefined.
  async function getJSON(path, optional) {
    const r = await fetch(path, {cache: "no-store"});
    if (optional && r.status === 404) return undefined;
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
      if (document.getElementById("pipelines")) extra["pipelines"] = renderPipelines;
      if (document.getElementById("waiters")) extra["waiters"] = renderWaiters;
      if (document.getElementById("diagnosis")) extra["diagnose"] = renderDiagnosis;
      const names = Object.keys(extra);
      const [snap, tr, ...more] = await Promise.all([getJSON("snapshot"), getJSON("trace"), ...names.map(n => getJSON(n, n === "diagnose"))]);
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
