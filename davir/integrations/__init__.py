"""davir inside other fine-tuning toolkits: the DAVIR prompt (EPC) for their datasets, and FAC in TRL's SFTTrainer
(``davir.integrations.trl``, which needs ``pip install 'davir[trl]'``). docs/toolkits.md."""
