"""`davir-app`: look at a trained model in a browser (Gradio), on the CPU or a GPU.

    davir-app --checkpoint runs/demo                         # http://127.0.0.1:7860
    davir-app --checkpoint runs/demo --compare runs/lightweight_demo/DIRL+CCR/seed0 \
        --captions outputs/demo/captions.jsonl

Three tabs: *Caption a pair* (drop a before and an after image → the caption, the entities with their scores,
the change mask over both images, FAC's attention over both), *Browse captions* (a `captions.jsonl` from
`caption.py` with its report's strips, filtered to the failed pairs or to a word) and *Compare two models*
(one pair, two models side by side). Every caption comes from `ChangeCaptioner` exactly as `caption.py` makes
it (davir.app.pair), and a bad upload gets `caption.py`'s message for it.

Modules, one idea each: models (the loaded captioners), pair (one uploaded pair through the captioner),
uploads (the image input that hands the file over untouched), browse (reading a captions.jsonl), ui (the
Gradio page), serve (building and starting it), browser (headless Chromium over its DevTools protocol: the
tests and the screenshots), screenshots (docs/images/app_*.png). Gradio is imported only by ui and serve.
"""
