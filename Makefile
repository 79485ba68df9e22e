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

demo: install
	$(PY) -m davir.data synth --out $(DEMO_DIR)/data --scenes 2000 --seed 0
	$(PY) -m davir.data stats --format clevr_change --root $(DEMO_DIR)/data
	$(PY) -m davir.data show --format clevr_change --root $(DEMO_DIR)/data --split test --out $(DEMO_DIR)/grid.png

clean-demo:
	rm -rf $(DEMO_DIR)
