"""Unit tier: make the repository root importable when labkit is not installed."""
import importlib.util
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("labkit") is None and str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
