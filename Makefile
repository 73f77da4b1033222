# `make demo` and `make test` each set up everything on a fresh machine first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hotrod-installed

.PHONY: demo test test-ray peers test-peers bench lint clean native

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch, pinned: an unpinned torch would pull gigabytes of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

# hotrod's CPU kernels, loaded into onnxruntime as custom ops (`hotrod.runtime.native`): the int4 products
# (q4gemm.c built twice, for AVX-512 VNNI and for AVX2: `hotrod.runtime.q4`), per-row int8 quantization (AVX2:
# `hotrod.runtime.rows`), LayerNormalization with onnxruntime's arithmetic (AVX2: `hotrod.runtime.norm`), int8
# products on AMX tiles (used only where the CPU has AMX: `hotrod.runtime.i8`), and bf16 products and encoder
# attention on AMX tiles (only where the CPU has AMX-BF16 and the build asked for them: `hotrod.runtime.bf16`,
# `hotrod.runtime.attention`).
# Each file is built for its own instructions, the library's entry point for AVX2, so it loads on any x86-64
# CPU with AVX2; without it, onnxruntime's own ops run the same graphs. The library is linked aside and moved
# into place, so a process that has the old one loaded keeps it.
NATIVE_DIR := src/hotrod/native
NATIVE     := $(NATIVE_DIR)/libhotrod_cpu.so
NATIVE_CFLAGS := -O3 -fPIC -pthread -Wall -Wextra -Werror
# A compiler that knows AMX's instructions (gcc 11 on) builds the AMX kernels; another builds no_amx.c in their
# place (the tiles never ready), so the other kernels still build.
AMX_CC := $(shell printf 'int main(void){return 0;}' | $(CC) -mamx-tile -mamx-int8 -mamx-bf16 -mavx512bf16 \
	-x c -o /dev/null - 2>/dev/null && echo yes)
ifeq ($(AMX_CC),yes)
AMX_BUILD = $(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mprfchw -mamx-tile -mamx-int8 \
		-ffp-contract=off -c -o $$tmp/i8gemm.o $(NATIVE_DIR)/i8gemm.c && \
	$(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mamx-tile -mamx-bf16 \
		-c -o $$tmp/attention.o $(NATIVE_DIR)/attention.c && \
	$(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mfma -c -o $$tmp/attention_vectors.o \
		$(NATIVE_DIR)/attention_vectors.c && \
	$(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -c -o $$tmp/attention_quads.o \
		$(NATIVE_DIR)/attention_quads.c && \
	$(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mamx-tile -mamx-bf16 \
		-ffp-contract=off -c -o $$tmp/bf16gemm.o $(NATIVE_DIR)/bf16gemm.c
AMX_OBJECTS = $$tmp/i8gemm.o $$tmp/attention.o $$tmp/attention_vectors.o $$tmp/attention_quads.o $$tmp/bf16gemm.o
else
AMX_BUILD = echo "hotrod: this compiler knows no AMX: the int8 and attention kernels are left out" && \
	$(CC) $(NATIVE_CFLAGS) -c -o $$tmp/no_amx.o $(NATIVE_DIR)/no_amx.c
AMX_OBJECTS = $$tmp/no_amx.o
endif
$(NATIVE): $(NATIVE_DIR)/q4gemm.c $(NATIVE_DIR)/q4gemm.h $(NATIVE_DIR)/rows.c $(NATIVE_DIR)/rows.h \
		$(NATIVE_DIR)/norm.c $(NATIVE_DIR)/norm.h $(NATIVE_DIR)/ort_norm.c \
		$(NATIVE_DIR)/i8gemm.c $(NATIVE_DIR)/i8gemm.h $(NATIVE_DIR)/gelu.h $(NATIVE_DIR)/gelu_static.h \
		$(NATIVE_DIR)/quantize.h $(NATIVE_DIR)/attention.c $(NATIVE_DIR)/attention.h \
		$(NATIVE_DIR)/attention_vectors.c $(NATIVE_DIR)/attention_vectors.h $(NATIVE_DIR)/transpose.h $(NATIVE_DIR)/lanes.h \
		$(NATIVE_DIR)/attention_problem.h $(NATIVE_DIR)/attention_quads.c $(NATIVE_DIR)/attention_quads.h \
		$(NATIVE_DIR)/bf16gemm.c $(NATIVE_DIR)/bf16gemm.h $(NATIVE_DIR)/ort_bf16.c $(NATIVE_DIR)/tiles.h $(NATIVE_DIR)/dots.h \
		$(NATIVE_DIR)/no_amx.c $(NATIVE_DIR)/unit_rate.c $(NATIVE_DIR)/unit_rate.h \
		$(NATIVE_DIR)/ort_op.c $(NATIVE_DIR)/ort_int8.c $(NATIVE_DIR)/ort_api.h
	@if [ "$$(uname -m)" = x86_64 ]; then \
		tmp=$$(mktemp -d) && \
		$(CC) $(NATIVE_CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -c -o $$tmp/q4gemm.o $(NATIVE_DIR)/q4gemm.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/q4gemm_avx2.o $(NATIVE_DIR)/q4gemm.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/rows.o $(NATIVE_DIR)/rows.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -ffp-contract=off -c -o $$tmp/norm.o $(NATIVE_DIR)/norm.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/unit_rate.o $(NATIVE_DIR)/unit_rate.c && \
		$(AMX_BUILD) && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/ort_op.o $(NATIVE_DIR)/ort_op.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/ort_int8.o $(NATIVE_DIR)/ort_int8.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/ort_norm.o $(NATIVE_DIR)/ort_norm.c && \
		$(CC) $(NATIVE_CFLAGS) -mavx2 -mfma -c -o $$tmp/ort_bf16.o $(NATIVE_DIR)/ort_bf16.c && \
		$(CC) -shared -pthread -Wl,-z,nodelete -o $$tmp/lib.so $$tmp/q4gemm.o $$tmp/q4gemm_avx2.o $$tmp/rows.o $$tmp/norm.o \
			$$tmp/unit_rate.o $(AMX_OBJECTS) $$tmp/ort_op.o $$tmp/ort_int8.o $$tmp/ort_norm.o $$tmp/ort_bf16.o -lm && \
		mv -f $$tmp/lib.so $@; \
		status=$$?; rm -rf $$tmp; exit $$status; \
	else echo "hotrod: no CPU kernels for $$(uname -m): onnxruntime's own ops run the same graphs"; fi

native: $(NATIVE)

demo: $(STAMP) $(NATIVE)
	$(BIN)/hotrod demo

test: $(STAMP) $(NATIVE)
	$(BIN)/python -m pytest

# Ray Serve is large and optional: its own step installs it, then runs the loopback-cluster tests.
test-ray: $(STAMP) $(NATIVE)
	$(BIN)/pip install -q -e ".[ray]"
	$(BIN)/python -m pytest tests/serve/test_ray.py

# The bench's native peers. llama.cpp (llama-cpp-python, compiled for this CPU: a few minutes) goes into
# hotrod's environment; optimum-intel and infinity-emb pin an older transformers, so OpenVINO and Infinity
# each get an environment of their own, with the same CPU build of torch (and without torchvision, whose
# wheel is built for another torch). sentence-transformers' own backends (W9) ride along: its OpenVINO
# backend beside optimum-intel, its ONNX backend (optimum-onnx, which pins transformers 4) beside Infinity.
COMMA := ,
OV_VENV  := .venv-openvino
OV_STAMP := $(OV_VENV)/.hotrod-installed
INF_VENV  := .venv-infinity
INF_STAMP := $(INF_VENV)/.hotrod-installed
PEERS_STAMP := $(VENV)/.hotrod-peers

# llama.cpp's AMX kernels (built where -march=native has AMX) die of SIGILL on their first tile load, with the
# process granted the tile state or not; on such a CPU llama.cpp is built for AVX-512 VNNI and BF16 instead.
# pip's wheel cache is keyed by the source, not by CMAKE_ARGS: a wheel built earlier with other flags (or on
# another CPU) would be reused, so llama.cpp is always compiled here (--no-cache-dir).
LLAMA_CMAKE_ARGS := $(if $(shell grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && echo amx),-DGGML_NATIVE=OFF \
	-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON \
	-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_BMI2=ON)

$(PEERS_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q --no-cache-dir -e ".[peers]"
	touch $(PEERS_STAMP)

# $(call peer_venv,DIR,REQUIREMENTS): an environment with the CPU build of torch and a peer's packages.
define peer_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -q torch==2.13.0 || $(1)/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(1)/bin/pip install -q $(2) "torch==2.13.0"
	$(1)/bin/pip uninstall -q -y torchvision
	touch $(1)/.hotrod-installed
endef

$(OV_STAMP):
	$(call peer_venv,$(OV_VENV),"optimum-intel[openvino]>=2.2$(COMMA)<3" "sentence-transformers[openvino]>=6.2$(COMMA)<7" "datasets>=4$(COMMA)<6")

$(INF_STAMP):
	$(call peer_venv,$(INF_VENV),"infinity-emb[torch$(COMMA)server$(COMMA)optimum]>=0.0.70$(COMMA)<0.1" "sentence-transformers[onnx]>=3.4$(COMMA)<4")

PEER_PYTHONS := HOTROD_OPENVINO_PYTHON=$(CURDIR)/$(OV_VENV)/bin/python HOTROD_INFINITY_PYTHON=$(CURDIR)/$(INF_VENV)/bin/python

peers: $(PEERS_STAMP) $(OV_STAMP) $(INF_STAMP)
	@echo "peers ready: hotrod bench --peers llamacpp,openvino,infinity with $(PEER_PYTHONS)"

test-peers: peers $(NATIVE)
	$(PEER_PYTHONS) $(BIN)/python -m pytest tests/bench/test_llamacpp.py \
		tests/bench/test_openvino_peer.py tests/bench/test_remote.py tests/bench/test_head_workloads.py \
		tests/bench/test_seq2seq_workloads.py

bench: $(STAMP) $(NATIVE)
	$(BIN)/python benchmarks/core.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(OV_VENV) $(INF_VENV) build dist src/*.egg-info .pytest_cache $(NATIVE)
