"""One model build at a time in a process.

transformers builds and loads a model under process-wide switches, each put back on the way out:
``from_pretrained`` turns ``PreTrainedModel.init_weights``/``tie_weights`` and torch's init functions into no-ops,
``_from_config`` sets torch's default dtype, and davir seeds torch's global generator so a preset's weights and
LoRA's A matrices are reproducible. Two threads building at once put back each other's switch: one loses its
seed, and the no-ops can stay for the life of the process, so every model built after it has random, untied
LM heads (two ``ChangeCaptioner.from_pretrained`` in threads did this). Every davir path that builds a model
holds :data:`MODEL_BUILD_LOCK`; a thread of the caller's own that builds transformers models beside davir's
can take it too.
"""

from __future__ import annotations

import threading

MODEL_BUILD_LOCK = threading.RLock()  # re-entrant: a build may load a family's core through another locked path
