"""Running an example of ``examples/`` the way a user would: its ``main(argv)`` in a fresh
interpreter, its result read from the ``RESULT`` line it prints (test helper)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, argv: list[str], timeout: float = 300) -> tuple[object, str]:
    """``examples/<name>.py``'s ``main(argv)`` in a fresh interpreter: (its result, a dataclass
    as a dict, and its standard output)."""
    code = (f"import dataclasses, json, sys; sys.path.insert(0, {str(EXAMPLES)!r}); "
            f"import {name} as m; r = m.main({argv!r}); "
            "r = dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r; "
            "print('RESULT ' + json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), out.stdout
