"""Write the held-out English texts of the stop-rule research (docs/accuracy.md) into a folder.

Besides CPython's pydoc topics (``--text pydoc`` of ``examples/capture_trace.py``), the
research reads text that is on a Debian/Ubuntu machine without a network: the GPL-3
licence, two NEWS files of system libraries, and the docstrings of 50 standard-library
modules (their classes and functions too, when longer than 200 characters), which this
script joins in a fixed order. Missing files are skipped with a message.

Run:  python examples/offline_texts.py /tmp/traces/texts
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import inspect
from pathlib import Path

FILES = {
    "gpl3.txt": "/usr/share/common-licenses/GPL-3",
    "gnutls_news.txt": "/usr/share/doc/libgnutls30/NEWS.gz",
    "dbus_news.txt": "/usr/share/doc/dbus-daemon/NEWS.gz",
}
MODULES = ("argparse collections typing unittest logging json asyncio subprocess pathlib functools itertools "
           "dataclasses email http.client urllib.request decimal fractions statistics random textwrap string re "
           "datetime threading multiprocessing sqlite3 csv zipfile tarfile shutil os io pickle copy heapq bisect "
           "contextlib abc enum inspect ast doctest pdb socket ssl selectors calendar locale gettext difflib").split()


def stdlib_docstrings() -> str:
    """The docstrings of :data:`MODULES` and of their public classes and functions (> 200 chars)."""
    parts = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        doc = inspect.getdoc(module)
        if doc:
            parts.append(f"Module {name}\n\n{doc}")
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", "") != module.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                parts.append(f"{name}.{attr}\n\n{doc}")
    return "\n\n".join(parts)


def main(out_dir: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source in FILES.items():
        src = Path(source)
        if not src.is_file():
            print(f"skipped {name}: {source} not found")
            continue
        data = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
        (out / name).write_bytes(data)
        written.append(out / name)
    (out / "stdlib_docstrings.txt").write_text(stdlib_docstrings(), encoding="utf-8")
    written.append(out / "stdlib_docstrings.txt")
    for path in written:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the texts into (keep it out of the repository)")
    main(parser.parse_args().out_dir)
