"""Exercise definitions, one module per lab (``lab01``, ``lab02``, ...).

Each module registers its graders with :func:`labkit.grading.checks.exercise`.
"""
