#!/usr/bin/python3
"""torch_trainmode.py OUTDIR: PyTorch's side of the training-mode export
test (tests/unit/test_train_export.c).  Exports small models with
torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING,
do_constant_folding=False), trains the CNN in PyTorch (float32) and writes
what kiln must reproduce.  Exits 77 (skip) when this interpreter has no torch
or onnx.

  cnn.onnx     Conv2d(1,4,3,pad 1) BatchNorm2d(4, momentum=0.3) ReLU Dropout(p=0) Flatten
               Linear(256,10), opset 14: BatchNormalization training_mode=1
  cnn13.onnx   the same at opset 13 (BatchNormalization with 5 outputs)
  drop.onnx    Linear(64,32) ReLU Dropout(p=0.5) Linear(32,10), no BatchNorm;
               drop_eval_logits.npy: its eval output on batch 0 as [16,64]
  cnn_eval.onnx  the CNN exported in eval mode (the default): BatchNorm
               folded into the conv, Dropout gone
  x.npy y.npy  STEPS fixed batches: f32 [STEPS,BATCH,1,8,8], i64 [STEPS,BATCH]
  loss.npy     f64 [STEPS]: the float32 loss of each SGD step (lr 0.1,
               momentum 0.9, mean cross-entropy), batch s at step s
  running_mean.npy running_var.npy   bn's buffers after those steps
  eval_x.npy eval_logits.npy         the trained model's eval output
               (eval_y.npy: labels for them)
  full_loss.npy  f64 [EPOCHS]: the same SGD on all STEPS*BATCH samples as
               one batch, EPOCHS steps (what `kiln train --batch` with the
               whole set does; row order within a batch only rounds)

Every model's initial weights are read back from its ONNX file, so PyTorch
trains from what kiln imports: tracing in train mode runs the model once on
the example input, so the file's BatchNorm buffers have taken one update.
"""
import os
import sys
import warnings

STEPS, BATCH, EPOCHS = 6, 16, 4


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        import numpy as np
        import onnx
        import onnx.numpy_helper
        import torch
        from torch import nn
    except ImportError as e:
        print(f"skipped: {e} (Debian's python3-torch and python3-onnx)")
        return 77
    warnings.filterwarnings("ignore")
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class CNN(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4, momentum=0.3)  # ONNX momentum 0.7
            self.drop = nn.Dropout(p)
            self.fc = nn.Linear(256, 10)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            return self.fc(torch.flatten(self.drop(h), 1))

    def export(model, shape, path, opset):
        model.train()
        torch.onnx.export(model, torch.zeros(shape), os.path.join(out, path),
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=opset,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}})
        # start from the file's weights (tracing runs the model in train mode)
        m = onnx.load(os.path.join(out, path))
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
        state = model.state_dict()
        for k in state:
            if k in inits:
                state[k] = torch.from_numpy(inits[k].copy())
        model.load_state_dict(state)
        kinds = {n.op_type for n in m.graph.node}
        return kinds

    # tracing in train mode runs the model once, updating BatchNorm's
    # buffers before they are written: both exports start from one state
    cnn, cnn13 = CNN(0.0), CNN(0.0)
    cnn13.load_state_dict(cnn.state_dict())
    kinds = export(cnn, (2, 1, 8, 8), "cnn.onnx", 14)
    assert {"BatchNormalization", "Dropout"} <= kinds, kinds
    export(cnn13, (2, 1, 8, 8), "cnn13.onnx", 13)
    for k, v in cnn13.state_dict().items():
        assert torch.equal(v, cnn.state_dict()[k]), k
    cnn.eval()
    torch.onnx.export(cnn, torch.zeros(2, 1, 8, 8), os.path.join(out, "cnn_eval.onnx"),
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}})
    drop = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))
    export(drop, (2, 64), "drop.onnx", 14)

    rng = np.random.RandomState(7)
    x = rng.randn(STEPS, BATCH, 1, 8, 8).astype(np.float32)
    y = rng.randint(0, 10, (STEPS, BATCH)).astype(np.int64)
    ex = rng.randn(8, 1, 8, 8).astype(np.float32)
    np.save(os.path.join(out, "x.npy"), x)
    np.save(os.path.join(out, "y.npy"), y)
    np.save(os.path.join(out, "eval_x.npy"), ex)
    np.save(os.path.join(out, "eval_y.npy"), rng.randint(0, 10, 8).astype(np.int64))
    np.save(os.path.join(out, "all_x.npy"), x.reshape((-1, 1, 8, 8)))
    np.save(os.path.join(out, "all_y.npy"), y.reshape(-1))
    init = {k: v.clone() for k, v in cnn.state_dict().items()}
    drop.eval()
    with torch.no_grad():
        np.save(os.path.join(out, "drop_eval_logits.npy"),
                drop(torch.from_numpy(x[0].reshape(BATCH, 64))).numpy())

    def train(batches):
        model = CNN(0.0)
        model.load_state_dict(init)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for xb, yb in batches:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.from_numpy(xb)),
                                               torch.from_numpy(yb))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return model, np.array(losses, dtype=np.float64)

    model, losses = train([(x[s], y[s]) for s in range(STEPS)])
    np.save(os.path.join(out, "loss.npy"), losses)
    np.save(os.path.join(out, "running_mean.npy"), model.bn.running_mean.numpy().astype(np.float64))
    np.save(os.path.join(out, "running_var.npy"), model.bn.running_var.numpy().astype(np.float64))
    model.eval()
    with torch.no_grad():
        np.save(os.path.join(out, "eval_logits.npy"), model(torch.from_numpy(ex)).numpy())
    allx, ally = x.reshape((-1, 1, 8, 8)), y.reshape(-1)
    _, full = train([(allx, ally)] * EPOCHS)
    np.save(os.path.join(out, "full_loss.npy"), full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
