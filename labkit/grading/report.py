"""Reports of ``labkit grade``: a table to read, a CSV for the class spreadsheet, JSON with everything,
and an HTML class report.

- **table**: per notebook, its learner, lab, score and status, then a line per exercise (status, the
  learner's tries, answer and the check's message);
- **CSV**: one row per learner (labs a learner handed in several of share the row): the learner's status
  (``ok``, or per lab what went wrong: ``lab 02: timeout``), per exercise of every lab graded whether it
  passed, its status, the learner's answer and tries; then the learner's score and the total (the exercises
  of every lab in the run: a lab not handed in scores 0);
- **JSON**: every notebook's score and statuses, the learners' totals and the per-exercise summary;
- **HTML**: one self-contained page (no external assets): per exercise its pass rate and how many
  failed, left it unanswered, did not run it, lacked its evidence or met a grader error; the commonest
  wrong answers per exercise (with the misconception the answer key names for them); per-learner totals
  and status; and every notebook that did not run cleanly, with why.

A zero never stands alone: each exercise has a status (:data:`~labkit.grading.grade.EXERCISE_STATUSES`) and
each notebook its statuses (timeout, dead kernel, cell errors, missing evidence, ... :attr:`NotebookScore.statuses`).
When a learner handed in two notebooks of one lab, that is a *conflict*: neither counts in the CSV, the
totals or the summary (the lab's exercises read ``conflict``), :func:`warnings` names both, JSON lists both.
A CSV cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'``
(OWASP's advice against formula injection): learners' answers and names are never written raw.
"""
from __future__ import annotations

import csv
import html
import io
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime

from labkit.grading.answers import canonical, load_key, rhs
from labkit.grading.checks import exercises_for
from labkit.grading.grade import NotebookScore

__all__ = ["ExerciseSummary", "by_learner", "columns", "warnings", "summarize", "learner_totals", "learner_status",
           "csv_cell", "plain",
           "format_table", "format_csv", "format_json", "format_html"]

#: Wrong answers listed per exercise in the HTML report.
TOP_WRONG = 3


@dataclass
class ExerciseSummary:
    """One exercise across the class."""

    id: str
    title: str
    lab: str
    learners: int = 0  #: learners who handed its lab in
    passed: int = 0
    failed: int = 0  #: answered and checked, not passed
    unanswered: int = 0
    not_run: int = 0  #: its check never ran (the run stopped first, its cell raised, no check cell)
    missing_evidence: int = 0  #: its check ran, and the cells it reads had recorded nothing
    grader_error: int = 0  #: its grader raised
    conflict: int = 0  #: learners who handed its lab in twice (none of theirs counts)
    wrong: list[dict] = field(default_factory=list)  #: {answer, count, misconception}, commonest first

    @property
    def pass_rate(self) -> float:
        return self.passed / self.learners if self.learners else 0.0

    @property
    def other(self) -> int:
        """Learners for whom it was neither passed, failed nor unanswered."""
        return self.not_run + self.missing_evidence + self.grader_error + self.conflict


def _conflicts(scores: list[NotebookScore]) -> set[tuple[str, str]]:
    """(learner, lab) handed in more than once in ``scores``."""
    seen = Counter((s.learner, s.lab) for s in scores if s.lab)
    return {key for key, n in seen.items() if n > 1} | {(s.learner, s.lab) for s in scores if s.conflict}


def by_learner(scores: list[NotebookScore]) -> dict[str, dict[str, NotebookScore]]:
    """Learner → lab → the notebook that counts, learners in order of first hand-in; a lab handed in twice
    under one name (a conflict) has none."""
    out: dict[str, dict[str, NotebookScore]] = {}
    conflicts = _conflicts(scores)
    for s in scores:
        out.setdefault(s.learner, {})
        if s.lab and (s.learner, s.lab) not in conflicts:
            out[s.learner][s.lab] = s
    return out


def learner_status(scores: list[NotebookScore], learner: str) -> str:
    """``ok``, or what went wrong with the learner's notebooks, per lab: ``lab 02: timeout, cell errors``."""
    seen: list[str] = []
    conflicts = _conflicts(scores)
    for s in scores:
        if s.learner != learner:
            continue
        bad = [x for x in s.statuses if x != "ok"]
        if (s.learner, s.lab) in conflicts and "conflict" not in bad:
            bad.append("conflict")
        line = f"lab {s.lab or '?'}: {', '.join(bad)}" if bad else ""
        if line and line not in seen:
            seen.append(line)
    return "; ".join(seen) or "ok"


def warnings(scores: list[NotebookScore]) -> list[str]:
    """What the instructor should know about the run beyond the scores: two hand-ins under one name, a
    recorded learner that differs from its folder, notebooks that did not run, stopped early or left
    something behind."""
    out = []
    conflicts = _conflicts(scores)
    for key in sorted(conflicts, key=lambda k: next(i for i, s in enumerate(scores) if (s.learner, s.lab) == k)):
        same = [s.notebook for s in scores if (s.learner, s.lab) == key]
        out.append(f"conflict: {len(same)} notebooks of lab {key[1]} handed in under {key[0]!r} "
                   f"({', '.join(same)}): none counts; grade the right one again alone")
    for s in scores:
        if s.name_mismatch:
            out.append(f"{s.notebook}: {s.name_mismatch}")
        if s.error:
            out.append(f"{s.notebook}: {s.error}")
        if s.teardown:
            out.append(f"{s.notebook}: its lab was not fully taken down: {s.teardown}")
    return out


def columns(scores: list[NotebookScore]) -> list[tuple[str, str, str]]:
    """(lab, exercise id, title) of every exercise of every lab in the run, in order."""
    labs = sorted({s.lab for s in scores if s.lab})
    return [(lab, e.id, e.title) for lab in labs for e in exercises_for(lab)]


def learner_totals(scores: list[NotebookScore]) -> list[dict]:
    """Per learner: score, total (every exercise of the run's labs), and per lab the score and notebook."""
    total = len(columns(scores))
    return [{"learner": name, "score": sum(s.score for s in labs.values()), "total": total,
             "status": learner_status(scores, name),
             "conflicts": sorted({s.lab for s in scores if s.learner == name and s.lab} - set(labs)),
             "labs": {lab: {"score": s.score, "total": len(s.exercises), "notebook": s.notebook,
                            "statuses": s.statuses}
                      for lab, s in sorted(labs.items())}}
            for name, labs in by_learner(scores).items()]


def _misconceptions(lab: str) -> dict[str, str]:
    try:
        key = load_key(lab)
    except (LookupError, ValueError, OSError):
        return {}
    return {canonical(rhs(w.answer)): w.misconception for e in key.values() for w in e.wrong if w.misconception}


def summarize(scores: list[NotebookScore]) -> list[ExerciseSummary]:
    """Per exercise of the run: how many passed, failed, left it unanswered, and the commonest wrong answers."""
    learners = by_learner(scores)
    conflicts = _conflicts(scores)
    known = {lab: _misconceptions(lab) for lab in {s.lab for s in scores if s.lab}}
    counted = {"passed": "passed", "failed": "failed", "unanswered": "unanswered", "not run": "not_run",
               "missing evidence": "missing_evidence", "grader error": "grader_error"}
    out = []
    for lab, ex_id, title in columns(scores):
        summary = ExerciseSummary(ex_id, title, lab)
        wrong: Counter[str] = Counter()
        for name, labs in learners.items():
            if (name, lab) in conflicts:
                summary.learners += 1
                summary.conflict += 1
                continue
            e = next((e for e in labs[lab].exercises if e.id == ex_id), None) if lab in labs else None
            if e is None:
                continue
            summary.learners += 1
            field_name = counted.get(e.status, "not_run")
            setattr(summary, field_name, getattr(summary, field_name) + 1)
            if e.status == "failed":
                wrong[canonical(e.answer or "")] += 1
        summary.wrong = [{"answer": a, "count": n, "misconception": known[lab].get(a, "")}
                         for a, n in sorted(wrong.items(), key=lambda kv: (-kv[1], kv[0]))]
        out.append(summary)
    return out


# -- formats -------------------------------------------------------------------------------------
_WORD = {"passed": "pass", "failed": "FAIL", "missing evidence": "no evidence"}
#: First characters a spreadsheet reads as a formula (OWASP, CSV injection).
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """``value`` safe in a spreadsheet: text that starts like a formula gets a leading ``'``.

    >>> csv_cell("=HYPERLINK(1)"), csv_cell("-1"), csv_cell("ok"), csv_cell(3)
    ("'=HYPERLINK(1)", "'-1", 'ok', 3)
    """
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value


def format_table(scores: list[NotebookScore]) -> str:
    """The report to read in a terminal."""
    lines = []
    for s in scores:
        lines.append(f"{s.learner}  lab {s.lab or '?'}  {s.notebook}  score {s.score}/{len(s.exercises)}"
                     + (f"  ({s.seconds:.1f} s)" if s.seconds else "") + f"  [{', '.join(s.statuses)}]")
        for e in s.exercises:
            lines.append(f"  {e.id:6} {_WORD.get(e.status, e.status):11} tries {e.tries:<3} {e.title}")
            if e.status != "passed":
                lines.append(f"{'':9}{f'answer {e.answer}: ' if e.answer is not None else ''}{e.message}")
        if s.error:
            lines.append(f"  ! {s.error}")
        for err in s.cell_errors:
            lines.append(f"  ! {err}")
        if s.teardown:
            lines.append(f"  ! not fully taken down: {s.teardown}")
        for note in (s.conflict, s.name_mismatch):
            if note:
                lines.append(f"  ! {note}")
    totals = learner_totals(scores)
    if totals:
        lines.append("")
        lines.append("totals: " + ", ".join(f"{t['learner']} {t['score']}/{t['total']}" for t in totals))
    return "\n".join(map(plain, lines))


def plain(text: str) -> str:
    """``text`` safe on a terminal: control characters (an escape sequence, a carriage return, NUL) written as
    escapes; line breaks and tabs kept.

    >>> plain("ok\\x1b[2J\\rx\\ny")
    'ok\\\\x1b[2J\\\\rx\\ny'
    """
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii") for c in text)


def format_csv(scores: list[NotebookScore]) -> str:
    """One row per learner: their notebooks and status; per exercise passed (1/0), its status (``grader
    error: <reason>`` with the reason), answer and tries (all blank when its lab was not handed in; the status
    ``conflict`` when it was handed in twice); then score and total. Every cell is :func:`csv_cell`-escaped."""
    cols = columns(scores)
    conflicts = _conflicts(scores)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")  # RFC 4180; a CR or LF in a cell is then quoted
    w.writerow(["learner", "notebooks", "status",
                *[f"{ex}{part}" for _, ex, _ in cols for part in ("", " status", " answer", " tries")],
                "score", "total"])
    for t, (name, labs) in zip(learner_totals(scores), by_learner(scores).items()):
        row = [t["learner"], ";".join(s.notebook for s in scores if s.learner == name), t["status"]]
        for lab, ex, _ in cols:
            e = next((e for e in labs[lab].exercises if e.id == ex), None) if lab in labs else None
            if (name, lab) in conflicts:
                row += ["", "conflict", "", ""]
            elif e is None:
                row += ["", "", "", ""]
            else:
                status = f"grader error: {e.message}" if e.status == "grader error" else e.status
                row += [int(e.passed), status, e.answer or "", e.tries]
        w.writerow([csv_cell(v) for v in row + [t["score"], t["total"]]])
    return buf.getvalue()


def format_json(scores: list[NotebookScore]) -> dict:
    """Everything: every notebook's score, each learner's totals, the per-exercise summary, the warnings."""
    return {"notebooks": [s.to_json() for s in scores], "learners": learner_totals(scores),
            "exercises": [{**asdict(x), "pass_rate": round(x.pass_rate, 3)} for x in summarize(scores)],
            "warnings": warnings(scores)}


_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #1f2328; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #d0d7de; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.bar { background: #eaeef2; width: 120px; height: 10px; display: inline-block; }
.bar span { background: #1a7f37; height: 10px; display: block; }
code { background: #f6f8fa; padding: 0 3px; }
.num { text-align: right; white-space: nowrap; }
.low { color: #cf222e; }
.warn { color: #9a6700; }
.muted { color: #656d76; }
"""


def format_html(scores: list[NotebookScore], title: str = "labkit grade: class report") -> str:
    """The class report, one self-contained HTML page."""
    e = html.escape
    summary = summarize(scores)
    totals = learner_totals(scores)
    labs = sorted({s.lab for s in scores if s.lab})
    out = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{e(title)}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>{e(title)}</h1>",
           f"<p class='muted'>{len(totals)} learners, {len(scores)} notebooks, labs {e(', '.join(labs)) or '—'}; "
           f"{datetime.now():%Y-%m-%d %H:%M}</p>",
           "<h2>Pass rate per exercise</h2>",
           "<table><tr><th>exercise</th><th>title</th><th>passed</th><th></th><th class='num'>failed</th>"
           "<th class='num'>unanswered</th><th class='num'>not run</th><th class='num'>missing evidence</th>"
           "<th class='num'>grader error</th><th class='num'>conflict</th></tr>"]
    for x in summary:
        pct = round(100 * x.pass_rate)
        out.append(f"<tr><td><b>{e(x.id)}</b></td><td>{e(x.title)}</td>"
                   f"<td class='num{' low' if pct < 50 else ''}'>{x.passed}/{x.learners} ({pct}%)</td>"
                   f"<td><div class='bar'><span style='width:{pct}%'></span></div></td>"
                   f"<td class='num'>{x.failed}</td><td class='num'>{x.unanswered}</td><td class='num'>{x.not_run}</td>"
                   f"<td class='num'>{x.missing_evidence}</td><td class='num'>{x.grader_error}</td>"
                   f"<td class='num'>{x.conflict}</td></tr>")
    out.append("</table>")
    out.append("<h2>Commonest wrong answers</h2>")
    out.append("<table><tr><th>exercise</th><th>answer</th><th class='num'>learners</th><th>misconception "
               "(answer key)</th></tr>")
    for x in summary:
        shown = x.wrong[:TOP_WRONG]
        for k, w in enumerate(shown):
            head = f"<td rowspan='{len(shown)}'><b>{e(x.id)}</b></td>" if k == 0 else ""
            out.append(f"<tr>{head}<td><code>{e(w['answer'] or '(empty)')}</code></td><td class='num'>{w['count']}</td>"
                       f"<td>{e(w['misconception']) or '<span class=muted>—</span>'}</td></tr>")
    if not any(x.wrong for x in summary):
        out.append("<tr><td colspan='4' class='muted'>no wrong answers</td></tr>")
    out.append("</table>")
    out.append("<h2>Learners</h2>")
    out.append("<table><tr><th>learner</th>" + "".join(f"<th class='num'>lab {e(lab)}</th>" for lab in labs)
               + "<th class='num'>total</th><th></th><th>status</th></tr>")
    for t in totals:
        cells = "".join(f"<td class='num'>{t['labs'][lab]['score']}/{t['labs'][lab]['total']}</td>" if lab in t["labs"]
                        else "<td class='num warn'>conflict</td>" if lab in t["conflicts"]
                        else "<td class='num muted'>—</td>" for lab in labs)
        pct = round(100 * t["score"] / t["total"]) if t["total"] else 0
        out.append(f"<tr><td>{e(t['learner'])}</td>{cells}<td class='num'><b>{t['score']}/{t['total']}</b></td>"
                   f"<td class='num'>{pct}%</td>"
                   f"<td{'' if t['status'] == 'ok' else ' class=warn'}>{e(t['status'])}</td></tr>")
    out.append("</table>")
    troubled = [s for s in scores if s.statuses != ["ok"]]
    if troubled:
        out.append("<h2>Notebooks that did not run cleanly</h2>")
        out.append("<table><tr><th>learner</th><th>lab</th><th>notebook</th><th>status</th><th>why</th></tr>")
        for s in troubled:
            why = [s.error, *s.cell_errors, s.conflict, s.name_mismatch]
            out.append(f"<tr><td>{e(s.learner)}</td><td>{e(s.lab or '?')}</td><td><code>{e(s.notebook)}</code></td>"
                       f"<td class='warn'>{e(', '.join(s.statuses))}</td>"
                       f"<td>{'<br>'.join(e(w) for w in why if w)}</td></tr>")
        out.append("</table>")
    notes = warnings(scores)
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li class='warn'>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)
