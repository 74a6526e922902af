"""Keep the rendered examples in docs/jobs/*.md true to the renderer.

Each page holds, between `<!-- rendered: ARGS -->` and `<!-- rendered:end -->`, the script that
`python -m jobs render ARGS` prints. `python -m jobs.docs` rewrites those blocks; the test suite checks
that they are current.
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from jobs.render import Job, render
from jobs.site import load_site

DOCS = Path(__file__).resolve().parent.parent / "docs" / "jobs"
BLOCK = re.compile(r"(<!-- rendered: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- rendered:end -->)", re.S)


def rendered(args: str) -> str:
    """The script for `render` arguments such as `--site perlmutter --bench cosmoflow --nodes 128 --runs 10`."""
    words = shlex.split(args)
    opts = {words[i].lstrip("-"): words[i + 1] for i in range(0, len(words), 2)}
    job = Job(bench=opts["bench"], nodes=int(opts["nodes"]), runs=int(opts.get("runs", 0)),
              instances=int(opts.get("instances", 0)), config=opts.get("config", ""))
    return render(load_site(opts["site"]), job)


def refreshed(text: str) -> str:
    return BLOCK.sub(lambda m: f"{m.group(1)}```bash\n{rendered(m.group('args'))}```\n{m.group(4)}", text)


def main() -> int:
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        new = refreshed(text)
        if new != text:
            page.write_text(new)
            print(f"updated {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
