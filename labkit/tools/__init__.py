"""Tools beside the lab: :mod:`labkit.tools.bench`, labkit's speed targets."""
__all__: list[str] = []
