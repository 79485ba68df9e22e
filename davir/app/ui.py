"""The app's page: three tabs over one `ModelShelf` (Gradio Blocks; started by davir.app.serve).

    demo = build_app(shelf, checkpoint="runs/demo", compare="runs/other", captions="outputs/demo/captions.jsonl")

Each button is also an API endpoint (`/caption`, `/browse`, `/compare`): docs/recipes.md, "Look at a model in a
browser".
"""

from __future__ import annotations

import html

import pandas as pd
from PIL import Image

from davir.app.browse import read_captions, strip_of
from davir.app.models import ModelShelf
from davir.app.pair import caption_pair
from davir.app.uploads import image_input
from davir.errors import DataError, describe_os_error, import_optional
from davir.viz.report import TILE_LABELS

gr = import_optional("gradio", needed_by="davir-app")  # not a dependency of davir: the extra davir[app]

BROWSE_SHOWN = 48  # strips and rows the browse tab shows of the matching pairs (the count says how many match)
ENTITY_COLUMNS = ["entity", "score"]


def _entities_table(entities) -> pd.DataFrame:
    return pd.DataFrame([[e, round(float(s), 3)] for e, s in entities], columns=ENTITY_COLUMNS)


# What a user can cause (a bad upload, a damaged model folder, a folder they may not read): a message, not a traceback
USER_ERRORS = (DataError, OSError)


def _fail(error: Exception, prefix: str = ""):
    """A DataError's (or OSError's) message as Gradio's error popup (and gradio_client's AppError), never a
    traceback."""
    message = describe_os_error(error) if isinstance(error, OSError) else str(error)
    raise gr.Error(prefix + message, title="Not captioned", print_exception=False) from error


def build_app(
    shelf: ModelShelf,
    *,
    checkpoint: str,
    compare: str | None = None,
    captions: str | None = None,
    delete_cache: tuple[int, int] | None = None,
) -> gr.Blocks:
    model = shelf.get(checkpoint)  # loaded before the page is served: the first caption is as quick as the rest

    def caption(before, after):
        try:
            view = caption_pair(shelf.get(checkpoint), before, after)
        except USER_ERRORS as error:
            _fail(error)
        mask_before, mask_after = view.mask_overlays()
        attention_before, attention_after = view.attention_overlays()
        notes = []
        if view.mask is None:
            notes.append("this model computes no change masks")
        if view.attention is None:
            notes.append("this model has no FAC attention maps")
        status = (
            f"{shelf.get(checkpoint).name} · {view.after.width}×{view.after.height} px · "
            f"{view.seconds:.2f} s" + "".join(f" · {n}" for n in notes)
        )
        return (
            view.caption,
            _entities_table(view.entities),
            mask_before,
            mask_after,
            attention_before,
            attention_after,
            status,
        )

    def browse(path, report, failed_only, word):
        try:
            listing = read_captions(path, failed_only=bool(failed_only), word=word or "", limit=BROWSE_SHOWN)
        except USER_ERRORS as error:
            _fail(error)
        strips = []
        for row in listing.rows:
            strip = strip_of(listing.path, row, report or None)
            if strip is not None:
                with Image.open(strip) as image:
                    strips.append((image.convert("RGB"), f"{row['id']}: {row.get('caption')}"))
        shown = min(listing.matched, BROWSE_SHOWN)
        summary = (
            f"**{listing.total}** pairs · {listing.captioned} captioned · {listing.failed} not captioned · "
            f"**{listing.matched}** match"
            + (f" (the first {shown} shown)" if listing.matched > shown else "")
            + f" · {len(strips)} strips from the report"
        )
        table = pd.DataFrame(
            [
                [
                    str(r.get("id")),
                    r.get("caption") or "",
                    ", ".join(f"{e} {s:.2f}" for e, s in r.get("entities") or []),
                    r.get("error") or "",
                ]
                for r in listing.rows
            ],
            columns=["id", "caption", "entities", "error"],
        )
        return summary, strips, table

    def compare_pair(before, after, checkpoint_a, checkpoint_b):
        outputs = []
        for which, path in (("A", checkpoint_a), ("B", checkpoint_b)):
            try:
                loaded = shelf.get(path or "")
                view = caption_pair(loaded, before, after)
            except USER_ERRORS as error:
                _fail(error, prefix=f"model {which}: ")
            strip, labels = view.strip()
            outputs += [
                f"**{which}**: {html.escape(loaded.name)} · {view.seconds:.2f} s<br>"
                f"<small>{' | '.join(labels)}</small>",
                view.caption,
                _entities_table(view.entities),
                strip,
            ]
        return tuple(outputs)

    with gr.Blocks(title="davir — change captioning", analytics_enabled=False, delete_cache=delete_cache) as demo:
        gr.Markdown(f"## Change captioning · {html.escape(model.name)}")
        with gr.Tab("Caption a pair", id="caption-tab"):
            with gr.Row():
                before = image_input("before", elem_id="before", height=280)
                after = image_input("after", elem_id="after", height=280)
            run = gr.Button("Caption", variant="primary", elem_id="caption-button")
            caption_box = gr.Textbox(label="caption", elem_id="caption", interactive=False)
            status = gr.Markdown(elem_id="status")
            entities = gr.Dataframe(
                headers=ENTITY_COLUMNS,
                label="entities (retrieved, with their scores)",
                elem_id="entities",
                interactive=False,
            )
            with gr.Row():
                overlays = [
                    gr.Image(label=label, type="pil", interactive=False, height=220, elem_id=elem)
                    for label, elem in (
                        ("change mask on before", "mask-before"),
                        ("change mask on after", "mask-after"),
                        ("FAC attention on before", "attention-before"),
                        ("FAC attention on after", "attention-after"),
                    )
                ]
            run.click(caption, [before, after], [caption_box, entities, *overlays, status], api_name="caption")
        with gr.Tab("Browse captions", id="browse-tab"):
            with gr.Row():
                path = gr.Textbox(
                    label="captions.jsonl (caption.py --out)", value=captions or "", elem_id="jsonl", scale=3
                )
                report = gr.Textbox(label="its report.html (default: beside it)", value="", elem_id="report", scale=2)
            with gr.Row():
                failed_only = gr.Checkbox(label="failed pairs only", elem_id="failed-only")
                word = gr.Textbox(label="word (in caption, entities, references or error)", elem_id="word")
                show = gr.Button("Show", variant="primary", elem_id="browse-button")
            summary = gr.Markdown(elem_id="browse-summary")
            strips = gr.Gallery(
                label="report strips: " + " | ".join(TILE_LABELS),
                columns=2,
                height="auto",
                object_fit="contain",
                elem_id="strips",
            )
            rows = gr.Dataframe(
                headers=["id", "caption", "entities", "error"], wrap=True, interactive=False, elem_id="rows"
            )
            inputs = [path, report, failed_only, word]
            show.click(browse, inputs, [summary, strips, rows], api_name="browse")
            word.submit(browse, inputs, [summary, strips, rows], api_name=False)
            failed_only.input(browse, inputs, [summary, strips, rows], api_name=False)
        with gr.Tab("Compare two models", id="compare-tab"):
            with gr.Row():
                compare_before = image_input("before", elem_id="compare-before", height=220)
                compare_after = image_input("after", elem_id="compare-after", height=220)
            with gr.Row():
                model_a = gr.Textbox(label="model A (run or model folder)", value=str(checkpoint), elem_id="model-a")
                model_b = gr.Textbox(label="model B (run or model folder)", value=str(compare or ""), elem_id="model-b")
            go = gr.Button("Compare", variant="primary", elem_id="compare-button")
            sides = []
            with gr.Row():
                for which in ("a", "b"):
                    with gr.Column():
                        sides += [
                            gr.Markdown(elem_id=f"name-{which}"),
                            gr.Textbox(label="caption", elem_id=f"caption-{which}", interactive=False),
                            gr.Dataframe(
                                headers=ENTITY_COLUMNS, label="entities", interactive=False, elem_id=f"entities-{which}"
                            ),
                            gr.Image(label="strip", type="pil", interactive=False, elem_id=f"strip-{which}"),
                        ]
            go.click(compare_pair, [compare_before, compare_after, model_a, model_b], sides, api_name="compare")
    return demo
