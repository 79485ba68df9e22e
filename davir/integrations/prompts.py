"""The DAVIR prompt of a pair for the toolkits' datasets and collators: Eq. 10's base prompt, with the EPC entity
phrase from a davir entity cache (`python -m preprocess entities`) when one is given.

    prompt_for = epc_prompt_for("caches/entities")     # prompt_for(pair) or prompt_for("000123.png")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from davir.data.caches import EntityCache
from davir.data.records import ChangePair
from davir.models.vlm.epc import EpcConfig, entity_prompts


def epc_prompt_for(
    entities: str | Path | EntityCache | None = None, epc: EpcConfig | None = None
) -> Callable[[ChangePair | str], str]:
    """pair (or pair id) → its prompt: the base prompt alone without a cache, else with the pair's top
    ``epc.num_entities`` entities (a pair missing from the cache is a DataError naming the command to run)."""
    epc = epc or EpcConfig()
    cache = entities if isinstance(entities, EntityCache) or entities is None else EntityCache(entities)

    def prompt_for(pair: ChangePair | str) -> str:
        pair_id = pair if isinstance(pair, str) else pair.pair_id
        if cache is None:
            return entity_prompts(epc, None, batch_size=1)[0]
        return entity_prompts(epc, [[entity for entity, _ in cache.get(pair_id)]])[0]

    return prompt_for
