"""SPICE through pycocoevalcap: the CoreNLP 3.6.0 jars a user gives (never downloaded), Java's module flags."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path

from pycocoevalcap.spice.spice import Spice

SPICE_ENV = "DAVIR_SPICE_CORENLP"
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
SPICE_HINT = (
    f"SPICE n/a: it needs Stanford CoreNLP 3.6.0; set {SPICE_ENV}=DIR or pass --spice-corenlp DIR "
    f"(a folder holding {' and '.join(CORENLP_JARS)}) to enable it"
)
# SPICE's LMDB cache serialises with FST 2.47, which reflects into these java.base packages; Java >= 9
# refuses without --add-opens (pycocoevalcap issue: InaccessibleObjectException in SpiceParser).
# JDK_JAVA_OPTIONS is read by the Java >= 9 launcher only, so Java 8 is unaffected.
SPICE_JAVA_OPENS = ("java.lang", "java.util", "java.math", "java.net", "java.text", "java.util.concurrent", "java.io")


def spice_lib_dir() -> Path:
    """pycocoevalcap's `spice/lib`, where `get_stanford_models` looks for the CoreNLP jars."""
    spec = find_spec("pycocoevalcap.spice")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def prepare_spice(corenlp: str | os.PathLike | None = None) -> tuple[bool, str]:
    """(ready, message): make the CoreNLP 3.6.0 jars visible to pycocoevalcap's SPICE, never downloading.

    Ready when both jars already sit in `spice/lib`; otherwise `corenlp` (or $DAVIR_SPICE_CORENLP)
    must name a folder holding them, and they are symlinked (or copied) into `spice/lib` as
    `get_stanford_models` expects. When not ready the message is the one line to show the user.
    """
    lib = spice_lib_dir()
    if all((lib / jar).is_file() for jar in CORENLP_JARS):
        return True, f"SPICE: Stanford CoreNLP 3.6.0 found in {lib}"
    source = corenlp if corenlp not in (None, "") else os.environ.get(SPICE_ENV, "")
    if not source:
        return False, SPICE_HINT
    folder = Path(source).expanduser()
    missing = [jar for jar in CORENLP_JARS if not (folder / jar).is_file()]
    if missing:
        return (
            False,
            f"SPICE n/a: {folder} does not hold {' and '.join(missing)} (from stanford-corenlp-full-2015-12-09.zip)",
        )
    try:
        for jar in CORENLP_JARS:
            target = lib / jar
            if target.is_file():
                continue
            if target.is_symlink():  # a dangling link from an earlier folder
                target.unlink()
            try:
                target.symlink_to((folder / jar).resolve())
            except OSError:
                shutil.copy2(folder / jar, target)
    except OSError as error:
        return False, f"SPICE n/a: could not place the CoreNLP jars in {lib}: {error}"
    return True, f"SPICE: Stanford CoreNLP 3.6.0 linked from {folder} into {lib}"


@contextmanager
def spice_java_options() -> Iterator[None]:
    """Add SPICE's --add-opens flags to JDK_JAVA_OPTIONS for the java process pycocoevalcap starts."""
    previous = os.environ.get("JDK_JAVA_OPTIONS")
    flags = " ".join(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in SPICE_JAVA_OPENS)
    os.environ["JDK_JAVA_OPTIONS"] = f"{previous} {flags}" if previous else flags
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("JDK_JAVA_OPTIONS", None)
        else:
            os.environ["JDK_JAVA_OPTIONS"] = previous


def score_per_image(gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[dict[str, float] | None, str | None]:
    """({id: SPICE F-score}, None) or (None, why it failed). Only called once the jars are in place."""
    try:
        with spice_java_options():
            _, scores = Spice().compute_score(gts, res)
    except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as error:
        return None, f"SPICE n/a: the SPICE run failed ({type(error).__name__}: {error})"
    # pycocoevalcap returns the per-image scores in sorted-id order.
    return {pair_id: float(score["All"]["f"]) for pair_id, score in zip(sorted(gts), scores)}, None
