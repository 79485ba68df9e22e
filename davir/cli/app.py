"""`davir-app`: look at a trained model in a browser — caption a pair you drop in, browse a captions.jsonl, compare two models.

    davir-app --checkpoint runs/demo                    # then open http://127.0.0.1:7860
    davir-app --checkpoint runs/demo --compare runs/lightweight_demo/DIRL+CCR/seed0 --captions outputs/demo/captions.jsonl

The captions are `caption.py`'s for the same images (the one captioning stack, ChangeCaptioner), and a bad
upload gets `caption.py`'s message. Runs on the CPU (or the GPU when there is one). The page is served on
127.0.0.1 only unless --host says otherwise: its browse and compare tabs read folders of this machine, so another
address is served with a warning, and `--auth USER:PASSWORD` (or DAVIR_APP_AUTH, which `ps` does not show) asks
for a login. Uploads are kept in a folder of this run, removed when the app stops (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
from pathlib import Path

from davir.errors import DataError, describe_os_error
from davir.inference.captioner import CaptionerOptions
from davir.runtime.arguments import at_least
from davir.runtime.devices import check_device

AUTH_VARIABLE = "DAVIR_APP_AUTH"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="davir-app", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="run folder (best/, else last/) or saved model: DAVIR or subtraction/SCORER/DIRL/RDD/CHEER",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="a second run or model folder, model B of the compare tab (it can be typed on the page too)",
    )
    parser.add_argument("--captions", type=Path, help="a captions.jsonl (caption.py --out) the browse tab opens")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port_number, default=7860, help="1-65535 (default: 7860)")
    parser.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        type=user_password,
        help=f"ask for this login (Gradio's auth); or set {AUTH_VARIABLE}=USER:PASSWORD, which other "
        "users of the machine cannot read in `ps`",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1 … (default: CUDA when there is one)")
    parser.add_argument("--max-upload-mb", type=at_least(1), default=100, help="larger uploads are refused")
    decoding = parser.add_argument_group("decoding (as caption.py)")
    decoding.add_argument(
        "--num-beams",
        type=int,
        default=None,
        help="default: the run's run.num_beams (the decoding its best/ was selected with)",
    )
    decoding.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's run.max_new_tokens")
    decoding.add_argument(
        "--resize-mismatched",
        action="store_true",
        help="resize the before image to the after image's size instead of refusing the pair",
    )
    moved = parser.add_argument_group("what the run recorded, when it moved (default: the run's own paths)")
    moved.add_argument(
        "--allow-profile-mismatch",
        action="store_true",
        help="accept mask/entity caches of another preprocessing profile than the run trained on",
    )
    moved.add_argument("--masks-from", type=Path, help="mask cache whose settings to reuse (the run's data.masks)")
    moved.add_argument(
        "--entities-from", type=Path, help="entity cache holding the vocabulary and retriever (the run's data.entities)"
    )
    moved.add_argument("--pretrained", type=Path, help="the base InstructBLIP folder (the model's `pretrained`)")
    moved.add_argument("--sam-checkpoint", type=Path, help="SAM weights, when the mask cache was made with SAM")
    moved.add_argument("--clip-checkpoint", type=Path, help="open_clip weights, when the entity cache used CLIP")
    moved.add_argument("--backbone-weights", type=Path, help="ResNet-101 weights of a lightweight model")
    return parser


def port_number(text: str) -> int:
    """A TCP port to listen on: Gradio takes 0 or one past 65535 as far as binding, then stops with a traceback."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {port}")
    return port


def user_password(text: str) -> tuple[str, str]:
    user, colon, password = text.partition(":")
    if not colon or not user or not password:
        raise argparse.ArgumentTypeError("expected USER:PASSWORD, both non-empty")
    return user, password


def is_loopback(host: str) -> bool:
    """Whether `host` serves this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def network_warning(host: str, port: int, auth: bool) -> str | None:
    """What a user serving the page beyond this machine is told at start; None on a loopback address."""
    if is_loopback(host):
        return None
    who = (
        "whoever logs in with --auth"
        if auth
        else f"anyone who can reach port {port}; pass --auth USER:PASSWORD to ask for a login"
    )
    return (
        f"warning: --host {host} serves the page to the network, to {who}: its browse and compare tabs open "
        "any file and folder this account can read, and every upload is captioned on this machine"
    )


def options_of(args: argparse.Namespace) -> CaptionerOptions:
    """The captioner options of the command line: caption.py's defaults (a size mismatch is refused)."""
    return CaptionerOptions(
        device=args.device,
        masks_from=args.masks_from,
        entities_from=args.entities_from,
        pretrained=args.pretrained,
        sam_checkpoint=args.sam_checkpoint,
        clip_checkpoint=args.clip_checkpoint,
        backbone_weights=args.backbone_weights,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        size_policy="resize_before_to_after" if args.resize_mismatched else "error",
        allow_profile_mismatch=args.allow_profile_mismatch,
    )


def main(argv: list[str] | None = None, *, block: bool = True):
    """Serve until Ctrl-C (exit status 0); a model that cannot be loaded or a busy port: one line, status 2.
    `block=False` (tests) returns (demo, url) once the page answers."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.auth is None and os.environ.get(AUTH_VARIABLE):
        try:
            args.auth = user_password(os.environ[AUTH_VARIABLE])
        except argparse.ArgumentTypeError as error:
            parser.error(f"{AUTH_VARIABLE}: {error}")
    from davir.app.serve import start  # gradio is imported by start (after it sets GRADIO_TEMP_DIR), or a DataError

    warning = network_warning(args.host, args.port, args.auth is not None)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        if args.device is not None:
            check_device(args.device)  # before the model loads and the page is built
        with _sigterm_as_interrupt(block):
            started = start(
                str(args.checkpoint),
                compare=None if args.compare is None else str(args.compare),
                captions=None if args.captions is None else str(args.captions),
                host=args.host,
                port=args.port,
                options=options_of(args),
                max_upload_mb=args.max_upload_mb,
                block=block,
                auth=args.auth,
            )
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the port is taken, or not ours to bind
        print(f"error: {describe_os_error(error)} (--host {args.host} --port {args.port})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0 if block else started


class _sigterm_as_interrupt:
    """While the app serves (`block`), SIGTERM stops it as Ctrl-C does: the server closes, the uploads go."""

    def __init__(self, active: bool):
        self.active = active and threading.current_thread() is threading.main_thread()  # where handlers can be set
        self.previous = None

    def __enter__(self):
        if self.active:
            self.previous = signal.signal(signal.SIGTERM, signal.default_int_handler)

    def __exit__(self, *exc) -> None:
        if self.active:
            signal.signal(signal.SIGTERM, self.previous)


if __name__ == "__main__":
    sys.exit(main())
