"""Reports of ``labkit grade``: a table to read, a CSV for the class spreadsheet, JSON with everything,
and an HTML class report.

- **table**: per notebook, its learner, lab and score, then a line per exercise (status, the learner's
  tries, answer and the check's message);
- **CSV**: one row per learner (labs a learner handed in several of share the row): per exercise of
  every lab graded, whether it passed, the learner's answer and tries; then the learner's score and the
  total (the exercises of every lab in the run: a lab not handed in scores 0);
- **JSON**: every notebook's score, the learners' totals and the per-exercise summary;
- **HTML**: one self-contained page (no external assets): pass rate per exercise, the commonest wrong
  answers per exercise (learners' answers of failed exercises, with the misconception the answer key
  names for them), and per-learner totals.

When a learner handed in two notebooks of one lab, the one given later counts in the CSV, the totals and
the summary (:func:`warnings` says so); JSON still lists both.
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

__all__ = ["ExerciseSummary", "by_learner", "columns", "warnings", "summarize", "learner_totals",
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
    other: int = 0  #: not checked, or its cells recorded nothing
    wrong: list[dict] = field(default_factory=list)  #: {answer, count, misconception}, commonest first

    @property
    def pass_rate(self) -> float:
        return self.passed / self.learners if self.learners else 0.0


def by_learner(scores: list[NotebookScore]) -> dict[str, dict[str, NotebookScore]]:
    """Learner → lab → the notebook that counts (the later one of two), learners in order of first hand-in."""
    out: dict[str, dict[str, NotebookScore]] = {}
    for s in scores:
        out.setdefault(s.learner, {})
        if s.lab:
            out[s.learner][s.lab] = s
    return out


def warnings(scores: list[NotebookScore]) -> list[str]:
    """What the instructor should know about the run beyond the scores: duplicate hand-ins, notebooks
    that stopped early or left something behind."""
    out, seen = [], {}
    for s in scores:
        key = (s.learner, s.lab)
        if s.lab and key in seen:
            out.append(f"{s.learner} handed in lab {s.lab} twice ({seen[key]}, {s.notebook}): the later one counts")
        seen[key] = s.notebook
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
             "labs": {lab: {"score": s.score, "total": len(s.exercises), "notebook": s.notebook}
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
    known = {lab: _misconceptions(lab) for lab in {s.lab for s in scores if s.lab}}
    out = []
    for lab, ex_id, title in columns(scores):
        summary = ExerciseSummary(ex_id, title, lab)
        wrong: Counter[str] = Counter()
        for labs in learners.values():
            e = next((e for e in labs[lab].exercises if e.id == ex_id), None) if lab in labs else None
            if e is None:
                continue
            summary.learners += 1
            if e.status == "passed":
                summary.passed += 1
            elif e.status == "failed":
                summary.failed += 1
                wrong[canonical(e.answer or "")] += 1
            elif e.status == "unanswered":
                summary.unanswered += 1
            else:
                summary.other += 1
        summary.wrong = [{"answer": a, "count": n, "misconception": known[lab].get(a, "")}
                         for a, n in sorted(wrong.items(), key=lambda kv: (-kv[1], kv[0]))]
        out.append(summary)
    return out


# -- formats -------------------------------------------------------------------------------------
_WORD = {"passed": "pass", "failed": "FAIL", "missing": "no evidence"}


def format_table(scores: list[NotebookScore]) -> str:
    """The report to read in a terminal."""
    lines = []
    for s in scores:
        lines.append(f"{s.learner}  lab {s.lab or '?'}  {s.notebook}  score {s.score}/{len(s.exercises)}"
                     + (f"  ({s.seconds:.1f} s)" if s.seconds else ""))
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
    totals = learner_totals(scores)
    if totals:
        lines.append("")
        lines.append("totals: " + ", ".join(f"{t['learner']} {t['score']}/{t['total']}" for t in totals))
    return "\n".join(lines)


def format_csv(scores: list[NotebookScore]) -> str:
    """One row per learner: per exercise passed (1/0; blank when its lab was not handed in), answer and
    tries; then score and total."""
    cols = columns(scores)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["learner", "notebooks", *[f"{ex}{part}" for _, ex, _ in cols for part in ("", " answer", " tries")],
                "score", "total"])
    for t, labs in zip(learner_totals(scores), by_learner(scores).values()):
        row = [t["learner"], ";".join(s.notebook for s in labs.values())]
        for lab, ex, _ in cols:
            e = next((e for e in labs[lab].exercises if e.id == ex), None) if lab in labs else None
            row += ["", "", ""] if e is None else [int(e.passed), e.answer or "", e.tries]
        w.writerow(row + [t["score"], t["total"]])
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
           "<th class='num'>unanswered</th><th class='num'>not graded</th></tr>"]
    for x in summary:
        pct = round(100 * x.pass_rate)
        out.append(f"<tr><td><b>{e(x.id)}</b></td><td>{e(x.title)}</td>"
                   f"<td class='num{' low' if pct < 50 else ''}'>{x.passed}/{x.learners} ({pct}%)</td>"
                   f"<td><div class='bar'><span style='width:{pct}%'></span></div></td>"
                   f"<td class='num'>{x.failed}</td><td class='num'>{x.unanswered}</td><td class='num'>{x.other}</td></tr>")
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
               + "<th class='num'>total</th><th></th></tr>")
    for t in totals:
        cells = "".join(f"<td class='num'>{t['labs'][lab]['score']}/{t['labs'][lab]['total']}</td>" if lab in t["labs"]
                        else "<td class='num muted'>—</td>" for lab in labs)
        pct = round(100 * t["score"] / t["total"]) if t["total"] else 0
        out.append(f"<tr><td>{e(t['learner'])}</td>{cells}<td class='num'><b>{t['score']}/{t['total']}</b></td>"
                   f"<td class='num'>{pct}%</td></tr>")
    out.append("</table>")
    notes = warnings(scores)
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li class='warn'>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)
