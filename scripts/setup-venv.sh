#!/usr/bin/env bash
# Creates .venv in the repository root for the ONNX Runtime checks of
# exported models (tests/onnx/check_export.py), and .venv-quant for ONNX
# Runtime's quantizer (tests/onnx/check_qdq.py).  The venv sees Debian's
# system packages (torch, onnx, numpy: --system-site-packages), and only
# onnxruntime and transformers (with its tokenizers, huggingface_hub...),
# which Debian does not package, come from PyPI.  Idempotent: an existing
# venv is reused and present packages are not reinstalled.
#     scripts/setup-venv.sh            # then: .venv/bin/python -c 'import onnxruntime'
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
py=/usr/bin/python3

if [ ! -x "$venv/bin/python" ]; then
	echo "setup-venv: creating $venv (--system-site-packages, from $py)"
	if ! "$py" -m venv --system-site-packages "$venv"; then
		echo "setup-venv: '$py -m venv' failed; install python3-venv (scripts/install-deps.sh)" >&2
		exit 1
	fi
else
	echo "setup-venv: reusing $venv"
fi

# ONNX Runtime's quantizer (onnxruntime.quantization) needs onnx >= 1.13
# and ml_dtypes, which would pull a numpy 2 over Debian's (torch needs
# Debian's): it gets a venv of its own, without the system packages, that
# only ever quantizes an .onnx file into another (tests/onnx/ort_quantize.py).
quant_venv() {
	q=$root/.venv-quant
	if "$q/bin/python" -c 'import onnxruntime.quantization' 2>/dev/null; then
		echo "setup-venv: $q already has onnxruntime.quantization"
		return 0
	fi
	echo "setup-venv: creating $q for onnxruntime.quantization (onnxruntime, onnx, ml_dtypes from PyPI)"
	if ! { [ -x "$q/bin/python" ] || "$py" -m venv "$q"; } ||
	   ! "$q/bin/python" -m pip install --disable-pip-version-check -q onnxruntime onnx ml_dtypes; then
		echo "setup-venv: no quantizer venv; the checks of ORT-quantized models are skipped" >&2
	fi
}

# Hugging Face transformers, pinned, for the text models that
# tests/onnx/check_text_models.py builds from their configs (BERT,
# DistilBERT, GPT-2 with random weights) and exports with Debian's torch;
# that check is skipped without it, so failing here is not fatal.
hf() {
	if "$venv/bin/python" -c 'import transformers' 2>/dev/null; then
		echo "setup-venv: transformers $("$venv/bin/python" -c 'import transformers; print(transformers.__version__)') already installed"
	elif "$venv/bin/python" -m pip install --disable-pip-version-check -q 'transformers==4.36.2'; then
		echo "setup-venv: transformers 4.36.2 installed"
	else
		echo "setup-venv: pip could not install transformers; the text-model checks are skipped" >&2
	fi
}

if "$venv/bin/python" -c 'import onnxruntime' 2>/dev/null; then
	echo "setup-venv: onnxruntime $("$venv/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)') already installed"
	hf
	quant_venv
	exit 0
fi
echo "setup-venv: installing onnxruntime from PyPI into $venv"
if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q onnxruntime; then
	echo "setup-venv: pip could not install onnxruntime: is PyPI reachable (proxy, offline machine)?" >&2
	echo "setup-venv: without it the ONNX Runtime checks of exported models are skipped" >&2
	exit 1
fi
echo "setup-venv: onnxruntime $("$venv/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)') installed"
hf
quant_venv
