# Two commands for a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= outputs/demo
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install system-deps test demo clean-demo

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

install: $(VENV)/.installed system-deps

# Java runs the PTB tokenizer and METEOR (pycocoevalcap); WordNet's word lists feed the offline chunker.
system-deps:
	@command -v java >/dev/null 2>&1 || (apt-get update && apt-get install -y default-jre-headless)
	@test -f /usr/share/wordnet/index.noun || (apt-get update && apt-get install -y --no-install-recommends wordnet-base) || \
		echo "wordnet-base not installed: the entity chunker uses its corpus-fitted rules"

test: install
	$(PY) -m pytest -q tests

DEMO_SCENES ?= 1500
DEMO_DATA := $(DEMO_DIR)/data
SPLITS := train val test

# The whole job on the built-in synthetic set: data → masks → entities → DAVIR fine-tune → evaluate → caption.
demo: install
	$(PY) -m davir.data synth --out $(DEMO_DATA) --scenes $(DEMO_SCENES) --seed 0
	$(PY) -m davir.data stats --format clevr_change --root $(DEMO_DATA)
	$(PY) -m davir.data show --format clevr_change --root $(DEMO_DATA) --split test --out $(DEMO_DIR)/grid.png
	for split in $(SPLITS); do $(PY) -m preprocess masks --format clevr_change --root $(DEMO_DATA) --split $$split \
		--out $(DEMO_DIR)/masks --workers 2 --viz $(DEMO_DIR)/mask_viz --viz-count 4 || exit 1; done
	$(PY) -m preprocess mask-eval --format clevr_change --root $(DEMO_DATA) --split test --masks $(DEMO_DIR)/masks
	for split in $(SPLITS); do $(PY) -m preprocess entities --format clevr_change --root $(DEMO_DATA) --split $$split \
		--masks $(DEMO_DIR)/masks --out $(DEMO_DIR)/entities || exit 1; done
	$(PY) -m preprocess entity-eval --format clevr_change --root $(DEMO_DATA) --split test --entities $(DEMO_DIR)/entities
	$(PY) train.py --config configs/demo.yaml run.overwrite=true
	$(PY) evaluate.py --checkpoint runs/demo --split test --no-spice
	$(PY) -m davir.data pairs --format clevr_change --root $(DEMO_DATA) --split test --num 12 --out $(DEMO_DATA)/demo_pairs.csv
	$(PY) caption.py --checkpoint runs/demo --pairs $(DEMO_DATA)/demo_pairs.csv --out $(DEMO_DIR)/captions.jsonl \
		--html $(DEMO_DIR)/report.html
	@echo "demo done: metrics in runs/demo/eval/clevr_change_test/metrics.md, report in $(DEMO_DIR)/report.html"

clean-demo:
	rm -rf $(DEMO_DIR) runs/demo
