"""Checks and grades: did the learner's answer match the live datapath?

- :mod:`labkit.grading.checks` — ``check(...)`` and its result objects;
- :mod:`labkit.grading.exercises` — every lab's exercises, one module per lab;
- :mod:`labkit.grading.answers` — the answer key's format;
- :mod:`labkit.grading.grade` / :mod:`labkit.grading.report` — grade handed-in notebooks, report;
- :mod:`labkit.grading.jobs` — run grading jobs in parallel with timeouts.
"""
__all__: list[str] = []
