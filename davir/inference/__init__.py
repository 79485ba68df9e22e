"""Captions from a trained model: loading a run or model folder, generation, a folder of pairs, the JSONL store.

    from davir.inference import ChangeCaptioner
    captioner = ChangeCaptioner.from_pretrained("runs/demo")
"""

from davir.inference.captioner import ChangeCaptioner

__all__ = ["ChangeCaptioner"]
