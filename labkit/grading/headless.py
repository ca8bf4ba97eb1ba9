"""Run a notebook headless, as grading and the notebook tests both do: top to bottom in a python3
kernel whose environment names the lab (``LABKIT_LAB``) and the grade log its checks append to
(``LABKIT_GRADE_LOG``), cell errors kept as outputs. The kernel runs OpenBLAS on one thread
(``OPENBLAS_NUM_THREADS=1`` unless the caller's environment sets it): notebooks run side by side,
one per core, and BLAS threads left spinning after numpy's work would take the core of the next.

    >>> import nbformat
    >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1/0")])
    >>> run_notebook(nb, lab="demo", grade_log="/tmp/log.jsonl", cwd="/tmp", cell_timeout=60)  # doctest: +SKIP
    >>> [(i, out["ename"]) for i, out in error_outputs(nb)]  # doctest: +SKIP
    [(0, 'ZeroDivisionError')]
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["run_notebook", "error_outputs"]


def run_notebook(nb, lab: str, grade_log: str | Path, cwd: str | Path, cell_timeout: int, *,
                 timeout_func: Callable[[Any], int] | None = None, shutdown_kernel: str = "graceful",
                 on_kernel: Callable[[int], None] | None = None,
                 on_cell: Callable[[int | None], None] | None = None) -> None:
    """Execute ``nb`` in place with nbclient (outputs land in ``nb``). ``cell_timeout`` (or ``timeout_func``,
    called per cell) limits each cell; ``on_kernel`` gets the kernel's pid once it runs, ``on_cell`` each cell's
    index as it starts. nbclient's ``CellTimeoutError`` and ``DeadKernelError`` pass through to the caller."""
    from nbclient import NotebookClient  # the kernel machinery: loaded only where a notebook is run

    client = NotebookClient(nb, timeout=cell_timeout, timeout_func=timeout_func, kernel_name="python3",
                            allow_errors=True, shutdown_kernel=shutdown_kernel,
                            resources={"metadata": {"path": str(cwd)}})
    if on_kernel is not None:
        def started(notebook=None, **_) -> None:
            pid = getattr(getattr(client.km, "provisioner", None), "pid", None)
            if pid:
                on_kernel(pid)

        client.on_notebook_start = started
    if on_cell is not None:
        client.on_cell_start = lambda cell=None, cell_index=None, **_: on_cell(cell_index)
    client.execute(env={"OPENBLAS_NUM_THREADS": "1", **os.environ, "LABKIT_LAB": lab,
                        "LABKIT_GRADE_LOG": str(grade_log)})


def error_outputs(nb) -> Iterator[tuple[int, Any]]:
    """(cell index, error output) of every cell that raised, in order."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                yield i, out
