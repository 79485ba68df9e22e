"""`davir-app`: look at a trained model in a browser (Gradio), on the CPU or a GPU.

    davir-app --checkpoint runs/demo                         # http://127.0.0.1:7860
    davir-app --checkpoint runs/demo --compare runs/other --captions outputs/demo/captions.jsonl

The three tabs and the modules (models, pair, uploads, browse, ui, serve, browser, screenshots): docs/recipes.md,
"Look at a model in a browser".
"""
