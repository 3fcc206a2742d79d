"""Tests for tessel.data: synthetic corpora, text caching, and the sharded loader."""

import os

import numpy as np
import pytest
import torch

from tessel.data import (
    GaussianClassification,
    ShardedLoader,
    TextDataset,
    ZipfCorpus,
    build_dataset,
    prepare_text,
)
from tessel.errors import DataError

# ---------------------------------------------------------------- ZipfCorpus


def test_zipf_is_a_pure_function_of_seed_and_index():
    a = ZipfCorpus(vocab_size=1000, seq_len=16, seed=3)
    b = ZipfCorpus(vocab_size=1000, seq_len=16, seed=3)
    idx = np.array([5, 0, 17, 1_000_000_007, 5])
    xa, ya = a.get_batch(idx)
    xb, yb = b.get_batch(idx)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # The same index gives the same document wherever it sits in the batch.
    assert torch.equal(xa[0], xa[4])
    assert not torch.equal(xa[0], xa[1])
    other, _ = ZipfCorpus(vocab_size=1000, seq_len=16, seed=4).get_batch(idx)
    assert not torch.equal(xa, other)


def test_zipf_tokens_follow_the_rule_position_by_position():
    """The generator resolves followers by chain depth; here the rule is applied in order, one position at a
    time, from the same streams, and the documents must agree token for token."""
    from tessel.data._counter import uniform
    from tessel.data.zipf import _SALT_CHOICE, _SALT_FOLLOW, _SALT_FRESH, FOLLOW_PROB

    for vocab, seq_len, s, seed in [(1000, 16, 1.1, 3), (16, 2, 0.5, 7), (5000, 200, 1.3, -5)]:
        corpus = ZipfCorpus(vocab_size=vocab, seq_len=seq_len, s=s, seed=seed)
        docs = np.array([0, 5, 1_000_000_007, 5, 64])
        key = corpus._key
        expected = np.empty((len(docs), seq_len + 1), dtype=np.int64)
        for i, doc in enumerate(docs.astype(np.uint64)):
            for t in range(seq_len + 1):
                fresh, follow, choice = (float(uniform(key, salt, doc, np.uint64(t)))
                                         for salt in (_SALT_FRESH, _SALT_FOLLOW, _SALT_CHOICE))
                k = int(np.searchsorted(corpus._choice_cdf, choice, side="right"))
                if t > 0 and follow < FOLLOW_PROB:
                    expected[i, t] = corpus.successor(np.array([expected[i, t - 1]]), np.array([k]))[0]
                else:
                    expected[i, t] = min(int(np.searchsorted(corpus._cdf, fresh, side="right")), vocab - 1)
        assert np.array_equal(corpus.tokens(docs), expected)
    assert corpus.tokens(np.array([], dtype=np.int64)).shape == (0, seq_len + 1)


def test_zipf_batch_split_matches_whole_batch():
    corpus = ZipfCorpus(vocab_size=5000, seq_len=32)
    idx = np.arange(100, 164)
    whole_x, whole_y = corpus.get_batch(idx)
    halves = [corpus.get_batch(part) for part in (idx[:32], idx[32:])]
    assert torch.equal(torch.cat([h[0] for h in halves]), whole_x)
    assert torch.equal(torch.cat([h[1] for h in halves]), whole_y)


def test_zipf_shapes_shift_and_range():
    corpus = ZipfCorpus(vocab_size=1000, seq_len=16)
    inputs, targets = corpus.get_batch(np.arange(8))
    assert inputs.shape == targets.shape == (8, 16)
    assert inputs.dtype == targets.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.min()) >= 0 and int(targets.max()) < 1000
    assert corpus.num_samples is None and corpus.vocab_size == 1000


def test_zipf_frequencies_follow_zipf_law():
    vocab, s = 1000, 1.1
    tokens = ZipfCorpus(vocab_size=vocab, seq_len=64, s=s).tokens(np.arange(3000))
    counts = np.bincount(tokens.ravel(), minlength=vocab)
    # Id = frequency rank: id 0 is the most frequent and its share is near the Zipf prediction.
    assert counts.argmax() == 0
    expected = 1.0 / np.arange(1, vocab + 1) ** s
    expected /= expected.sum()
    share = counts[0] / counts.sum()
    assert 0.6 * expected[0] < share < 1.4 * expected[0]
    # Log-log rank-frequency slope is close to -s (bigram mixing bends it a little).
    ranked = np.sort(counts)[::-1]
    ranks = np.arange(1, vocab + 1)
    slope = np.polyfit(np.log(ranks[1:200]), np.log(ranked[1:200]), 1)[0]
    assert -1.6 < slope < -0.8
    # Sparse: the top 1% of ids carry a large share, yet most ids do occur.
    assert counts[np.argsort(-counts)[:10]].sum() / counts.sum() > 0.3
    assert (counts > 0).mean() > 0.8


def _conditional_entropy(prev: np.ndarray, nxt: np.ndarray, vocab: int) -> float:
    """Plug-in estimate of H(next | prev) in bits."""
    _, pair_counts = np.unique(prev * vocab + nxt, return_counts=True)
    _, prev_counts = np.unique(prev, return_counts=True)
    n = prev.size
    h_joint = -np.sum(pair_counts / n * np.log2(pair_counts / n))
    h_prev = -np.sum(prev_counts / n * np.log2(prev_counts / n))
    return float(h_joint - h_prev)


def test_zipf_has_bigram_structure():
    vocab = 1000
    tokens = ZipfCorpus(vocab_size=vocab, seq_len=64).tokens(np.arange(2000))
    prev, nxt = tokens[:, :-1].ravel(), tokens[:, 1:].ravel()
    real = _conditional_entropy(prev, nxt, vocab)
    # Same estimator on pairs with the successor shuffled: equal marginals, no dependence, same bias.
    shuffled = _conditional_entropy(prev, np.random.default_rng(0).permutation(nxt), vocab)
    assert real < 0.7 * shuffled, (real, shuffled)


def test_zipf_million_word_vocab():
    corpus = ZipfCorpus(vocab_size=1_000_000, seq_len=64)
    inputs, targets = corpus.get_batch(np.arange(64))
    assert inputs.shape == (64, 64)
    assert int(targets.max()) < 1_000_000
    # Heavy tail: plenty of distinct ids, far beyond the first thousand ranks.
    assert torch.unique(inputs).numel() > 500
    assert int(inputs.max()) > 10_000


@pytest.mark.parametrize(
    "kwargs, word",
    [({"vocab_size": 8}, "vocab_size"), ({"seq_len": 1}, "seq_len"), ({"s": 0.0}, "s=")],
)
def test_zipf_rejects_bad_config(kwargs, word):
    with pytest.raises(DataError, match=word):
        ZipfCorpus(**kwargs)


def test_zipf_rejects_bad_indices():
    corpus = ZipfCorpus(vocab_size=100, seq_len=4)
    with pytest.raises(DataError, match="negative"):
        corpus.get_batch(np.array([0, -1]))
    with pytest.raises(DataError, match="integer"):
        corpus.get_batch(np.array([0.5]))


# ---------------------------------------------------------------- GaussianClassification


def test_gaussian_shapes_and_determinism():
    data = GaussianClassification(in_features=16, classes=5, seed=1)
    x, y = data.get_batch(np.arange(10))
    assert x.dtype == torch.float32 and x.shape == (10, 16)
    assert y.dtype == torch.long and y.shape == (10,)
    x2, y2 = GaussianClassification(in_features=16, classes=5, seed=1).get_batch(np.arange(10))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    xa, _ = data.get_batch(np.arange(5))
    xb, _ = data.get_batch(np.arange(5, 10))
    assert torch.equal(torch.cat([xa, xb]), x)
    assert set(y.tolist()) <= set(range(5))


def test_gaussian_is_learnable_by_a_linear_model():
    classes = 10
    data = GaussianClassification(in_features=32, classes=classes, seed=0)
    x, y = data.get_batch(np.arange(4000))
    xt, yt = data.get_batch(np.arange(10_000, 12_000))
    # Least-squares fit to one-hot targets: a linear classifier in closed form.
    design = torch.cat([x, torch.ones(len(x), 1)], dim=1).double()
    onehot = torch.nn.functional.one_hot(y, classes).double()
    weights = torch.linalg.lstsq(design, onehot).solution
    pred = (torch.cat([xt, torch.ones(len(xt), 1)], dim=1).double() @ weights).argmax(1)
    accuracy = (pred == yt).double().mean().item()
    assert accuracy > 0.6, accuracy  # chance is 0.1
    # Labels are balanced enough that chance really is about 1/classes.
    assert np.bincount(y.numpy(), minlength=classes).min() > 300


# ---------------------------------------------------------------- text files


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def corpus_dir(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    _write(folder / "a.txt", "the cat sat on the mat\nthe dog sat on the log\n" * 20)
    _write(folder / "b.txt", "a bird in the hand is worth two in the bush\n" * 20)
    return folder


def test_prepare_text_tokenizes_and_caches(corpus_dir, tmp_path):
    cache = tmp_path / "cache"
    path = prepare_text(str(corpus_dir / "*.txt"), vocab_size=100, cache_dir=str(cache))
    tokens = np.load(path / "tokens.npy")
    assert tokens.dtype == np.int32
    words = sum(len(p.read_text().split()) for p in sorted(corpus_dir.glob("*.txt")))
    assert tokens.size == words
    data = TextDataset(path, seq_len=8)
    # Files are concatenated in sorted order: the first words come from a.txt.
    assert data.decode(tokens[:3]) == "the cat sat"
    before = os.stat(path / "tokens.npy").st_mtime_ns
    again = prepare_text(str(corpus_dir / "*.txt"), vocab_size=100, cache_dir=str(cache))
    assert again == path
    assert os.stat(path / "tokens.npy").st_mtime_ns == before
    # Only the published cache remains: no temporary directories left behind.
    assert [p.name for p in cache.iterdir()] == [path.name]


def test_prepare_text_cache_key_tracks_content_and_vocab(corpus_dir, tmp_path):
    cache = str(tmp_path / "cache")
    first = prepare_text(str(corpus_dir / "*.txt"), vocab_size=100, cache_dir=cache)
    small = prepare_text(str(corpus_dir / "*.txt"), vocab_size=5, cache_dir=cache)
    assert small != first
    assert TextDataset(small, seq_len=4).vocab_size == 5
    _write(corpus_dir / "b.txt", "something else entirely\n" * 10)
    assert prepare_text(str(corpus_dir / "*.txt"), vocab_size=100, cache_dir=cache) != first


def test_prepare_text_errors_name_the_problem(tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(DataError, match="nothing-here"):
        prepare_text(str(tmp_path / "nothing-here*.txt"), 100, cache)
    empty = _write(tmp_path / "empty.txt", "")
    with pytest.raises(DataError, match="empty.txt' is empty"):
        prepare_text(str(empty), 100, cache)
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(DataError, match=r"latin1.txt' is not UTF-8 text \(byte 0xe9 at offset 3\)"):
        prepare_text(str(binary), 100, cache)
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="is a directory"):
        prepare_text(str(tmp_path / "folder"), 100, cache)


def test_text_dataset_windows(tmp_path):
    words = [f"w{i}" for i in range(100)]
    src = _write(tmp_path / "words.txt", " ".join(words) + "\n")
    data = TextDataset(prepare_text(str(src), 1000, str(tmp_path / "cache")), seq_len=10)
    assert data.num_samples == 9  # 100 tokens: windows of 11 at stride 10 fit 9 times
    assert data.vocab_size == 101  # every word plus [UNK]
    inputs, targets = data.get_batch(np.array([0, 3, 8]))
    assert inputs.shape == targets.shape == (3, 10) and inputs.dtype == torch.long
    assert data.decode(inputs[1]) == " ".join(words[30:40])
    assert data.decode(targets[1]) == " ".join(words[31:41])
    assert data.decode(targets[2][-1:]) == "w90"
    # Consecutive windows share their boundary token, so every token is a target once.
    pair_x, pair_y = data.get_batch(np.array([0, 1]))
    assert int(pair_y[0, -1]) == int(pair_x[1, 0])
    with pytest.raises(DataError, match="out of range"):
        data.get_batch(np.array([9]))


def test_text_dataset_too_short(tmp_path):
    src = _write(tmp_path / "short.txt", "one two three\n")
    path = prepare_text(str(src), 100, str(tmp_path / "cache"))
    with pytest.raises(DataError, match=r"3 tokens but seq_len=8 needs at least 9"):
        TextDataset(path, seq_len=8)


# ---------------------------------------------------------------- ShardedLoader


class _Indices:
    """A finite dataset whose samples are their own index, so tests can read the order directly."""

    def __init__(self, n):
        self.num_samples = n

    def get_batch(self, indices):
        ids = torch.as_tensor(np.asarray(indices))
        return ids, ids


@pytest.mark.parametrize("dp_size", [2, 4])
def test_loader_shards_concatenate_to_single_process_batch(dp_size):
    corpus = ZipfCorpus(vocab_size=1000, seq_len=8)
    single = ShardedLoader(corpus, global_batch=8, dp_rank=0, dp_size=1)
    ranks = [ShardedLoader(corpus, global_batch=8, dp_rank=r, dp_size=dp_size) for r in range(dp_size)]
    for step in range(3):
        ids = [loader.sample_ids(step) for loader in ranks]
        assert len(np.unique(np.concatenate(ids))) == 8  # disjoint shards
        full_x, full_y = next(single)
        parts = [next(loader) for loader in ranks]
        assert parts[0][0].shape == (8 // dp_size, 8)
        assert torch.equal(torch.cat([p[0] for p in parts]), full_x)
        assert torch.equal(torch.cat([p[1] for p in parts]), full_y)


def test_next_targets_are_next_batch_targets_without_the_inputs():
    """A pipeline's last stage reads targets alone: the same targets, and a classifier's features never drawn."""
    class Counted(GaussianClassification):
        batches = 0

        def get_batch(self, indices):
            Counted.batches += 1
            return super().get_batch(indices)

    for data in (Counted(in_features=16, classes=5), ZipfCorpus(vocab_size=100, seq_len=4)):
        full = ShardedLoader(data, global_batch=6, dp_rank=1, dp_size=2, seed=1)
        alone = ShardedLoader(data, global_batch=6, dp_rank=1, dp_size=2, seed=1)
        for _ in range(3):
            assert torch.equal(full.next_batch()[1], alone.next_targets())
        assert alone.position == full.position == 3
        alone.peek()  # a peeked batch is used, not drawn again
        assert torch.equal(alone.next_targets(), full.next_batch()[1])
    assert Counted.batches == 4 + 1  # the full loader's four batches and the one peek


def test_loader_epochs_are_permutations_that_wrap():
    n, batch = 10, 4
    single = ShardedLoader(_Indices(n), global_batch=batch, dp_rank=0, dp_size=1, seed=7)
    seen = torch.cat([single.next_batch()[0] for _ in range(5)]).numpy()  # 20 positions = 2 epochs
    first, second = seen[:n], seen[n:]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, np.arange(n))
    # Batch 2 covers positions 8..11 and so straddles the epoch end; the ranks agree on it.
    ranks = [ShardedLoader(_Indices(n), global_batch=batch, dp_rank=r, dp_size=2, seed=7) for r in range(2)]
    assert np.array_equal(np.concatenate([r.sample_ids(2) for r in ranks]), seen[8:12])
    other = ShardedLoader(_Indices(n), global_batch=batch, dp_rank=0, dp_size=1, seed=8)
    assert not np.array_equal(torch.cat([other.next_batch()[0] for _ in range(3)]).numpy()[:n], first)
    plain = ShardedLoader(_Indices(n), global_batch=batch, dp_rank=0, dp_size=1, shuffle=False)
    assert torch.cat([plain.next_batch()[0] for _ in range(3)]).tolist() == [*range(10), 0, 1]


def test_loader_state_dict_resumes_exactly(tmp_path):
    src = _write(tmp_path / "t.txt", " ".join(f"w{i % 37}" for i in range(500)))
    data = TextDataset(prepare_text(str(src), 100, str(tmp_path / "cache")), seq_len=8)
    loader = ShardedLoader(data, global_batch=6, dp_rank=1, dp_size=2, seed=3)
    for _ in range(13):  # past the first epoch (62 samples / 6 per batch)
        next(loader)
    state = loader.state_dict()
    assert state == {"position": 13, "dp_size": 2, "global_batch": 6}
    expected = [next(loader) for _ in range(4)]
    resumed = ShardedLoader(data, global_batch=6, dp_rank=1, dp_size=2, seed=3)
    resumed.load_state_dict(state)
    assert resumed.position == 13
    for want, got in zip(expected, (next(resumed) for _ in range(4)), strict=True):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_loader_resumes_under_another_dp_without_skipping_or_repeating():
    """A job re-formed from dp=3 to dp=2 after step 5: the ranks' batches of step 6 on are exactly the same
    global batches, split in two instead of three."""
    corpus = ZipfCorpus(vocab_size=100, seq_len=4)
    three = [ShardedLoader(corpus, global_batch=12, dp_rank=r, dp_size=3) for r in range(3)]
    for loader in three:
        for _ in range(5):
            next(loader)
    want = [torch.cat([next(loader)[0] for loader in three]) for _ in range(3)]
    two = [ShardedLoader(corpus, global_batch=12, dp_rank=r, dp_size=2) for r in range(2)]
    for loader in two:
        loader.load_state_dict({"position": 5, "dp_size": 3, "global_batch": 12})
    got = [torch.cat([next(loader)[0] for loader in two]) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_loader_rejects_mismatched_state_and_bad_batch():
    corpus = ZipfCorpus(vocab_size=100, seq_len=4)
    loader = ShardedLoader(corpus, global_batch=32, dp_rank=0, dp_size=4)
    saved = {"position": 5, "dp_size": 2, "global_batch": 16}
    with pytest.raises(DataError, match="data position was saved with global batch 16; this run has 32"):
        loader.load_state_dict(saved)
    assert loader.position == 0
    with pytest.raises(DataError, match="global batch 10 is not divisible by dp=4; use a multiple of 4"):
        ShardedLoader(corpus, global_batch=10, dp_rank=0, dp_size=4)
    with pytest.raises(DataError, match="dp_rank"):
        ShardedLoader(corpus, global_batch=8, dp_rank=4, dp_size=4)


# ---------------------------------------------------------------- build_dataset


def test_build_dataset_kinds(tmp_path):
    zipf = build_dataset("zipf", vocab_size=500, seq_len=8, seed=1, zipf_s=1.2)
    assert isinstance(zipf, ZipfCorpus) and zipf.vocab_size == 500 and zipf.s == 1.2
    gauss = build_dataset("gaussian", in_features=8, classes=3)
    assert isinstance(gauss, GaussianClassification) and gauss.get_batch([0])[0].shape == (1, 8)
    src = _write(tmp_path / "t.txt", "hello world " * 50)
    text = build_dataset("text", vocab_size=50, seq_len=4, path=str(src), cache_dir=str(tmp_path / "c"))
    assert isinstance(text, TextDataset) and text.num_samples == 24
    with pytest.raises(DataError, match="valid kinds: zipf, text, gaussian"):
        build_dataset("imagenet")
    with pytest.raises(DataError, match="needs a path"):
        build_dataset("text")


def test_gaussian_separation_sets_the_class_means_norm_and_refuses_bad_values():
    for sep in (3.0, 6.0):
        norms = np.linalg.norm(GaussianClassification(in_features=1024, classes=50, separation=sep).means, axis=1)
        assert abs(norms.mean() - sep) < 0.05 * sep, (sep, norms.mean())  # noise is 1 per feature, norm 32
    for bad in (0, -1.0, float("nan"), float("inf"), True, "6"):
        with pytest.raises(DataError, match="gaussian separation .* is invalid; give a finite number > 0"):
            GaussianClassification(in_features=4, classes=2, separation=bad)
