"""DAVIR's vision-language models, one shape for every family: ``base`` (the abstract ``DavirVLM``),
``instructblip`` (``DavirModel``, a Q-Former family's model), ``chat`` (``ChatDavirModel``, the chat families'),
``build`` (build or load the class a family names), ``config``, ``lora`` (App. B), ``checkpoint`` (the saved
folder), ``output``, ``epc`` (Eq. 10 prompts) and the FAC hooks (``attention``, ``received_attention``,
``window_attention``). The public names are exported lazily by ``davir.models``."""
