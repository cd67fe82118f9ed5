"""kiln.TrainStep: a compiled training library (kiln_compile_train) driven
from Python, for custom training loops."""
import ctypes
import os
import shutil
import tempfile

import numpy as np

from . import _lib as L
from ._core import (KilnError, as_array, check, dict_to_tensor_set, fspath, new_error,
                    tensor_set_to_dict, view)
from . import _source
from .model import Model, _open, compile_opts
from .quant import export_onnx

_OPTIM = {"sgd": 0, "adam": 1, "adamw": 2}
_LOSS = {"output": 0, "cross_entropy": 1, "mse": 2}


class TrainStep:
    """One compiled training step (forward, loss, backward, optimizer
    update) with its parameters, buffers and optimizer state, for a loop
    written in Python::

        ts = kiln.TrainStep(net, x[:32], loss="cross_entropy", optimizer="adamw",
                            lr=1e-2, weight_decay=0.01)
        for xb, yb in batches:
            loss = ts.step(xb, yb)            # lr=... to follow a schedule
        logits = ts.eval(x_test)

    model: as for kiln.compile (a path, ONNX bytes, an onnx.ModelProto or a
    torch.nn.Module traced on example_inputs), an inference model: its
    train-mode form (BatchNorm on batch statistics with PyTorch's running
    stat updates, Dropout on; kiln_train_graph_from_inference with seed) is
    the step, the model itself the eval program, both compiled into one
    library by kiln_compile_train.  The library starts from the model's
    weights.

    loss: "cross_entropy" (int64 class targets), "mse" (targets shaped like
    the output) or "output" (the model computes a scalar output "loss"; no
    targets).  optimizer: "sgd", "adam" or "adamw" with PyTorch's
    hyper-parameters (momentum, dampening, nesterov, weight_decay, betas,
    eps); clip_norm > 0 clips the gradient norm first; accum_steps k > 1
    applies the mean gradient of k micro-batches.  output: the output the
    loss reads (default: the first).  batch: fixes the train step's batch
    size (dim 0 of every input whose dim 0 is symbolic), which a model with
    convolutions needs; None keeps it symbolic (an MLP trains on any batch).
    """

    def __init__(self, model, example_inputs=None, *, loss="cross_entropy",
                 optimizer="sgd", lr=0.01, momentum=0.0, dampening=0.0, nesterov=False,
                 weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_norm=0.0,
                 accum_steps=1, output=None, batch=None, seed=0, threads=None,
                 name=None, cpu=None, features=None, jobs=0, cache_dir=None,
                 dynamic_batch=True, opset=17):
        if optimizer not in _OPTIM:
            raise ValueError(f"optimizer must be one of {', '.join(_OPTIM)}, not {optimizer!r}")
        if loss not in _LOSS:
            raise ValueError(f"loss must be one of {', '.join(_LOSS)}, not {loss!r}")
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair, not {betas!r}")
        self.lr = float(lr)
        self.loss_kind = loss
        o = L.TrainOpts()
        o.optim = _OPTIM[optimizer]
        o.momentum, o.dampening, o.nesterov = float(momentum), float(dampening), bool(nesterov)
        o.weight_decay = float(weight_decay)
        o.beta1, o.beta2, o.eps = float(betas[0]), float(betas[1]), float(eps)
        o.clip_norm, o.accum_steps, o.loss = float(clip_norm), int(accum_steps), _LOSS[loss]
        out_b = output.encode() if output is not None else None
        o.output = out_b
        src = _source.resolve(model, example_inputs, training=True,
                              dynamic_batch=dynamic_batch, opset=opset)
        if src.kind == "library":
            raise ValueError(f"kiln.TrainStep: {src.label} is already compiled; open a "
                             "training library with kiln.TrainStep.load_library")
        self._graph = _source.import_graph(src)  # kept for export()
        tmp = tempfile.mkdtemp(prefix="kiln_train_")
        try:
            err = new_error()
            tg = ctypes.c_void_p()
            check(L.lib.kiln_train_graph_from_inference(self._graph.handle, int(seed),
                                                        ctypes.byref(tg), ctypes.byref(err)),
                  err)
            with _source.Graph(tg.value) as train:
                so = os.path.join(tmp, "step.so")
                co, keep = compile_opts(name=name or src.name, cpu=cpu, features=features, jobs=jobs,
                                        cache_dir=cache_dir)
                st = L.lib.kiln_compile_train(train.handle, self._graph.handle,
                                              ctypes.byref(o), int(batch or 0), fspath(so),
                                              ctypes.byref(co), ctypes.byref(err))
                if st != L.OK and not batch and b"symbolic" in err.msg:
                    raise KilnError(err.msg.decode(errors="replace") +
                                    "\n(a model with convolutions trains at a fixed batch "
                                    "size: pass batch=N)", st)
                check(st, err)
            self._model = _open(so, src.label, threads)
        except BaseException:
            self._graph.close()
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._batch = batch
        self._target_dtype = None
        if loss == "cross_entropy":
            self._target_dtype = np.dtype(np.int64)
        elif loss == "mse":
            outs = self._model.outputs
            pick = [io for io in outs if io.name == output] if output else list(outs[:1])
            self._target_dtype = pick[0].dtype if pick else outs[0].dtype

    # ---- properties ----
    @property
    def model(self):
        """The eval program as a kiln.Model, running on the current state."""
        return self._model

    @property
    def inputs(self):
        return self._model.inputs

    @property
    def outputs(self):
        return self._model.outputs

    @property
    def steps(self):
        """Optimizer steps taken (a checkpoint keeps it)."""
        return int(L.lib.kiln_model_steps(self._model._handle()))

    @property
    def threads(self):
        return self._model.threads

    @threads.setter
    def threads(self, n):
        self._model.threads = n

    # ---- training ----
    def step(self, x, y=None, lr=None):
        """One micro-batch: x (an array, or a tuple for a model with several
        inputs) and y, the targets (none for loss="output").  lr: this step's
        learning rate (default: the one given at construction).  Returns the
        batch's loss as a float."""
        xs = list(x) if isinstance(x, (tuple, list)) else [x]
        ins = self._model.inputs
        if len(xs) != len(ins):
            raise TypeError(f"step: the model takes {len(ins)} input(s) "
                            f"({', '.join(io.name for io in ins)}), got {len(xs)}")
        if len(xs) != 1:
            raise ValueError("step: kiln_model_train_step takes one model input; this model "
                             f"has {len(xs)}")
        xa = as_array(xs[0], ins[0].dtype, f"input '{ins[0].name}'")
        self._model._check_shapes([xa])
        if self._batch and xa.shape[0] != self._batch:
            raise ValueError(f"step: the train step was compiled for batch {self._batch}, "
                             f"input '{ins[0].name}' has {xa.shape[0]} rows")
        if self._target_dtype is None:
            if y is not None:
                raise TypeError('step: loss="output" takes no targets')
            ya = None
        else:
            if y is None:
                raise TypeError(f"step: loss={self.loss_kind!r} needs targets y")
            ya = as_array(y, self._target_dtype, "targets y")
        xv = view(xa)
        yv = view(ya) if ya is not None else None
        loss = ctypes.c_double()
        err = new_error()
        m = self._model
        with m._lock:
            st = L.lib.kiln_model_train_step(m._handle(), ctypes.byref(xv),
                                             ctypes.byref(yv) if yv is not None else None,
                                             float(self.lr if lr is None else lr),
                                             ctypes.byref(loss), ctypes.byref(err))
        check(st, err)
        return loss.value

    def eval(self, *x, **kw):
        """The model's outputs on x with the current state (eval mode)."""
        return self._model(*x, **kw)

    __call__ = eval

    # ---- state ----
    def state_dict(self):
        """A copy of the whole state as {name: ndarray}: parameters and
        buffers under PyTorch's names, optimizer state ("<p>.exp_avg",
        "<p>.momentum_buffer", ...), and the counters "__step__" and
        "__micro__" (int64 scalars)."""
        s = L.lib.kiln_model_state(self._model._handle())
        if not s:
            raise KilnError("state_dict: out of memory", L.ENOMEM)
        try:
            return tensor_set_to_dict(s)
        finally:
            L.lib.kiln_tensor_set_free(s)

    def load_state_dict(self, state):
        """Replaces the whole state with state's (a state_dict() of the same
        model and optimizer).  Everything is checked first; on an error
        (KilnError naming the tensor) nothing changes."""
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict takes a dict, not {type(state).__name__}")
        s = dict_to_tensor_set(state, "state_dict")
        err = new_error()
        try:
            m = self._model
            with m._lock:
                st = L.lib.kiln_model_set_state(m._handle(), s, ctypes.byref(err))
        finally:
            L.lib.kiln_tensor_set_free(s)
        check(st, err)

    def save(self, path):
        """Writes a checkpoint (safetensors, kiln_trainer's format, atomic)."""
        err = new_error()
        m = self._model
        with m._lock:
            st = L.lib.kiln_model_save(m._handle(), fspath(path), ctypes.byref(err))
        check(st, err)

    def load(self, path):
        """Resumes from a checkpoint; a bad file is refused and changes nothing."""
        err = new_error()
        m = self._model
        with m._lock:
            st = L.lib.kiln_model_load(m._handle(), fspath(path), ctypes.byref(err))
        check(st, err)

    def export(self, path=None):
        """The trained model as ONNX (the inference model with the current
        parameters and BatchNorm buffers): bytes, or written atomically to
        path (returned)."""
        tmp = tempfile.mkdtemp(prefix="kiln_export_")
        try:
            ck = os.path.join(tmp, "state.safetensors")
            self.save(ck)
            err = new_error()
            check(L.lib.kiln_graph_load_trained(self._graph.handle, fspath(ck),
                                                ctypes.byref(err)), err)
            return export_onnx(self._graph, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def close(self):
        self._model.close()
        self._graph.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<kiln.TrainStep {self._model!r}, {self.steps} steps>"
