# Two commands for a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= outputs/demo
# The model family the demo fine-tunes (davir/models/families; configs/demo.yaml's model.for_family holds each one's
# settings): instructblip (the paper's, assets/tiny_instructblip), qwen2_5_vl, llava_onevision, smolvlm.
DEMO_FAMILY ?= instructblip
DEMO_SUFFIX := $(if $(filter-out instructblip,$(DEMO_FAMILY)),_$(DEMO_FAMILY))
DEMO_RUN ?= runs/demo$(DEMO_SUFFIX)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install system-deps test test-all check-vllm lint format demo demo-data demo-data-check ablation-demo demo-lightweight clean-demo \
	demo-hard ablation-hard hard-data-check clean-demo-hard

$(VENV)/.installed: requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	# packages whose metadata caps a pin above although they work with it (their dependencies are pinned above)
	$(PY) -m pip install --no-deps -r requirements-nodeps.txt
	# the toolkit itself, editable: `import davir` from any folder and the davir-* commands
	$(PY) -m pip install --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed system-deps

# Java runs the PTB tokenizer and METEOR (pycocoevalcap); headless Chromium loads davir-app's page in tests/test_app.py
# (over its DevTools protocol: no driver, no download). The chunker's WordNet word lists ship with the package
# (davir/text/data), so no OS package can change a score or an entity.
system-deps:
	@command -v java >/dev/null 2>&1 || (apt-get update && apt-get install -y default-jre-headless)
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y --no-install-recommends chromium)

# One pytest-xdist worker per core, a test file per worker (module fixtures are built once), the files in the order
# tests/conftest.py gives them (the minute-long ones first); TEST_WORKERS=0 runs serially.
# `make test` leaves out the tests marked slow (chains of fresh processes, the browser, the wheel install);
# `make test-all` runs every test, as CI does (.ci/run).
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: install
	$(PYTEST) -m "not slow" tests

test-all: install
	$(PYTEST) tests

# `caption.py --engine vllm` checked against vLLM's own input processing (tests/test_vllm_inputs.py). vLLM pins its own
# torch and transformers, so it lives in a venv of its own (about 9 GB); no GPU is needed for the check.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.33.0

$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	# num2words: SmolVLM's processor imports it
	$(VLLM_VENV)/bin/python -m pip install vllm==$(VLLM_VERSION) num2words
	touch $@

check-vllm: install $(VLLM_VENV)/.installed
	DAVIR_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -n 0 tests/test_vllm_inputs.py

# ruff: the formatter and a small rule set (pyproject.toml [tool.ruff]); CI fails on either. `make format` fixes both.
lint: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

DEMO_SCENES ?= 1500
DEMO_SEED ?= 0
# standard (the built-in set as it always was) or hard (parallax camera moves, crowded scenes; docs/experiments/synthetic_hard.md)
DEMO_DIFFICULTY ?= standard
TINY_BACKBONE ?= davir/assets/tiny_resnet/backbone.pth
DEMO_DATA := $(DEMO_DIR)/data
SPLITS := train val test

DEMO_READY := $(DEMO_DIR)/.data-ready
# What the demo data is made with, written into the marker: other settings for the same DEMO_DIR are refused
# (its masks, entities, features and the runs trained on them belong to the data it holds).
# A standard set's spec names no difficulty, so demo folders made before difficulties existed stay valid.
DEMO_SPEC := scenes=$(DEMO_SCENES) seed=$(DEMO_SEED)$(if $(filter-out standard,$(DEMO_DIFFICULTY)), difficulty=$(DEMO_DIFFICULTY))
# Where the sweeps write their runs, and extra arguments for every sweep (e.g. SWEEP_ARGS="--seeds 0").
LW_RUNS ?= runs/lightweight_demo
ABLATION_RUNS ?= runs/ablation_demo$(DEMO_SUFFIX)
SWEEP_ARGS ?=
# Extra key=value overrides for the DAVIR demo's training (e.g. DEMO_TRAIN_ARGS="optim.max_steps=50").
DEMO_TRAIN_ARGS ?=

# The knob that names the folder and the target that clears it, for the refusal below (the hard targets pass theirs).
DIR_KNOB ?= DEMO_DIR
CLEAN_HINT ?= make clean-demo DEMO_DIR=$(DEMO_DIR)

demo-data-check:
	@if [ -f $(DEMO_READY) ] && [ "$$(cat $(DEMO_READY))" != "$(DEMO_SPEC)" ]; then \
		made="$$(cat $(DEMO_READY))"; \
		echo "error: $(DEMO_DIR) holds demo data made with $${made:-settings it did not record}, not $(DEMO_SPEC);" \
			"give another $(DIR_KNOB)=... for this data, or remove the old one first: $(CLEAN_HINT)" >&2; \
		exit 2; fi

# The built-in synthetic set with its preprocessing: data → change masks → change entities (scored on test).
$(DEMO_READY): $(VENV)/.installed | demo-data-check
	$(PY) -m davir.data synth --out $(DEMO_DATA) --scenes $(DEMO_SCENES) --seed $(DEMO_SEED) --difficulty $(DEMO_DIFFICULTY)
	$(PY) -m davir.data stats --format clevr_change --root $(DEMO_DATA)
	$(PY) -m davir.data show --format clevr_change --root $(DEMO_DATA) --split test --out $(DEMO_DIR)/grid.png
	for split in $(SPLITS); do $(PY) -m preprocess masks --format clevr_change --root $(DEMO_DATA) --split $$split \
		--out $(DEMO_DIR)/masks --workers 2 --viz $(DEMO_DIR)/mask_viz --viz-count 4 || exit 1; done
	$(PY) -m preprocess mask-eval --format clevr_change --root $(DEMO_DATA) --split test --masks $(DEMO_DIR)/masks
	for split in $(SPLITS); do $(PY) -m preprocess entities --format clevr_change --root $(DEMO_DATA) --split $$split \
		--masks $(DEMO_DIR)/masks --out $(DEMO_DIR)/entities || exit 1; done
	$(PY) -m preprocess entity-eval --format clevr_change --root $(DEMO_DATA) --split test --entities $(DEMO_DIR)/entities
	echo "$(DEMO_SPEC)" > $@

demo-data: install $(DEMO_READY)

# The whole job: data → masks → entities → DAVIR fine-tune of the tiny pretrained model → evaluate → caption.
# Each run trains anew (run.overwrite), so caption.py starts its captions anew too (--overwrite).
demo: install $(DEMO_READY)
	$(PY) train.py --config configs/demo.yaml run.overwrite=true run.output_dir=$(DEMO_RUN) data.root=$(DEMO_DATA) \
		data.masks=$(DEMO_DIR)/masks data.entities=$(DEMO_DIR)/entities model.family=$(DEMO_FAMILY) $(DEMO_TRAIN_ARGS)
	$(PY) evaluate.py --checkpoint $(DEMO_RUN) --split test --no-spice
	$(PY) -m davir.data pairs --format clevr_change --root $(DEMO_DATA) --split test --num 12 --out $(DEMO_DATA)/demo_pairs.csv
	$(PY) caption.py --checkpoint $(DEMO_RUN) --pairs $(DEMO_DATA)/demo_pairs.csv --out $(DEMO_DIR)/captions$(DEMO_SUFFIX).jsonl \
		--html $(DEMO_DIR)/report$(DEMO_SUFFIX).html --overwrite
	@echo "demo done: metrics in $(DEMO_RUN)/eval/clevr_change_test/metrics.md, report in $(DEMO_DIR)/report$(DEMO_SUFFIX).html"

# The paper's Table 4 at tiny scale: FAC off/on × EPC off/on, 3 seeds, mean ± std (runs/ablation_demo/summary.md);
# DEMO_FAMILY=qwen2_5_vl: the same on the tiny pretrained Qwen2.5-VL (runs/ablation_demo_qwen2_5_vl).
ablation-demo: install $(DEMO_READY)
	$(PY) -m davir.sweep configs/sweeps/ablation_demo.yaml --var demo_dir=$(DEMO_DIR) --out $(ABLATION_RUNS) \
		$(if $(DEMO_SUFFIX),--set model.family=$(DEMO_FAMILY)) $(SWEEP_ARGS)

# The five lightweight methods on the same data: layer3 grid features of the shipped tiny pretrained ResNet
# (davir/assets/tiny_resnet, docs/experiments/tiny_backbone.md; no ImageNet weights can be downloaded here), CHEER's image-level
# entities, then 3 seeds each (runs/lightweight_demo/summary.md).
# Two 1-thread processes at a time (2 cores): feature shards; then CHEER's entities → CHEER, RDD in one process
# while subtraction, DIRL, SCORER run in the other (about equal work, by measured cost); then one summary pass.
LW_SWEEP := configs/sweeps/lightweight_demo.yaml
LW := $(PY) -m davir.sweep $(LW_SWEEP) --var demo_dir=$(DEMO_DIR) --out $(LW_RUNS) $(SWEEP_ARGS)
demo-lightweight: install $(DEMO_READY)
	for split in $(SPLITS); do \
		for shard in 0 1; do OMP_NUM_THREADS=1 $(PY) -m preprocess features --format clevr_change --root $(DEMO_DATA) \
			--split $$split --out $(DEMO_DIR)/features --weights $(TINY_BACKBONE) --workers 0 \
			--num-shards 2 --shard-index $$shard & eval "p$$shard=$$!"; done; \
		wait $$p0 && wait $$p1 || exit 1; done
	export OMP_NUM_THREADS=1; \
		(for split in $(SPLITS); do $(PY) -m preprocess entities --format clevr_change --root $(DEMO_DATA) --split $$split \
			--image-level --top-k 3 --out $(DEMO_DIR)/entities_image --no-progress || exit 1; done && \
		 $(LW) --variants CHEER RDD+ACR) & p0=$$!; \
		$(LW) --variants subtraction DIRL+CCR SCORER+CBR & p1=$$!; \
		wait $$p0 && wait $$p1
	$(LW)

clean-demo:
	rm -rf $(DEMO_DIR) $(DEMO_RUN) $(ABLATION_RUNS) $(LW_RUNS)

# The hard set, where localisation decides (docs/experiments/synthetic_hard.md; docs/experiments/results.md, "The hard set"): its data and
# pixel-level caches as `make demo-data DEMO_DIFFICULTY=hard` makes them, plus the object-level masks [D] and the
# entities retrieved from them (ablation-hard compares the two).
HARD_DIR ?= outputs/demo_hard
HARD_RUN ?= runs/demo_hard
HARD_ABLATION_RUNS ?= runs/ablation_hard
HARD_LW_RUNS ?= runs/lightweight_hard
# What every recursive make of the hard targets passes: the folder, the data, and the refusal's own clean-up hint
# (clean-demo would also remove runs/demo and the standard sweeps).
HARD := DEMO_DIR=$(HARD_DIR) DEMO_DIFFICULTY=hard DEMO_SCENES=$(DEMO_SCENES) DEMO_SEED=$(DEMO_SEED) DIR_KNOB=HARD_DIR \
	CLEAN_HINT="make clean-demo-hard HARD_DIR=$(HARD_DIR)"
HARD_READY := $(HARD_DIR)/.object-ready
HARD_OBJECT := data.masks=$(HARD_DIR)/masks_object data.entities=$(HARD_DIR)/entities_object data.preprocessing_profile=null

# A hard folder made with other settings is refused before anything runs.
hard-data-check:
	@$(MAKE) --no-print-directory -s demo-data-check $(HARD)

$(HARD_READY): $(VENV)/.installed | hard-data-check
	$(MAKE) demo-data $(HARD)
	for split in $(SPLITS); do $(PY) -m preprocess masks --format clevr_change --root $(HARD_DIR)/data --split $$split \
		--out $(HARD_DIR)/masks_object --localisation object --workers 2 --viz $(HARD_DIR)/mask_viz_object \
		--viz-count 4 || exit 1; done
	$(PY) -m preprocess mask-eval --format clevr_change --root $(HARD_DIR)/data --split test --masks $(HARD_DIR)/masks_object
	for split in $(SPLITS); do $(PY) -m preprocess entities --format clevr_change --root $(HARD_DIR)/data --split $$split \
		--masks $(HARD_DIR)/masks_object --out $(HARD_DIR)/entities_object || exit 1; done
	$(PY) -m preprocess entity-eval --format clevr_change --root $(HARD_DIR)/data --split test \
		--entities $(HARD_DIR)/entities_object
	cp $(HARD_DIR)/.data-ready $@

# The demo on the hard set: data and both caches, DAVIR (FAC + EPC on the object-level masks) → evaluate → report,
# then the five lightweight methods (3 seeds each, $(HARD_LW_RUNS)/summary.md).
demo-hard: install hard-data-check $(HARD_READY)
	$(MAKE) demo $(HARD) DEMO_RUN=$(HARD_RUN) DEMO_TRAIN_ARGS="$(HARD_OBJECT) $(DEMO_TRAIN_ARGS)"
	$(MAKE) demo-lightweight $(HARD) LW_RUNS=$(HARD_LW_RUNS)

# FAC off / toolkit / paper × EPC off/on × pixel / object masks on the hard set, 3 seeds (configs/sweeps/ablation_hard.yaml;
# $(HARD_ABLATION_RUNS)/summary.md): two 1-thread processes of three variants each, then one summary pass.
HARD_SWEEP := $(PY) -m davir.sweep configs/sweeps/ablation_hard.yaml --var demo_dir=$(HARD_DIR) --out $(HARD_ABLATION_RUNS) $(SWEEP_ARGS)
ablation-hard: install hard-data-check $(HARD_READY)
	export OMP_NUM_THREADS=1; \
		$(HARD_SWEEP) --variants lora_no_fac_no_epc epc_pixel_entities fac_toolkit_epc_pixel & p0=$$!; \
		$(HARD_SWEEP) --variants epc_object_entities fac_toolkit_epc_object fac_paper_eq_7_epc_object & p1=$$!; \
		wait $$p0 && wait $$p1
	$(HARD_SWEEP)

clean-demo-hard:
	rm -rf $(HARD_DIR) $(HARD_RUN) $(HARD_ABLATION_RUNS) $(HARD_LW_RUNS)
