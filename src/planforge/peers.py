"""The runtimes a whole imported model is measured against, beside its tuned plan: the model as its user gave it.

A model imported from an ONNX file, an in-memory ONNX model, a ``torch.nn.Module`` or a ``torch.export``
program keeps its original (``ir.ModelSource``). The end-to-end measurement (``planforge.endtoend``) times the
tuned plan, interleaved round by round, against the strongest straightforward runners a user would pick:

- ``onnxruntime``: an ``InferenceSession`` on the ONNX model (graph optimisations on, its default threads: all
  cores); a torch model is first exported with torch's dynamo ONNX exporter (it needs ``onnxscript``);
- ``openvino``: the same ONNX model compiled for the CPU with the latency hint, in fp32 (on CPUs with bf16
  or AMX OpenVINO would otherwise infer in bf16, which is not the same computation);
- ``torch eager``: the module itself under ``torch.inference_mode`` (torch's default threads);
- ``torch.compile``: the module compiled (default mode), only when asked (``compile_torch``): compiling
  takes tens of seconds to minutes, more than many a tuning.

Each one is run once first and its first output compared with the fp64 reference at the plan's own
tolerance: a runner that is not installed, fails to load or run, or computes something else is not timed,
and says why (``Peer.why``). None of them is needed: each is imported only here, only when it runs.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

PEERS_OPTIONS = ("auto", "compile", "none")


def peers_option(options: dict[str, Any]) -> str:
    """A manifest's ``peers`` option: ``auto`` (the default: every installed runtime but torch.compile),
    ``compile`` (torch.compile too) or ``none``; ``ValueError`` for anything else."""
    mode = str(options.get("peers", "auto"))
    if mode not in PEERS_OPTIONS:
        raise ValueError(f"option peers={mode!r}: expected one of {', '.join(PEERS_OPTIONS)}")
    return mode


_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
               "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16}


@dataclass
class Peer:
    """One runtime: ``run()`` (no arguments: its inputs are bound) or None, and ``why`` it is not timed."""

    name: str
    run: Callable[[], Any] | None
    why: str | None = None
    settings: str = ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def _first_output(out: Any) -> np.ndarray:
    """The first tensor of whatever a runtime returned (a list, a tuple, a dict-like model output, a tensor)."""
    while True:
        if hasattr(out, "keys") and not isinstance(out, np.ndarray):
            out = out[next(iter(out.keys()))]
        elif isinstance(out, (list, tuple)):
            out = out[0]
        else:
            break
    if hasattr(out, "detach"):
        out = out.detach().cpu().numpy()
    return np.asarray(out)


def _checked(name: str, run: Callable[[], Any], ref: np.ndarray, tol: float, settings: str) -> Peer:
    """``run`` as a peer when its first output matches ``ref`` within ``tol``; else why not."""
    try:
        y = _first_output(run())
    except Exception as e:  # noqa: BLE001 - any runtime's error, reported as the reason
        return Peer(name, None, f"failed to run: {_first_line(e)}", settings)
    if y.shape != ref.shape and y.size == ref.size:
        y = y.reshape(ref.shape)
    if y.shape != ref.shape:
        return Peer(name, None, f"its output has shape {y.shape}, the model's {ref.shape}", settings)
    err = float(np.abs(y.astype(np.float64) - ref).max()) if y.size else 0.0
    if not err <= tol:
        return Peer(name, None, f"wrong answers: max |out - fp64 reference| = {err:.3g} > {tol:.3g}", settings)
    return Peer(name, run, None, settings)


@contextlib.contextmanager
def _quiet():
    """Runtimes' and exporters' own chatter (progress lines, deprecation warnings) kept off the user's terminal."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _torch_inputs(torch, xs: Sequence[np.ndarray]):
    return tuple(torch.from_numpy(np.ascontiguousarray(x)) for x in xs)


def _module(src) -> Any:
    m = src.module
    return m.module() if hasattr(m, "module") and hasattr(m, "graph_signature") else m  # an ExportedProgram


def _onnx_file(src, xs: Sequence[np.ndarray], workdir: Path) -> tuple[str | None, str | None]:
    """A path to the model as ONNX, or (None, why not): the source file, the in-memory model written out, or a
    torch model exported."""
    if src.kind == "onnx":
        if src.onnx_path:
            return src.onnx_path, None
        if src.onnx_bytes is None:
            return None, "the ONNX model's bytes were not kept"
        p = workdir / "model.onnx"
        p.write_bytes(src.onnx_bytes)
        return str(p), None
    try:
        import torch
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    p = workdir / "model.onnx"
    try:
        with _quiet():
            torch.onnx.export(_module(src), _torch_inputs(torch, xs), str(p), dynamo=True, verbose=False)
    except Exception as e:  # noqa: BLE001 - the exporter's many kinds of failure
        return None, f"torch's ONNX export failed: {_first_line(e)}"
    return str(p), None


def _ort(path: str, xs: Sequence[np.ndarray]) -> tuple[Callable[[], Any] | None, str | None]:
    try:
        import onnxruntime as ort
    except ImportError as e:
        return None, f"not installed ({e})"
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ins = sess.get_inputs()
        if len(ins) != len(xs):
            return None, f"the ONNX model takes {len(ins)} inputs, the graph {len(xs)}"
        feed = {i.name: np.ascontiguousarray(x, _ORT_DTYPES.get(i.type, x.dtype)) for i, x in zip(ins, xs)}
    except Exception as e:  # noqa: BLE001
        return None, f"failed to load: {_first_line(e)}"
    return (lambda: sess.run(None, feed)), None


def _openvino(path: str, xs: Sequence[np.ndarray]) -> tuple[Callable[[], Any] | None, str | None]:
    try:
        import openvino as ov
    except ImportError as e:
        return None, f"not installed ({e})"
    try:
        with _quiet():
            cm = ov.Core().compile_model(path, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                      "INFERENCE_PRECISION_HINT": "f32"})
        req = cm.create_infer_request()
        tensors = [ov.Tensor(np.ascontiguousarray(x), shared_memory=True) for x in xs]
    except Exception as e:  # noqa: BLE001
        return None, f"failed to load: {_first_line(e)}"

    def run():
        req.infer(tensors)
        return req.get_output_tensor(0).data

    return run, None


def _onnx_peers(src, xs: Sequence[np.ndarray], ref: np.ndarray, tol: float, work: Path) -> list[Peer]:
    """ONNX Runtime and OpenVINO on the model as ONNX (its file, or one written into ``work``), loaded and checked."""
    peers: list[Peer] = []
    path, why = _onnx_file(src, xs, work)
    for name, make, settings in (("onnxruntime", _ort, "graph optimisations on, default threads"),
                                 ("openvino", _openvino, "latency hint, fp32")):
        run, err = (None, why) if path is None else make(path, xs)
        peers.append(_checked(name, run, ref, tol, settings) if run else Peer(name, None, err, settings))
    return peers


def model_peers(graph, xs: Sequence[np.ndarray], ref: np.ndarray, tol: float, compile_torch: bool = False,
                workdir: str | Path | None = None) -> list[Peer]:
    """The peers of ``graph``'s original model (none for a graph with no ``source``: a zoo model), bound to
    inputs ``xs`` and checked against ``ref`` (the first output's fp64 reference) within ``tol``. ``workdir``:
    where an ONNX file is written when one is needed (default: a temporary folder, removed once the runtimes
    have loaded it, so a tuning leaves no exported model behind)."""
    src = getattr(graph, "source", None)
    if src is None:
        return []
    with tempfile.TemporaryDirectory(prefix="planforge-peers-") as tmp:
        peers = _onnx_peers(src, xs, ref, tol, Path(workdir) if workdir is not None else Path(tmp))
    if src.kind == "torch":
        try:
            import torch
        except ImportError as e:
            peers.append(Peer("torch eager", None, f"torch is not installed ({e})"))
            return peers
        mod, txs = _module(src), _torch_inputs(torch, xs)

        def eager():
            with torch.inference_mode():
                return mod(*txs)

        peers.append(_checked("torch eager", eager, ref, tol, f"{torch.get_num_threads()} threads"))
        if compile_torch:
            try:
                with _quiet():
                    cmod = torch.compile(mod)

                def compiled():
                    with torch.inference_mode():
                        return cmod(*txs)

                with _quiet():  # the first call compiles (and prints its warnings)
                    compiled()
                peers.append(_checked("torch.compile", compiled, ref, tol, "default mode"))
            except Exception as e:  # noqa: BLE001
                peers.append(Peer("torch.compile", None, f"failed to compile: {_first_line(e)}"))
        else:
            peers.append(Peer("torch.compile", None, "not asked for (option peers=compile): compiling takes "
                                                     "longer than many a tuning"))
    return peers


__all__ = ["PEERS_OPTIONS", "Peer", "model_peers", "peers_option"]
