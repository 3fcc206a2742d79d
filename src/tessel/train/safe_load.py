"""Reading DCP checkpoints without running code from their files.

torch's ``FileSystemReader`` reads a checkpoint's ``.metadata`` with plain ``pickle.load``, which calls
whatever a crafted file names (``os.system`` included), and DCP's default planner unpickles non-tensor
entries with ``weights_only=False``. ``SafeReader`` unpickles ``.metadata`` admitting only the classes DCP's
metadata is made of, and ``SafeLoadPlanner`` reads entries with ``torch.load(weights_only=True)``; tensors
themselves DCP already reads with ``weights_only=True``::

    dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..errors import CheckpointError

# every global DCP's metadata pickle refers to (dataclasses, an enum, torch.Size, dtypes, a path)
_ALLOWED = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointError(f"checkpoint '{self.path.parent}': its .metadata asks to call {module}.{name}, which "
                              "DCP metadata never holds; refusing to load it (a crafted file could run code)")


def read_metadata(folder: str | Path) -> Metadata:
    """A checkpoint's DCP metadata, unpickled with only DCP's own classes admitted."""
    path = Path(folder) / ".metadata"
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except CheckpointError:
        raise
    except Exception as e:  # a truncated or garbled pickle raises any of a dozen types
        raise CheckpointError(f"checkpoint '{folder}' is corrupt: its .metadata cannot be read "
                              f"({type(e).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"checkpoint '{folder}': its .metadata holds a {type(metadata).__name__}, "
                              "not DCP metadata")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader with ``read_metadata`` above in place of plain ``pickle.load``."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # as torch's reader does: ties this load's reads together
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner unpickles non-tensor entries with weights_only=False; we refuse to."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
