"""What a notebook shows: steps, drawings and live tables.

- :mod:`labkit.notebook.steps` — a step sends traffic and collects its trace and map diffs;
- :mod:`labkit.notebook.viz` — the topology and a step's packet path, drawn;
- :mod:`labkit.notebook.widgets` — live CT tables;
- :mod:`labkit.notebook.widgetstate` — the Jupyter server's save hook that keeps their widget state.

What a notebook imports is :mod:`labkit.nb`.
"""
__all__: list[str] = []
