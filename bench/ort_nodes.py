#!/usr/bin/env python3
"""Where kiln loses to ONNX Runtime, node by node.

    .venv/bin/python bench/ort_nodes.py --kiln build-bench/kiln MODEL.onnx
        [--threads T] [--rounds R] [--top N]

Times one model both ways at batch 1 (a symbolic batch bound to 1) and
charges every kernel to an ONNX node:

- ORT: its own profiler (SessionOptions.enable_profiling), each fused
  node's `*_kernel_time` events, min over the runs of about 3 s; ORT names
  a fused node after its output, which is mapped back to the ONNX node
  that produces it, or after one of the nodes it fused plus a suffix
  (EfficientNet's SiLU, Sigmoid and Mul, becomes "<Mul>/QuickGeluFusion/"),
  mapped to that node.
- kiln: `kiln bench --profile --json` R times (min per kernel), each kernel
  charged to the ONNX node whose output buffer it writes (its temporaries
  to the node of the kernel that writes a named buffer), as `kiln compile
  --emit=kir` names them.

Both sides are then moved up to the nearest Conv, Gemm or MatMul through
the element-wise ops either runtime fuses into it (Relu, Add, Clip, ...),
and summed per kind of node (a conv's channels, kernel, stride, output
size, groups), largest kiln - ORT difference first.  The per-node times
are sums of per-kernel minimums: compare them within one run only, as the
two totals printed first.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

FUSED = ('Relu', 'Add', 'Clip', 'BatchNormalization', 'Sigmoid', 'Mul', 'HardSwish',
         'HardSigmoid')


def ort_nodes(model, threads):
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "kiln_ort_nodes")
    s = ort.InferenceSession(model, so, providers=['CPUExecutionProvider'])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.random(shape, dtype=np.float32)
    for _ in range(10):
        s.run(None, feeds)
    t = time.time()
    while time.time() - t < 3:
        s.run(None, feeds)
    path = s.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    per, op = collections.defaultdict(list), {}
    for e in events:
        if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time'):
            name = e['name'][:-len('_kernel_time')]
            per[name].append(e['dur'])
            op[name] = e.get('args', {}).get('op_name', '?')
    return {k: min(v) / 1000 for k, v in per.items()}, op


def kiln_nodes(kiln, model, threads, rounds):
    with tempfile.TemporaryDirectory() as d:
        lib, kir = os.path.join(d, "m.so"), os.path.join(d, "m.kir")
        subprocess.run([kiln, "compile", model, "-o", lib], check=True, capture_output=True)
        subprocess.run([kiln, "compile", model, "--emit=kir", "-o", kir], check=True,
                       capture_output=True)
        with open(kir) as f:
            text = f.read()
        names = dict(re.findall(r'^(buf\d+) \S+ \S+ .*?"([^"]*)"\s*$', text, re.M))
        node_of, written = {}, {}
        for k, nid, body in re.findall(r'^kernel (\S+) \(node (\d+)\)[^\n]*\{(.*?)^\}', text,
                                       re.M | re.S):
            node_of[k] = int(nid)
            w = (re.findall(r'(buf\d+)\[[^\n]*\] = ', body) + re.findall(r'C=(buf\d+)', body) +
                 re.findall(r'-> (buf\d+)', body))
            w = [names[b] for b in w if b in names]
            if w:
                written[int(nid)] = w[-1]
        best = collections.defaultdict(lambda: float('inf'))
        for _ in range(rounds):
            out = subprocess.run([kiln, "bench", lib, "--threads", str(threads), "--time", "1",
                                  "--profile", "--json"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
            per = collections.Counter()
            for e in json.loads(out[1])['profile']:
                per[node_of[e['kernel']]] += e['ms']
            for n, v in per.items():
                best[n] = min(best[n], v)
    return {written.get(n, "?node%d" % n): v for n, v in best.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    import onnx
    from onnx import shape_inference
    g = shape_inference.infer_shapes(onnx.load(a.model)).graph
    prod = {o: i for i, nd in enumerate(g.node) for o in nd.output}
    shape = {vi.name: [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
             for vi in list(g.value_info) + list(g.output) + list(g.input)}
    shape.update({t.name: list(t.dims) for t in g.initializer})

    def anchor(i):
        for _ in range(4):
            if g.node[i].op_type not in FUSED:
                break
            ins = [prod[x] for x in g.node[i].input if x in prod]
            heavy = [j for j in ins if g.node[j].op_type in ('Conv', 'Gemm', 'MatMul')]
            if heavy:
                return max(heavy)
            if not ins:
                break
            i = max(ins)
        return i

    def kind(i):
        if isinstance(i, str):
            return i
        nd = g.node[i]
        if nd.op_type != 'Conv':
            return nd.op_type
        attr = {x.name: x for x in nd.attribute}
        w, o = shape[nd.input[1]], shape[nd.output[0]]
        grp = attr['group'].i if 'group' in attr else 1
        st = attr['strides'].ints[0] if 'strides' in attr else 1
        return "conv %d->%d k%d s%d @%d g%d" % (w[1] * grp, o[1], w[2], st, o[2], grp)

    def by_node(times, lookup, other):
        out = collections.Counter()
        for name, v in times.items():
            i = lookup(name)
            out[anchor(i) if i is not None else other(name)] += v
        return out

    by_name = {nd.name: i for i, nd in enumerate(g.node)}
    # ORT's own nodes (layout reorders) and kiln kernels of no ONNX node
    # count under their own names
    ort_times, ort_op = ort_nodes(a.model, a.threads)
    def ort_lookup(n):
        base = re.sub(r'(_nchwc)+$', '', n)
        if base in prod or n in by_name:
            return prod.get(base, by_name.get(n))
        # a node ORT fused and renamed after one of the originals plus a
        # suffix ("<Mul's name>/QuickGeluFusion/"): that original node
        m = n.rstrip('/')
        while '/' in m:
            m = m.rsplit('/', 1)[0]
            if m in by_name:
                return by_name[m]
        return None
    ort_t = by_node(ort_times, ort_lookup, lambda n: "(ORT %s)" % ort_op.get(n, "?"))
    kiln_t = by_node(kiln_nodes(a.kiln, a.model, a.threads, a.rounds), prod.get,
                     lambda n: "(kiln %s)" % n)
    rows = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for i in set(ort_t) | set(kiln_t):
        r = rows[kind(i)]
        r[0] += kiln_t[i]
        r[1] += ort_t[i]
        r[2] += 1
    tk, to = sum(kiln_t.values()), sum(ort_t.values())
    print("%s, batch 1, %d thread(s): kiln %.3f ms, ORT %.3f ms (sums of per-node minimums), "
          "kiln/ORT %.3f" % (os.path.basename(a.model), a.threads, tk, to, tk / to))
    print("%-34s %3s %8s %8s %8s" % ("node kind", "n", "kiln ms", "ORT ms", "diff"))
    for k, (x, y, n) in sorted(rows.items(), key=lambda r: -(r[1][0] - r[1][1]))[:a.top]:
        print("%-34s %3d %8.3f %8.3f %+8.3f" % (k, n, x, y, x - y))
    return 0


if __name__ == "__main__":
    sys.exit(main())
