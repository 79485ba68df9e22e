"""One scene of either difficulty: the standard sampler (`scenes`) or the hard one (`hard`), by the config."""

from __future__ import annotations

import numpy as np

from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.hard import sample_hard_scene
from davir.data.synthetic.scenes import Scene, sample_standard_scene


def sample_scene(index: int, change_type: str, config: SynthConfig) -> tuple[Scene, np.random.Generator]:
    """Sample scene `index` from its own random stream (independent of every other scene)."""
    if config.difficulty == "hard":
        return sample_hard_scene(index, change_type, config)
    return sample_standard_scene(index, change_type, config)
