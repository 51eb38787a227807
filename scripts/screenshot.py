"""Screenshot an einopt HTML report in headless Chromium.

python scripts/screenshot.py report.html out.png [--width 1200] [--height H]
"""

from __future__ import annotations

import argparse
import sys

from einopt.reports.report_html import screenshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", help="the HTML report")
    parser.add_argument("png", help="the PNG to write")
    parser.add_argument("--width", type=int, default=1200, help="window width in CSS pixels (default 1200)")
    parser.add_argument("--height", type=int, default=None, help="window height (default: fit the report)")
    args = parser.parse_args(argv)
    try:
        screenshot(args.html, args.png, width=args.width, height=args.height)
    except RuntimeError as e:
        print(f"screenshot: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
