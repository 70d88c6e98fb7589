"""How `mqbox top` draws a frame (rich): a title line, the store's positions, then tables of
topics, consumer groups and processes, then what could not be read.

Owns: layout, units and colours. Never: gathering (admin/top_data.py) or the refresh loop
(cli.py's `top`).
"""

from __future__ import annotations

import datetime
from typing import Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mqbox.admin.top_data import Frame, StoreRow

_MIB: Final = float(1 << 20)


def _size(size_bytes: float) -> str:
    """Bytes in the unit that keeps the figure short."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(size_bytes) >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes:.0f} B"


def _per_s(rate: float) -> str:
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"


def _store_text(row: StoreRow | None) -> Text:
    if row is None:
        return Text("store: not readable from this host", style="dim")
    store = row.store
    return Text(
        f"store: written {_size(store.write_log_offset_bytes)} "
        f"(+{_size(row.write_bytes_per_s)}/s, {_per_s(row.append_records_per_s)} records/s)"
        f"   unflushed {_size(row.unflushed_bytes)}"
        f"   undispatched {_size(row.undispatched_bytes)}"
        f"   kept from {_size(store.min_log_offset_bytes)}"
    )


def _topics(frame: Frame) -> Table:
    table = Table(title="topics", title_justify="left", expand=False)
    table.add_column("TOPIC", no_wrap=True)
    table.add_column("QUEUES", justify="right")
    table.add_column("STORED", justify="right")
    table.add_column("PUT/s", justify="right")
    for row in frame.topics:
        table.add_row(row.topic, str(row.queue_count), f"{row.stored_now:,}", _per_s(row.put_per_s))
    if not frame.topics:
        table.add_row("(none)", "", "", "")
    return table


def _groups(frame: Frame) -> Table:
    table = Table(title="consumer groups", title_justify="left", expand=False)
    table.add_column("GROUP", no_wrap=True)
    table.add_column("TOPIC", no_wrap=True)
    table.add_column("CONSUMERS", justify="right")
    table.add_column("LAG", justify="right")
    table.add_column("GET/s", justify="right")
    for row in frame.groups:
        lag_style = "bold red" if row.lag > 0 and row.get_per_s == 0 else ""
        table.add_row(
            row.group,
            row.topic,
            str(row.consumer_count),
            Text(f"{row.lag:,}", style=lag_style),
            _per_s(row.get_per_s),
        )
    if not frame.groups:
        table.add_row("(none)", "", "", "", "")
    return table


def _processes(frame: Frame) -> Table:
    table = Table(title="processes", title_justify="left", expand=False)
    table.add_column("ROLE", no_wrap=True)
    table.add_column("PID", justify="right")
    table.add_column("STATE")
    table.add_column("CPU%", justify="right")
    table.add_column("PSS MB", justify="right")
    table.add_column("RSS MB", justify="right")
    for row in frame.processes:
        state_style = "red" if row.state == "down" else ""
        table.add_row(
            row.name,
            str(row.pid or "-"),
            Text(row.state, style=state_style),
            f"{row.cpu_percent:.1f}",
            f"{row.pss_bytes / _MIB:.1f}",
            f"{row.rss_bytes / _MIB:.1f}",
        )
    return table


def render(frame: Frame, *, now: datetime.datetime | None = None) -> RenderableType:
    """One screen of `mqbox top`."""
    moment = (now or datetime.datetime.now()).strftime("%H:%M:%S")
    interval = f"rates over {frame.interval_s:.1f} s" if frame.interval_s > 0 else "no rates yet"
    title = Text(f"mqbox top   namesrv {frame.namesrv}   {moment}   {interval}", style="bold")
    parts: list[RenderableType] = [title, _store_text(frame.store), _topics(frame), _groups(frame)]
    if frame.processes:
        parts.append(_processes(frame))
    parts.extend(Text(problem, style="yellow") for problem in frame.problems)
    return Group(*parts)
