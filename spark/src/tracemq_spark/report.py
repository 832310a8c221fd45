"""The human report of a run: a self-contained HTML page with embedded charts, and a PNG of the
main chart (outcome counts per window). Rendered with matplotlib's Agg canvas (no display, no
global backend change) from ``summary.json`` alone."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

OUTCOME_COLORS = {
    "CONSUMED": "#4caf50",
    "CONSUMED_AFTER_RETRY": "#8bc34a",
    "FAILED": "#e53935",
    "DEAD_LETTERED": "#6d1b1b",
    "IN_FLIGHT": "#ffb300",
    "PENDING": "#90a4ae",
    "NOT_CONSUMED": "#d81b60",
    "TRACE_LOST": "#8e24aa",
    "TRACE_INCOMPLETE": "#ba68c8",
    "DUPLICATE": "#1e88e5",
    "ORPHAN_CONSUME": "#00897b",
    "UNEXPECTED_GROUP": "#f4511e",
    "PUB_FAILED": "#3949ab",
}
METRIC_TITLES = {
    "send_cost_ms": "send cost",
    "store_to_consume_ms": "store → consume start",
    "consume_cost_ms": "consume cost",
    "end_to_end_ms": "end to end",
}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _hhmm(label: str) -> str:
    """``20261122T0810Z`` (a run window) as ``08:10``."""
    return f"{label[9:11]}:{label[11:13]}" if len(label) >= 13 else label


def outcome_figure(summary: dict[str, Any]) -> Figure:
    """Stacked bars of the non-CONSUMED outcomes per window; CONSUMED as a line (right axis).

    Every window of the run has its slot, with or without rows, so a range of six windows with
    data in one draws one bar a sixth of the plot wide, not one across the whole plot. The
    legend sits under the plot, where no marker can hide under it."""
    counts = {w.get("window"): w for w in summary.get("by_window", [])}
    run = summary.get("run", {})
    slots = list(run.get("windows") or [])
    if not slots or not set(counts) <= set(slots):  # an old summary without the window list
        slots = [w.get("window") for w in summary.get("by_window", [])]
    windows = [counts.get(k, {}) for k in slots]
    labels = [_hhmm(str(k)) if len(slots) <= 48 else str(k)[4:13] for k in slots]
    fig = Figure(figsize=(11, 5.2), dpi=110, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    x = list(range(len(windows)))
    bottom = [0] * len(windows)
    for outcome, color in OUTCOME_COLORS.items():
        if outcome == "CONSUMED":
            continue
        values = [w.get(outcome, 0) for w in windows]
        if not any(values):
            continue
        ax.bar(x, values, bottom=bottom, color=color, label=outcome, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("anomalies per window")
    ax.set_xticks(x)
    ax.set_xticklabels(
        labels,
        rotation=45 if len(x) > 12 else 0,
        ha="right" if len(x) > 12 else "center",
        fontsize=8,
    )
    ax.set_xlim(-0.6, max(len(x), 1) - 0.4)
    ax2 = ax.twinx()
    consumed = [w.get("CONSUMED", 0) for w in windows]
    ax2.plot(
        x,
        consumed,
        color=OUTCOME_COLORS["CONSUMED"],
        marker="o",
        linewidth=2,
        label="CONSUMED (right axis)",
    )
    ax2.set_ylabel("CONSUMED per window")
    ax2.set_ylim(bottom=0)
    ax.set_title(
        f"Outcomes per {run.get('window_ms', 0) // 60000}-minute window, "
        f"{run.get('from', '')} → {run.get('to', '')} (UTC)"
    )
    handles, names = ax.get_legend_handles_labels()
    h2, n2 = ax2.get_legend_handles_labels()
    if handles or h2:
        fig.legend(
            handles + h2, names + n2, fontsize=7, loc="outside lower center", ncol=6, frameon=False
        )
    return fig


def outcome_chart(summary: dict[str, Any]) -> bytes:
    """:func:`outcome_figure` as PNG."""
    return _png(outcome_figure(summary))


def latency_chart(summary: dict[str, Any]) -> bytes:
    """Latency distributions: histograms on log2 millisecond buckets, with p50/p90/p99."""
    hists = summary.get("latency_histograms_log2_ms", {})
    lat = summary.get("latency", {})
    fig = Figure(figsize=(11, 6.5), dpi=110)
    for i, (metric, title) in enumerate(METRIC_TITLES.items()):
        ax = fig.add_subplot(2, 2, i + 1)
        rows = hists.get(metric, [])
        normal = [(b, n) for b, n in rows if 0 <= b < 99]
        skewed = sum(n for b, n in rows if b < 0 or b >= 99)
        if normal:
            ax.bar([b for b, _ in normal], [n for _, n in normal], width=0.9, color="#5c6bc0")
            ticks = list(range(0, max(b for b, _ in normal) + 1, 2))
            ax.set_xticks(ticks)
            ax.set_xticklabels([_ms_label(2**b if b else 0) for b in ticks], fontsize=7)
        m = lat.get(metric, {})
        for q, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            v = m.get(q)
            if v is not None:
                # bucket k holds [2^k, 2^(k+1)) ms: the line sits at its fractional log2
                v = int(v)
                pos = 0 if v <= 1 else v.bit_length() - 1 + (v / 2 ** (v.bit_length() - 1) - 1)
                ax.axvline(
                    pos,
                    color="#d81b60",
                    linestyle=style,
                    linewidth=1.2,
                    label=f"{q} {_ms_label(v)}",
                )
        note = f" — {skewed} clock-skew suspects left out" if skewed else ""
        ax.set_title(
            f"{title} (n={m.get('count', 0):,}){note}",
            fontsize=9,
            color="#b71c1c" if skewed else "black",
        )
        ax.set_yscale("log" if normal and max(n for _, n in normal) > 50 else "linear")
        ax.tick_params(axis="y", labelsize=7)
        if m.get("p50") is not None:
            ax.legend(fontsize=7)
    fig.suptitle(
        "Latency distributions (log2 ms buckets; percentiles exclude skew suspects)", fontsize=10
    )
    fig.tight_layout()
    return _png(fig)


def _ms_label(v: float | int | None) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v < 1000:
        return f"{v:.0f}ms"
    if v < 60_000:
        return f"{v / 1000:.1f}s"
    if v < 3_600_000:
        return f"{v / 60_000:.1f}m"
    return f"{v / 3_600_000:.1f}h"


def _group_cell(group: str | None) -> str:
    # Rows without a group are the send's own outcomes (a failed send, a message no group was
    # subscribed to): say so rather than print Python's None.
    if group is None:
        return (
            "<td class='l none' title='outcomes of the send itself, before any consumer group'>"
            "<i>(no consumer group)</i></td>"
        )
    return f"<td class='l'>{html.escape(group)}</td>"


def _head(outcome: str) -> str:
    # Long upper-case names break after their underscores, so the table fits its page.
    return "_<wbr>".join(html.escape(outcome).split("_"))


def _img(png: bytes, alt: str, ident: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img id="{ident}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def render(summary: dict[str, Any]) -> tuple[str, bytes]:
    """(report.html, report.png) of a run's summary."""
    main = outcome_chart(summary)
    latency = latency_chart(summary)
    run = summary.get("run", {})
    esc = html.escape
    outcomes = summary.get("outcomes", {})
    info = summary.get("informational", {})
    skew = summary.get("clock_skew", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>tracemq reconciliation {esc(run.get('from', ''))} → {esc(run.get('to', ''))}"
        "</title><style>body{font-family:system-ui,sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:12.5px;text-align:right}th{background:#f3f3f3;"
        "font-size:11.5px;vertical-align:bottom}td.none{color:#777}"
        "td.l,th.l{text-align:left}.warn{background:#fff3e0;border-left:4px solid #e65100;"
        "padding:8px 12px;margin:12px 0}img{max-width:100%}</style></head><body>",
        f"<h1>tracemq reconciliation</h1><p>Pub time window <b>{esc(run.get('from', ''))}</b> "
        f"→ <b>{esc(run.get('to', ''))}</b> (UTC), horizon {run.get('horizon_ms', 0) // 60000}"
        f" min, cutoff {esc(str(run.get('cutoff', '')))}, run <code>{esc(run.get('run_id', ''))}"
        f"</code>. {summary.get('input', {}).get('events_read', 0):,} trace events read.</p>",
    ]
    if skew.get("flagged"):
        per = ", ".join(
            f"{METRIC_TITLES[m]}: {n:,}"
            for m, n in skew.get("suspect_rows_by_metric", {}).items()
            if n
        )
        parts.append(
            f"<div class='warn' id=\"skew-warning\"><b>Clock skew suspected</b> between producer "
            f"and consumer hosts: {esc(per)} value(s) were negative or over a day and are left "
            "out of the percentiles (see <code>*_skew_suspect</code> in the summary).</div>"
        )
    parts.append("<h2>Outcomes</h2><table><tr><th class='l'>outcome</th><th>count</th></tr>")
    for o, n in outcomes.items():
        parts.append(
            f"<tr><td class='l'><span style='color:{OUTCOME_COLORS.get(o, '#000')}'>"
            f"■</span> {o}</td><td>{n:,}</td></tr>"
        )
    for o, n in info.items():
        parts.append(f"<tr><td class='l'><i>{o} (informational)</i></td><td>{n:,}</td></tr>")
    parts.append("</table>")
    parts.append(
        "<h2>Outcome counts per window</h2>" + _img(main, "outcomes per window", "chart-outcomes")
    )
    parts.append(
        "<h2>Latency distributions</h2>" + _img(latency, "latency distributions", "chart-latency")
    )
    parts.append(
        "<h2>Per topic and group</h2><table><tr><th class='l'>topic</th>"
        "<th class='l'>group</th>" + "".join(f"<th>{_head(o)}</th>" for o in outcomes) + "</tr>"
    )
    parts.extend(
        f"<tr><td class='l'>{esc(str(tg['topic']))}</td>"
        + _group_cell(tg["group"])
        + "".join(f"<td>{tg['outcomes'].get(o, 0):,}</td>" for o in outcomes)
        + "</tr>"
        for tg in summary.get("by_topic_group", [])
    )
    parts.append(
        "</table><h2>Latency per topic and group (ms)</h2><table><tr>"
        "<th class='l'>topic</th><th class='l'>group</th><th class='l'>figure</th>"
        "<th>p50</th><th>p90</th><th>p99</th><th>max</th><th>count</th>"
        "<th>skew suspects</th></tr>"
    )
    for tg in summary.get("by_topic_group", []):
        for m, title in METRIC_TITLES.items():
            v = tg["latency"].get(m, {})
            flag = " style='color:#b71c1c;font-weight:bold'" if v.get("skew_suspect") else ""
            parts.append(
                f"<tr><td class='l'>{esc(str(tg['topic']))}</td>"
                + _group_cell(tg["group"])
                + f"<td class='l'>{title}</td>"
                + "".join(
                    f"<td>{'' if v.get(q) is None else f'{v[q]:,}'}</td>"
                    for q in ("p50", "p90", "p99", "max")
                )
                + f"<td>{v.get('count', 0):,}</td><td{flag}>{v.get('skew_suspect', 0):,}</td>"
                "</tr>"
            )
    parts.append("</table></body></html>")
    return "".join(parts), main
