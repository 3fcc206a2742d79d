"""User text files: tokenize once into a content-addressed cache, then memory-map windows of it."""

import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from tessel.data._counter import as_indices
from tessel.errors import DataError

# Part of the cache key: changing how text is tokenized must not reuse caches made the old way.
TOKENIZER_KIND = "wordlevel-nfkc-lower-whitespace-v1"
UNK = "[UNK]"
TOKENS_FILE = "tokens.npy"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "meta.json"
# Lines are encoded in chunks so one huge file never needs all its Encoding objects alive at once.
_ENCODE_CHUNK = 10_000


def _expand(pattern: str) -> list[Path]:
    paths = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
    if not paths:
        raise DataError(
            f"no data file matches {pattern!r}; give an existing text file or a glob like 'data/*.txt'"
        )
    for path in paths:
        if os.path.isdir(path):
            raise DataError(
                f"data path {path!r} is a directory; give files or a glob like '{path.rstrip('/')}/*.txt'"
            )
    return [Path(p) for p in paths]


def _decode(path: Path, raw: bytes) -> str:
    if not raw.strip():
        raise DataError(f"data file '{path}' is empty; give non-empty UTF-8 text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file '{path}' is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
            "give UTF-8 text files"
        ) from None


def _new_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def _encode(tokenizer, text: str) -> np.ndarray:
    lines = text.splitlines()
    parts = []
    for start in range(0, len(lines), _ENCODE_CHUNK):
        for enc in tokenizer.encode_batch(lines[start : start + _ENCODE_CHUNK]):
            parts.append(np.asarray(enc.ids, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _cache_key(digests: list[str], vocab_size: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"kind": TOKENIZER_KIND, "vocab_size": vocab_size, "files": digests}).encode())
    return h.hexdigest()[:32]


def _is_complete(path: Path) -> bool:
    return (path / TOKENS_FILE).is_file() and (path / TOKENIZER_FILE).is_file()


def prepare_text(pattern: str, vocab_size: int, cache_dir: str) -> Path:
    """Tokenize the text files matching ``pattern`` into a cache and return the cache directory.

    Files are taken in sorted order, a word-level tokenizer with at most ``vocab_size`` entries
    (``[UNK]`` included) is trained on them, and all files are encoded into one flat int32 array.
    The cache directory is named by a hash of the files' contents, ``vocab_size`` and the
    tokenizer kind, so a second call with the same inputs returns at once. It is written to a
    temporary directory and renamed into place, so a crash never leaves a half-written cache.

    >>> path = prepare_text("corpus/*.txt", vocab_size=8192, cache_dir="/tmp/tessel-cache")  # doctest: +SKIP
    >>> TextDataset(path, seq_len=64).num_samples  # doctest: +SKIP
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise DataError(f"text vocab_size {vocab_size!r} is invalid; give an int >= 2")
    paths = _expand(pattern)
    texts, digests = [], []
    for path in paths:
        raw = path.read_bytes()
        texts.append(_decode(path, raw))
        digests.append(hashlib.sha256(raw).hexdigest())
    key = _cache_key(digests, int(vocab_size))
    root = Path(cache_dir).expanduser()
    final = root / key
    if _is_complete(final):
        return final

    from tokenizers import trainers

    tokenizer = _new_tokenizer()
    trainer = trainers.WordLevelTrainer(vocab_size=int(vocab_size), special_tokens=[UNK], show_progress=False)
    tokenizer.train_from_iterator((line for text in texts for line in text.splitlines()), trainer=trainer)
    tokens = np.concatenate([_encode(tokenizer, text) for text in texts])

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
    try:
        # mkdtemp makes the directory private; a shared cache should be readable like any other.
        os.chmod(tmp, 0o755)
        np.save(tmp / TOKENS_FILE, tokens)
        tokenizer.save(str(tmp / TOKENIZER_FILE))
        meta = {
            "files": [str(p) for p in paths],
            "vocab_size": tokenizer.get_vocab_size(),
            "num_tokens": int(tokens.size),
            "tokenizer": TOKENIZER_KIND,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process (say, a second rank) published the same cache first; theirs is identical.
            if not _is_complete(final):
                raise DataError(
                    f"text cache '{final}' exists but is incomplete; delete that directory and run again"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class TextDataset:
    """Finite dataset of non-overlapping token windows from a :func:`prepare_text` cache.

    Sample ``i`` is tokens ``[i * seq_len, i * seq_len + seq_len + 1)``: consecutive windows share
    one boundary token so that every token is a target exactly once.

    >>> data = TextDataset(prepare_text("book.txt", 4096, "cache"), seq_len=64)  # doctest: +SKIP
    >>> inputs, targets = data.get_batch(np.arange(8))  # doctest: +SKIP
    """

    def __init__(self, cache_path, seq_len: int):
        from tokenizers import Tokenizer

        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise DataError(f"text seq_len {seq_len!r} is invalid; give an int >= 1")
        self.path = Path(cache_path)
        if not _is_complete(self.path):
            raise DataError(
                f"text cache '{self.path}' lacks {TOKENS_FILE} or {TOKENIZER_FILE}; "
                "create it with prepare_text"
            )
        self.seq_len = int(seq_len)
        # Memory-mapped so every rank shares the page cache instead of holding its own copy.
        self.tokens = np.load(self.path / TOKENS_FILE, mmap_mode="r")
        self.tokenizer = Tokenizer.from_file(str(self.path / TOKENIZER_FILE))
        self.vocab_size = self.tokenizer.get_vocab_size()
        count = (len(self.tokens) - 1) // self.seq_len
        if count < 1:
            raise DataError(
                f"text has {len(self.tokens)} tokens but seq_len={self.seq_len} needs at least "
                f"{self.seq_len + 1}; give more text or a smaller seq_len"
            )
        self.num_samples = count

    def get_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows ``indices`` as (inputs, targets) long tensors of shape ``(B, seq_len)``."""
        idx = as_indices(indices, self.num_samples)
        offsets = idx[:, None] * self.seq_len + np.arange(self.seq_len + 1)[None, :]
        window = np.asarray(self.tokens[offsets], dtype=np.int64)
        inputs = torch.from_numpy(np.ascontiguousarray(window[:, :-1]))
        targets = torch.from_numpy(np.ascontiguousarray(window[:, 1:]))
        return inputs, targets

    def decode(self, ids) -> str:
        """Token ids back to (normalized, space-joined) text, for humans reading samples."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).ravel()], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"TextDataset('{self.path}', seq_len={self.seq_len}, num_samples={self.num_samples})"
