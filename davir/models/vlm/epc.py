"""EPC, the entity prompt of Eq. 10: its settings and the prompt text of each pair."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class EpcConfig:
    """Entity prompt construction, Eq. 10: P = [Prompt] + "Entity:" + the top-k entities (k = 1 [P, Table 5]).

    The base prompt is not given in the paper [D]. With ``use_entities`` False, or for a pair without
    entities, the prompt is the base prompt alone."""

    use_entities: bool = True
    num_entities: int = 1
    prompt: str = "Describe the difference between the two images."
    entity_prefix: str = "Entity:"

    def __post_init__(self) -> None:
        if self.num_entities < 1:
            raise ValueError(f"epc.num_entities must be >= 1, got {self.num_entities}")
        if not self.prompt.strip():
            raise ValueError("epc.prompt must not be empty")


def entity_prompts(
    epc: EpcConfig, entities: Sequence[Sequence[str]] | None, *, batch_size: int | None = None
) -> list[str]:
    """Eq. 10, P = [Prompt] + "Entity:" + Concat(T), per pair: ``"<prompt> Entity: e1, e2."`` with the first
    ``epc.num_entities`` entities (retrieval order, best first).

    ``entities`` None (or ``epc.use_entities`` False) gives the base prompt; with None, ``batch_size`` says
    how many. A pair with an empty entity list gets the base prompt.
    """
    base = epc.prompt.strip()
    if entities is None:
        if batch_size is None:
            raise ValueError("entity prompts without entities need batch_size")
        return [base] * batch_size
    prompts = []
    for pair_entities in entities:
        chosen = [e.strip() for e in pair_entities if e and e.strip()][: epc.num_entities]
        if not epc.use_entities or not chosen:
            prompts.append(base)
        else:
            prompts.append(f"{base} {epc.entity_prefix} {', '.join(chosen)}.")
    return prompts
