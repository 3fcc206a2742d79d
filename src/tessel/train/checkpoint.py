"""Atomic, resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout of ``dir``::

    step-00000100/      a complete checkpoint: DCP shards + .metadata + tessel.json
    step-00000200.tmp/  a save in progress (ignored; removed by the next save)
    latest              name of the newest complete checkpoint, replaced atomically

A save writes into ``*.tmp`` and is renamed only after every rank has finished, so a crash during a
save leaves the previous checkpoint loadable; tessel.json, written last, holds the size and SHA-256 of every
file, and nothing is loaded before they are checked (:mod:`tessel.train.integrity`): a damaged checkpoint is
skipped for the newest intact one. Besides model and optimizer, each rank stores its RNG state and data
position under its own key, which is what makes resume bit-identical. Loading runs no code from the files:
DCP's pickled ``.metadata`` is read admitting only DCP's own classes, other entries with
``torch.load(weights_only=True)`` (:mod:`tessel.train.safe_load`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .. import comm
from ..errors import CheckpointError
from .integrity import META, checkpoints, newest_intact, problem, seal
from .safe_load import SafeLoadPlanner, SafeReader, read_metadata

LATEST = "latest"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def latest(dir: str | Path) -> Path | None:
    """The newest intact checkpoint in ``dir`` (every file as it was written), or None."""
    return newest_intact(dir)[0]


def find(path: str | Path) -> Path | None:
    """``path`` itself if it is one checkpoint, else the newest intact checkpoint in it, or None."""
    return Path(path) if (Path(path) / META).exists() else latest(path)


_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _app_state(model, optimizer, extra: dict[str, torch.Tensor], tables=None, tp=None) -> dict[str, Any]:
    # Optimizer state keyed by parameter name, not by list position: pipeline stages hold different
    # parameters, and DCP would merge their "param_groups.0" entries as if every rank had the same.
    # a stage whose only weights are served tables has nothing for torch's state-dict helpers (they refuse it)
    msd, osd = get_state_dict(model, optimizer, options=_OPTIONS) if _has_state(model) else ({}, {})
    rows = {}
    if tables:
        # Sparse tables are no parameters of the model any more: each is saved whole over its dp group under
        # the plain model's weight name (so any layout, or one process, loads it), its row state beside it.
        state = tables.state_dict()
        msd.update({k: v for k, v in state.items() if not k.startswith("state.")})
        rows = {k: v for k, v in state.items() if k.startswith("state.")}
    if tp is not None:  # tensor-parallel shards as DTensors of their full shapes: DCP reshards on load
        msd, osd, rows = tp.to_dtensors(msd), tp.to_dtensors(osd), tp.to_dtensors(rows)
    return {"model": msd, "optim": osd, **extra, **({"tables": rows} if tables else {})}


def _has_state(model) -> bool:
    return any(True for _ in model.parameters()) or any(True for _ in model.buffers())


def _rank_state(position: torch.Tensor, r: int | None = None) -> dict[str, torch.Tensor]:
    r = _rank() if r is None else r
    return {f"rank{r}.rng": torch.get_rng_state(), f"rank{r}.data": position}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(dir: str | Path, step: int, model, optimizer, data_state: dict[str, int], meta: dict[str, Any],
         keep: int = 2, tables=None, tp=None) -> Path:
    """Save a checkpoint of ``step`` on all ranks; returns the final directory.

    ``tables``: the run's :class:`tessel.sparse.SparseTables`, saved whole (gathered from their owners).
    ``tp``: the model's :class:`tessel.tensor.TensorParallel`; its shards are saved with their places in the
    full tensors, so the checkpoint loads under any tensor-parallel mode or degree, or in one process.
    """
    dir = Path(dir)
    final, tmp = dir / f"step-{step:08d}", dir / f"step-{step:08d}.tmp"
    if _rank() == 0:
        dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    position = torch.tensor([data_state["position"], data_state["dp_size"], data_state["global_batch"]])
    dcp.save(_app_state(model, optimizer, _rank_state(position), tables, tp), checkpoint_id=str(tmp))
    _barrier()
    if _rank() == 0:
        world = dist.get_world_size() if dist.is_initialized() else 1
        # tessel.json last: it seals the sums of the files above, so it exists only for a finished save
        _write_atomic(tmp / META, json.dumps(seal({**meta, "step": step, "world_size": world}, tmp), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_atomic(dir / LATEST, final.name)  # for people and scripts; loading goes by the checksums
        for old in _same_run(dir, meta.get("run"))[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def _same_run(dir: Path, run: str | None) -> list[Path]:
    """This run's checkpoints, newest first: an earlier run's in the same folder are not ours to prune."""
    out = []
    for path in checkpoints(dir):
        try:
            if json.loads((path / META).read_text()).get("run") == run:
                out.append(path)
        except (OSError, ValueError):
            continue
    return out


def same_optimizer(meta: dict[str, Any], name: str, path) -> None:
    """Refuse to resume optimizer state saved by another optimizer (its state tensors are another class's, which
    DCP would report as a damaged checkpoint, or load into the wrong slots); checkpoints from before the optimizer
    was recorded pass."""
    saved = meta.get("optimizer", name)
    if saved != name:
        raise CheckpointError(f"checkpoint '{path}' holds the state of train.optimizer {saved}; this run's is {name}: "
                              f"resume with --train.optimizer {saved}, or start from its weights alone with "
                              "--checkpoint.init_from")


def read_meta(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return json.loads((path / META).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint '{path}' has no readable {META} ({e.__class__.__name__}); "
                              "it is incomplete or not a tessel checkpoint") from None


def check_compatible(path: Path, meta: dict[str, Any], expected: dict[str, Any], weights_only: bool = False) -> None:
    """Refuse a checkpoint written for another model (architecture and sizes must match; with
    ``weights_only``, how tables were distributed may differ). ``expected`` None: any model (a plain model the
    caller loads into, whose names and shapes DCP checks itself)."""
    if expected is None:
        return
    saved, want = (_canonical(d) for d in (meta.get("model"), expected.get("model")))
    if weights_only:
        saved, want = ({k: v for k, v in (d or {}).items() if k != "sparse"} for d in (saved, want))
    if saved != want:
        diff = [k for k in sorted(set(saved or {}) | set(want or {}))
                if (saved or {}).get(k) != (want or {}).get(k)]
        detail = ", ".join(f"{k}: checkpoint {(saved or {}).get(k)!r} vs run {(want or {}).get(k)!r}"
                           for k in diff[:4])
        raise CheckpointError(f"checkpoint '{path}' is from another model ({detail}); "
                              "resume with the model it was saved with or start a new run")


def _canonical(model: dict | None) -> dict | None:
    """A model identity whose table overrides ("a=ps, b=dense") are in one form: sorted, without spaces (how a
    run wrote them, by hand or from its plan, does not make it another model)."""
    if not model or not isinstance(model.get("sparse"), dict) or not isinstance(model["sparse"].get("tables"), str):
        return model
    items = sorted(x.replace(" ", "") for x in model["sparse"]["tables"].split(",") if x.strip())
    return {**model, "sparse": {**model["sparse"], "tables": ",".join(items)}}


def inspect(path: str | Path, expected_meta: dict[str, Any] | None, weights_only: bool = False,
            verify: bool = True) -> tuple[Path, dict[str, Any]]:
    """(path, its tessel.json) once the checkpoint is found intact, safe to unpickle and from this model."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    why = problem(path) if verify else None  # before anything of it is read
    if why:
        raise CheckpointError(f"checkpoint '{path}' is damaged: {why}")
    meta = read_meta(path)
    check_compatible(path, meta, expected_meta, weights_only)
    read_metadata(path)  # refuses a crafted .metadata with its own line before DCP wraps the error per rank
    return path, meta


def _read(path: Path, state: dict[str, Any]) -> None:
    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
    except (Exception, CheckpointException) as e:  # DCP's own type derives from BaseException
        raise CheckpointError(f"checkpoint '{path}' is corrupt or unreadable ({_root_cause(e)})") from None


def load(path: str | Path, model, optimizer, expected_meta: dict[str, Any], tables=None,
         tp=None, verify: bool = True, source_rank: int | None = None) -> tuple[int, dict[str, int]]:
    """Load ``path`` into model and optimizer in place; restore this rank's RNG.

    ``source_rank``: the saving rank whose RNG and data state this rank takes (default: its own rank); a job
    re-formed with another dp takes them from the rank at its own pipeline and tensor-parallel place.

    Returns (step, data_state). Raises CheckpointError if the checkpoint is missing, damaged (its checksums
    are redone unless ``verify=False``, for a caller that has just done so), or from another model.
    """
    path, meta = inspect(path, expected_meta, verify=verify)
    r = _rank() if source_rank is None else source_rank
    state = _app_state(model, optimizer, _rank_state(torch.zeros(3, dtype=torch.int64), r), tables, tp)
    _read(path, state)
    if tp is not None:
        state["model"], state["optim"] = tp.to_local(state["model"]), tp.to_local(state["optim"])
        if tables:
            state["tables"] = tp.to_local(state["tables"])
    served = {f"{n}.weight" for n in (tables.tables if tables else {})}
    weights = {k: state["model"].pop(k) for k in served}
    if _has_state(model):
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=_OPTIONS)
        # torch's groups carry how to step (fused, foreach) and the saved ones came back with the state: that is this
        # run's choice (a run on DTensor weights cannot take a fused kernel a run on plain tensors saved)
        for group in optimizer.param_groups:
            group.update({k: optimizer.defaults[k] for k in ("fused", "foreach") if k in optimizer.defaults})
    if tables:
        tables.load_state_dict({**weights, **state["tables"]})
    torch.set_rng_state(state[f"rank{r}.rng"])
    pos, dp_size, global_batch = (int(v) for v in state[f"rank{r}.data"])
    return int(meta["step"]), {"position": pos, "dp_size": dp_size, "global_batch": global_batch}


def load_weights(path: str | Path, model, expected_meta: dict[str, Any] | None, tp=None) -> int:
    """Load only the model's weights from ``path``, saved under any world size, tensor-parallel mode or
    degree (DCP reads the parts of each full tensor this rank holds); returns the checkpoint's step.

        load_weights("runs/3d/checkpoints/step-00000020", plain_model, identity)   # into one process
    """
    path, meta = inspect(path, expected_meta, weights_only=True)
    if tp is None and _plain(model):
        state = {"model": model.state_dict()}
        _read(path, state)
        model.load_state_dict(state["model"])
        return int(meta["step"])
    msd = get_model_state_dict(model, options=_OPTIONS)
    state = {"model": tp.to_dtensors(msd) if tp is not None else msd}
    _read(path, state)
    set_model_state_dict(model, tp.to_local(state["model"]) if tp is not None else state["model"], options=_OPTIONS)
    return int(meta["step"])


def _plain(model: torch.nn.Module) -> bool:
    """A model of plain parameters, not wrapped (one process's, as the launcher's held-out evaluation builds):
    its own state dict is the one DCP keys. torch's ``get_model_state_dict``, which FSDP's, DTensor's and
    wrapped modules need, imports torch._dynamo on its first call: a second on every launch's last lap."""
    return (all(type(p) is torch.nn.Parameter for p in model.parameters())
            and not hasattr(model, "module") and not hasattr(model, "_orig_mod"))


def _root_cause(e: BaseException) -> str:
    """The first line of the underlying error, not DCP's per-rank wrapper."""
    failures = getattr(e, "failures", None)
    if failures:  # rank -> (exception, traceback)
        e = next(iter(failures.values()))
        e = e[0] if isinstance(e, tuple) else e
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:160]


def _barrier() -> None:
    if dist.is_initialized():
        comm.barrier("meta")
