"""Preprocessing components, one per module; davir/jobs/ runs them over whole datasets (docs/preprocessing.md).

change_regions   Eq. 2: difference map → threshold δ → DBSCAN clusters → box + point prompts
registration     before→after alignment and photometric matching (beyond the paper, [D])
segmenters/      S of Eq. 3 behind a registry: classical (weight-free) and SAM (local checkpoint)
mask_pipeline    one pair's change masks: regions → segmenter → IoU filter → union (Eqs. 2-3)
retrievers/      Eq. 8 regions, Eq. 9 retrieval (CLIP, fitted), the entity gate, CHEER's image level
backbone         ResNet-101 up to layer3 and its input recipe (lightweight methods)
online           masks and entities of one new pair with the settings of a model's caches
"""
