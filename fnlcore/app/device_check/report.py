"""The device check's output: each section's CSV (``<section key>.csv``, rewritten after every row) and
one ``summary.md`` of every section, rewritten after every section."""

from __future__ import annotations

import csv
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ...io import atomic_path


class Table:
    """One CSV, rewritten (atomically) after every row: a run cut short keeps what it measured."""

    def __init__(self, path: Path, columns: tuple[str, ...]):
        self.path, self.columns, self.rows = path, columns, []
        self._lock = threading.Lock()
        self.flush()

    def add(self, row: dict) -> None:
        with self._lock:
            self.rows.append({c: row.get(c, "") for c in self.columns})
            self.flush()

    def flush(self) -> None:
        with atomic_path(self.path, suffix=".csv") as tmp, open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.columns))
            w.writeheader()
            w.writerows(self.rows)


@dataclass
class Section:
    key: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    table: Table | None = None
    shown: tuple[str, ...] = ()  # the table's columns in summary.md


class Report:
    """The output folder: each section's CSV and one ``summary.md``, rewritten after every section."""

    def __init__(self, out: Path, header: list[str]):
        self.out, self.header, self.sections = out, header, []
        out.mkdir(parents=True, exist_ok=True)

    def section(self, key: str, title: str) -> Section:
        s = Section(key, title)
        self.sections.append(s)
        return s

    def table(self, section: Section, columns: tuple[str, ...], shown: tuple[str, ...] = ()) -> Table:
        """The section's CSV, named after its key (``timing`` -> ``timing.csv``), and its columns in summary.md."""
        section.table, section.shown = Table(self.out / f"{section.key}.csv", columns), shown
        return section.table

    def write(self) -> Path:
        lines = ["# fnl device-check", "", *self.header, ""]
        for s in self.sections:
            lines += [f"## {s.title}", "", f"**{s.status}** ({s.seconds:.0f} s)", ""]
            lines += [*s.notes, ""] if s.notes else []
            if s.table is not None and s.table.rows:
                lines += [markdown_table(s.table.rows, s.shown or s.table.columns), "",
                          f"All columns: `{s.table.path.name}`.", ""]
        path = self.out / "summary.md"
        with atomic_path(path, suffix=".md") as tmp:
            Path(tmp).write_text("\n".join(lines) + "\n")
        return path


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")[:160]  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
