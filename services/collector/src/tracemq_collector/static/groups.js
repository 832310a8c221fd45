/* tracemq viewer: the consumer-group health page (issue 15, point 13).
 *
 * Draws the answer of GET /api/v1/groups (every group) or /api/v1/groups/{group} (one, with
 * its queues): per group and topic the state, the lag in messages and its age (the oldest
 * unconsumed message), the rates per minute, the last consume, and the last hour as a chart (a
 * bar per minute: consumed, failed, dead-lettered; the sampled lag as a line). viewer.js calls
 * render() with its DOM helpers; this file only draws.
 */
(function () {
  "use strict";

  const STATES = ["ok", "lagging", "failing", "stopped", "unknown"];
  const SPARK_W = 150;
  const SPARK_H = 30;

  function num(v) {
    return typeof v === "number" && Number.isFinite(v) ? v : null;
  }

  function rate(v) {
    const n = num(v);
    if (n === null || n === 0) return "0";
    return n >= 10 ? String(Math.round(n)) : String(Math.round(n * 100) / 100);
  }

  /** A time as HH:MM:SS when it is the day of ``now`` (local time), else with its date. */
  function when(u, ms, now) {
    const iso = u.fmtIsoLocal(ms);
    const day = iso.slice(0, 10);
    return day === u.fmtIsoLocal(now).slice(0, 10) ? iso.slice(11, 19) : `${day} ${iso.slice(11, 19)}`;
  }

  /** The last hour of one (group, topic): bars per minute and the sampled lag line. */
  function spark(u, trend) {
    const minutes = Array.isArray(trend) ? trend : [];
    const svg = u.s("svg", {
      class: "spark", width: SPARK_W, height: SPARK_H, viewBox: `0 0 ${SPARK_W} ${SPARK_H}`,
      "data-testid": "trend", role: "img",
    });
    if (!minutes.length) return svg;
    const w = SPARK_W / minutes.length;
    const top = Math.max(1, ...minutes.map((m) => (num(m.consumed) || 0) + (num(m.failed) || 0)
      + (num(m.dead_lettered) || 0)));
    const lags = minutes.map((m) => num(m.lag));
    const lagTop = Math.max(1, ...lags.filter((v) => v !== null));
    svg.appendChild(u.s("line", { class: "base", x1: 0, x2: SPARK_W, y1: SPARK_H - 0.5, y2: SPARK_H - 0.5 }));
    let total = { consumed: 0, failed: 0, dead_lettered: 0, retried: 0 };
    minutes.forEach((m, i) => {
      let y = SPARK_H;
      for (const [key, cls] of [["consumed", "ok"], ["failed", "bad"], ["dead_lettered", "dlq"]]) {
        const v = num(m[key]) || 0;
        total[key] += v;
        if (!v) continue;
        const hgt = Math.max(1.5, (v / top) * (SPARK_H - 4));
        y -= hgt;
        svg.appendChild(u.s("rect", {
          class: cls, x: (i * w + 0.3).toFixed(2), y: y.toFixed(2),
          width: Math.max(0.8, w - 0.6).toFixed(2), height: hgt.toFixed(2),
        }));
      }
      total.retried += num(m.retried) || 0;
    });
    const points = [];
    lags.forEach((v, i) => {
      if (v === null) return;
      points.push(`${((i + 0.5) * w).toFixed(1)},${(SPARK_H - 1 - (v / lagTop) * (SPARK_H - 4)).toFixed(1)}`);
    });
    if (points.length === 1) {
      const [x, y] = points[0].split(",");
      svg.appendChild(u.s("circle", { class: "lag", cx: x, cy: y, r: 1.8 }));
    } else if (points.length > 1) {
      svg.appendChild(u.s("polyline", { class: "lag", points: points.join(" ") }));
    }
    const lastLag = lags.filter((v) => v !== null).pop();
    svg.appendChild(u.s("title", {
      text: `last hour: ${total.consumed} consumed, ${total.failed} failed, ` +
        `${total.retried} retried, ${total.dead_lettered} dead-lettered` +
        (lastLag !== undefined ? `; lag ${lastLag} at the last sample` : ""),
    }));
    return svg;
  }

  function render(body, group, u, match) {
    const root = u.$('[data-testid="groups"]');
    const tbody = u.$("[data-testid='groups-table'] tbody", root);
    u.clear(tbody);
    const groups = Array.isArray(body.groups) ? body.groups : [];
    u.$(".groups-title", root).textContent = group ? `Consumer group ${group}` : "Consumer groups";
    const notes = [];
    if (body.activity_truncated) notes.push("more consume events in the hour than read: rates cut");
    const failed = Array.isArray(body.peers_failed) ? body.peers_failed.length : 0;
    if (failed) notes.push(`${failed} collector${failed === 1 ? "" : "s"} did not answer`);
    notes.push(`as of ${u.fmtIsoLocal(body.generated_at)}`);
    u.$('[data-testid="groups-note"]').textContent = notes.join(" · ");
    u.$('[data-testid="groups-empty"]').hidden = groups.length !== 0;
    for (const g of groups) {
      const state = STATES.includes(g.state) ? g.state : "unknown";
      const topics = Array.isArray(g.topics) && g.topics.length ? g.topics : [null];
      topics.forEach((t, i) => {
        const r = (t && t.rates_per_min) || {};
        const link = u.h("a", {
          href: `${location.pathname}?group=${encodeURIComponent(g.group)}`, text: g.group,
          class: "group-name", "data-testid": "group-link",
        });
        const age = t ? num(t.lag_age_ms) : null;
        const oldest = t && t.oldest_unconsumed;
        const ageCell = age === null ? u.h("td", { class: "num", text: "—" })
          : u.h("td", { class: `num${age > 60000 ? " age-bad" : ""}`, "data-testid": "lag-age" },
            oldest && oldest.msg_id
              ? u.h("a", {
                href: `${location.pathname}?msgId=${encodeURIComponent(oldest.msg_id)}`,
                title: `oldest unconsumed: ${oldest.msg_id}`, text: u.fmtDuration(age),
              })
              : u.fmtDuration(age));
        tbody.appendChild(u.h("tr", {
          "data-testid": "group-row", "data-group": g.group, "data-topic": t ? t.topic : "",
          "data-state": state, class: i === 0 ? "group-first" : null,
        },
        u.h("td", null, i === 0 ? link : null),
        u.h("td", { text: t ? t.topic : "—", class: t && t.retry_topic ? "muted" : null }),
        u.h("td", null, i === 0 ? u.h("span", {
          class: `pill pill-${state}`, "data-testid": "group-state", text: state,
          title: g.offsets_note || `${g.clients} live client${g.clients === 1 ? "" : "s"}`,
        }) : null),
        u.h("td", { class: "num", "data-testid": "lag", text: t && num(t.lag) !== null ? String(t.lag) : "—" }),
        ageCell,
        u.h("td", { class: "num", text: rate(r.consume) }),
        u.h("td", { class: "num", "data-testid": "failure-rate", text: rate(r.failure) }),
        u.h("td", { class: "num", text: rate(r.retry) }),
        u.h("td", { class: "num", "data-testid": "dlq-rate", text: rate(r.dead_letter) }),
        u.h("td", t && t.last_consume ? {
          text: when(u, t.last_consume, body.generated_at), title: u.fmtIsoLocal(t.last_consume),
          "data-testid": "last-consume",
        } : { text: "—" }),
        u.h("td", null, t ? spark(u, t.trend) : null),
        ));
      });
    }
    const queues = u.$('[data-testid="group-queues"]');
    const qbody = u.$("tbody", queues);
    u.clear(qbody);
    let rows = 0;
    if (group) {
      for (const g of groups) {
        for (const t of g.topics || []) {
          for (const q of t.queues || []) {
            rows += 1;
            qbody.appendChild(u.h("tr", { "data-testid": "queue-row", "data-topic": t.topic },
              u.h("td", { text: t.topic }),
              u.h("td", { text: u.dash(q.broker) }),
              u.h("td", { class: "num", text: String(q.queue_id) }),
              u.h("td", { class: "num", text: String(q.end) }),
              u.h("td", { class: "num", text: u.dash(q.committed) }),
              u.h("td", { class: "num", text: String(q.lag) }),
              u.h("td", { class: "mono", text: q.oldest_msg_id
                ? `${q.oldest_msg_id} (${u.fmtIsoLocal(q.oldest_timestamp)})` : "—" }),
            ));
          }
        }
      }
    }
    queues.hidden = rows === 0;
    const filter = u.$('[data-testid="groups-filter"]');
    filter.hidden = !!group;
    filter.value = match || "";
    filter.oninput = () => applyFilter(root, filter.value.trim());
    applyFilter(root, filter.value.trim());
  }

  /** Show only the rows of groups whose name holds ``text`` (the ?match= of the page URL). */
  function applyFilter(root, text) {
    let shown = 0;
    for (const tr of root.querySelectorAll("[data-testid='group-row']")) {
      tr.hidden = !!text && !tr.dataset.group.includes(text);
      if (!tr.hidden && tr.classList.contains("group-first")) shown += 1;
    }
    const url = new URL(location.href);
    if (text) url.searchParams.set("match", text);
    else url.searchParams.delete("match");
    history.replaceState(history.state, "", url);
    root.dataset.shown = String(shown);
  }

  window.TraceViewerGroups = { render, spark, rate, applyFilter };
})();
