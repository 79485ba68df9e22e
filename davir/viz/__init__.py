"""Pictures for looking at what the pipeline did (change masks; more panels can join here)."""

from davir.viz.masks import difference_panel, draw_mask_panels

__all__ = ["difference_panel", "draw_mask_panels"]
