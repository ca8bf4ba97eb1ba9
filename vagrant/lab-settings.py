"""Merge labkit's JupyterLab defaults into a JupyterLab ``overrides.json`` or a Jupyter server config file.

    python vagrant/lab-settings.py vagrant/jupyterlab-overrides.json $VENV/share/jupyter/lab/settings/overrides.json
    python vagrant/lab-settings.py vagrant/jupyter-server-labkit.json $VENV/etc/jupyter/jupyter_server_config.json

Both are JSON objects of sections (a plugin id; a configurable class) holding settings.
Every setting of the defaults file is set in the target (made, with its folder, when missing);
settings the target holds for anything else are kept. Prints one line for provision.sh's step
report: ``ok (...)`` when the target already had them all (the file is not touched), ``done (...)``
when it was written. Exits 1, saying why, when either file is not a JSON object of objects.

vagrant/provision.sh runs it for the venv that ``make lab``, the JupyterLab service and the VM
use; tests/labs/browser.py runs it for the throwaway JupyterLab of the browser tests.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile


def _load(path: str, missing_ok: bool) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise SystemExit(f"{path}: no such file")
    except ValueError as exc:
        raise SystemExit(f"{path}: expected JSON, got a parse error: {exc}")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SystemExit(f"{path}: expected a JSON object of section (plugin id, class) -> settings object")
    return data


def merge(defaults_path: str, target_path: str) -> str:
    """Set ``defaults_path``'s settings in ``target_path``; the step report line."""
    want = _load(defaults_path, missing_ok=False)
    have = _load(target_path, missing_ok=True)
    names = ", ".join(f"{plugin} {key}={json.dumps(value)}" for plugin, settings in want.items()
                      for key, value in settings.items())
    if all(have.get(plugin, {}).get(k) == v for plugin, settings in want.items() for k, v in settings.items()):
        return f"ok ({target_path}: {names})"
    for plugin, settings in want.items():
        have.setdefault(plugin, {}).update(settings)
    folder = os.path.dirname(os.path.abspath(target_path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".overrides-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(have, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target_path)
    return f"done ({target_path}: {names})"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {sys.argv[0]} DEFAULTS.json TARGET/overrides.json")
    print(merge(sys.argv[1], sys.argv[2]))
