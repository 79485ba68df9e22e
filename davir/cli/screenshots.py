"""`python -m davir.cli.screenshots`: the README's pictures of the app (davir.app.screenshots, docs/images/app_*.png).

    python -m davir.cli.screenshots --checkpoint runs/demo --compare runs/lightweight_demo/dirl_ccr/seed0 \\
        --captions outputs/demo/captions.jsonl --before B.png --after A.png --out docs/images

Starts the app on a free port, uploads the pair in the caption and compare tabs, opens the captions in the browse
tab (its word filter set by --word), and writes app_caption.png, app_browse.png and app_compare.png, each
reduced to a 256-colour palette (a page is mostly flat colour) to stay small.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from davir.errors import DataError, check_output_dir, describe_os_error
from davir.runtime.signals import START_AGAIN, stop_on_signals


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m davir.cli.screenshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--compare", required=True, help="model B of the compare tab")
    parser.add_argument("--captions", required=True, help="the captions.jsonl the browse tab shows")
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--after", required=True, type=Path)
    parser.add_argument("--word", default="", help="the browse tab's word filter")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/images"),
        help="folder for app_caption.png, app_browse.png, app_compare.png (default: docs/images of the current folder)",
    )
    args = parser.parse_args(argv)
    from davir.app.browser import BrowserError

    try:
        # before the app starts (a model load, a browser): a typo is one line, never a traceback
        for flag, path in (("--before", args.before), ("--after", args.after), ("--captions", args.captions)):
            if not Path(path).is_file():
                raise DataError(f"{flag} {path}: no such file")
        check_output_dir(args.out, what="--out")
        from davir.app.screenshots import screenshots

        shots = screenshots(
            args.checkpoint,
            compare=args.compare,
            captions=args.captions,
            before=args.before,
            after=args.after,
            out=args.out,
            word=args.word,
        )
    except (DataError, BrowserError) as error:  # a run folder that is none, no Chromium
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    for shot in shots:
        print(f"{shot} ({shot.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
