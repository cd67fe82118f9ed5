#!/usr/bin/env python3
"""kiln vs ONNX Runtime on text models with a dynamic sequence length.

    .venv/bin/python tests/onnx/check_text_models.py KILN OUT_DIR [NAME...]

Names (default: all): bert_op13, bert_op17, distilbert_op13,
distilbert_op17, gpt2_op13, gpt2_op17.  Each is the Hugging Face
transformers model built from a small config (2 layers, width 128, 2
heads, vocabulary 1000; random weights, seed 0) and exported by PyTorch at
that opset with input_ids and attention_mask of dynamic batch and sequence
length ("N", "S").  Position ids and token types are then slices of [1,512]
buffers ending at S, GPT-2's causal mask a slice of a [1,1,1024,1024]
buffer and its positions Range(0, S): kiln imports those with S as a
symbolic dim (Slice's ends, Range's length, Reshape's shape).

Every model runs through kiln's interpreter (`KILN run MODEL.onnx`), as a
library (`KILN compile`, `KILN run M.so`), and as kiln's ONNX export of it
(`KILN export`, run by ONNX Runtime) at (N, S) = (3, 11) and (2, 16),
the attention mask with zeros (one row half masked), and every output
(GPT-2's present keys and values too) must agree with ONNX Runtime's within
1e-4 + 1e-4 * |ORT|; the line per model prints the largest absolute and
relative error, the largest error over the largest |ORT| (rel/max), and
the compile time.  Then the library runs at an S past the position
buffers (600 > 512; GPT-2 1100 > 1024) and must fail with a message naming
the op that notices (the Slice's end check; GPT-2's position-embedding
Gather comes first), not read past the buffer.

Runs with the venv of scripts/setup-venv.sh (onnxruntime and transformers,
with Debian's torch and onnx through system site packages).  Exits 77
(ctest's skip code) when onnxruntime, torch or transformers is missing, 1
when a model fails, 0 otherwise.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_bench_models import check_models, run  # noqa: E402
from check_rnn_models import check_against  # noqa: E402

VOCAB = 1000
SIZES = ((3, 11), (2, 16))
# past the position buffers (512; GPT-2's 1024): the op that notices first
TOO_LONG = {"bert": (600, "Slice '/Slice': axis 1 end S = 600 out of range [0, 513)"),
            "distilbert": (600, "Slice '/embeddings/Slice': axis 1 end S = 600 out of range"),
            "gpt2": (1100, "Gather '/wpe/Gather': axis 0 index 1024 out of range")}
DEFAULT = tuple(f"{m}_op{o}" for m in ("bert", "distilbert", "gpt2") for o in (13, 17))


def ready():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        return f"{e} (scripts/setup-venv.sh installs transformers==4.36.2 into .venv)"
    return None


def hf_model(torch, name):
    import transformers as t
    torch.manual_seed(0)
    if name == "bert":
        m = t.BertModel(t.BertConfig(num_hidden_layers=2, hidden_size=128,
                                     num_attention_heads=2, intermediate_size=512,
                                     vocab_size=VOCAB))
    elif name == "distilbert":
        m = t.DistilBertModel(t.DistilBertConfig(n_layers=2, dim=128, n_heads=2,
                                                 hidden_dim=512, vocab_size=VOCAB))
    else:
        m = t.GPT2Model(t.GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=VOCAB))
    return m.eval()


def export(torch, name, opset, path):
    import warnings
    m = hf_model(torch, name)
    ids = torch.randint(0, VOCAB, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    dyn = {"input_ids": {0: "N", 1: "S"}, "attention_mask": {0: "N", 1: "S"},
           "last_hidden_state": {0: "N", 1: "S"}}
    with warnings.catch_warnings():  # tracer warnings about Python control flow
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (ids, mask) if name != "gpt2" else (ids, None, mask), path,
                          opset_version=opset, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamic_axes=dyn)


def feeds_for(np, n, s, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (n, s)).astype(np.int64)
    mask = np.ones((n, s), np.int64)
    mask[1, s // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def check(np, ort, torch, kiln, out, tag):
    name, opset = tag.split("_op")
    model = os.path.join(out, f"{tag}.onnx")
    export(torch, name, int(opset), model)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    so = os.path.join(out, f"{tag}.so")
    t0 = time.monotonic()
    run([kiln, "compile", model, "-o", so])
    secs = time.monotonic() - t0
    # kiln's own export of the imported graph (S as Shape arithmetic)
    exported = os.path.join(out, f"{tag}_kiln.onnx")
    run([kiln, "export", model, "-o", exported])
    esess = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    lines = []
    for n, s in SIZES:
        feeds = feeds_for(np, n, s, n * 100 + s)
        want = sess.run(None, feeds)
        res = {"export": esess.run(None, feeds)}
        args = []
        for k, v in feeds.items():
            path = os.path.join(out, f"{tag}_{n}x{s}_{k}.npy")
            np.save(path, v)
            args += ["-i", f"{k}={path}"]
        for backend, target in (("interp", model), ("so", so)):
            d = os.path.join(out, f"{tag}_{n}x{s}_{backend}")
            run([kiln, "run", target] + args + ["-o", d])
            res[backend] = [np.load(os.path.join(d, k.replace("/", "_") + ".npy"))
                            for k in names]
        line, why = check_against(np, res, want)
        if why:
            return f"(N, S) = ({n}, {s}): {why}"
        top = max(float(np.abs(w).max()) for w in want)
        worst = max(float(np.abs(g.astype(np.float64) - w).max())
                    for got in res.values() for g, w in zip(got, want))
        lines.append(f"({n},{s}) {line}, rel/max {worst / top:.1e}")
    # past the position buffer: a clear error from the library, no read
    # outside it (the slice's end check)
    s, op = TOO_LONG[name]
    args = []
    for k, v in feeds_for(np, 2, s, 7).items():
        path = os.path.join(out, f"{tag}_long_{k}.npy")
        np.save(path, v)
        args += ["-i", f"{k}={path}"]
    r = subprocess.run([kiln, "run", so] + args, capture_output=True, text=True)
    if r.returncode == 0 or op not in r.stderr:
        return f"S = {s}: expected {op} to refuse it, got exit " \
               f"{r.returncode}: {r.stderr.strip()[-300:]}"
    print(f"{tag}: compiled in {secs:.1f} s; " + "; ".join(lines) +
          f"; S={s} refused")
    return None


if __name__ == "__main__":
    sys.exit(check_models(sys.argv, __doc__, DEFAULT, check, ready))
