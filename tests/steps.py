"""Train a distributed model and its single-process reference side by side, checking every step.

The reference is plain torch (:class:`TorchReference`): its optimizer, clipping and learning-rate rule are
written here from ``torch.optim`` and ``torch.nn.utils``, so a bug in tessel's engine, step tail or schedule
cannot hide by being on both sides. The distributed side is tessel's own engine (:func:`tessel_engine`)."""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tessel import comm


def step_side_by_side(engine, ref_engine, loader, ref_loader, steps: int, world: int, atol: float):
    """``steps`` engine steps on both; the global norm and mean loss must agree each step. Returns the last
    reference result."""
    for step in range(steps):
        x, y = loader.next_batch()
        rx, ry = ref_loader.next_batch()
        rng = torch.get_rng_state()
        upcoming = loader.peek() if step + 1 < steps else None  # scheduled sparse tables fetch ahead
        res = engine.step(x, y, step, upcoming)
        torch.set_rng_state(rng)  # the sampled softmax draws the same candidates in the reference
        ref_res = ref_engine.step(rx, ry, step)
        assert abs(res.grad_norm - ref_res.grad_norm) < atol, (res.grad_norm, ref_res.grad_norm)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta")
        assert abs(float(mean) / world - ref_res.loss) < atol
    return ref_res


def tessel_engine(model, train_cfg, tp=None, tables=None):
    """The code under test: tessel's unpipelined engine over ``model`` with its optimizer and step tail, trained as
    the config's ``train`` section says."""
    from tessel.settings import Settings
    from tessel.train.engine import Engine
    from tessel.train.optim import build_optimizer
    from tessel.train.tail import StepTail

    t = train_cfg
    settings = Settings(optimizer=t.optimizer, lr=t.lr, momentum=t.momentum, betas=(t.beta1, t.beta2),
                        momentum_decay=t.momentum_decay,
                        weight_decay=t.weight_decay, lr_schedule=t.schedule, warmup=t.warmup,
                        min_lr_ratio=t.min_lr_ratio, steps=t.steps, clip=t.clip, dtype=t.dtype,
                        global_batch=t.global_batch, seed=t.seed)
    optimizer = build_optimizer(model.parameters(), settings)
    params = [p for p in model.parameters() if p.requires_grad]
    tail = StepTail(params, optimizer, settings.clip, tp=tp, tables=tables)
    return Engine(model, tail, t.micro_batches, settings.lr_at, tables)


@dataclass
class RefResult:
    loss: float  # sum over micro-batches of loss / m
    grad_norm: float  # total gradient norm before clipping
    lr: float


def reference_lr(step: int, cfg) -> float:
    """Linear warm-up over ``cfg.warmup`` steps, then constant, or linear / cosine decay to
    ``lr * min_lr_ratio`` over the remaining ``steps - warmup`` (written out here, not tessel's)."""
    lr, warmup = cfg.lr, cfg.warmup
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if cfg.schedule == "constant":
        return lr
    floor = lr * cfg.min_lr_ratio
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    if cfg.schedule == "linear":
        return lr - (lr - floor) * progress
    assert cfg.schedule == "cosine", cfg.schedule
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * progress))


def torch_optimizer(params, cfg) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer named by ``cfg.optimizer``, built directly."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, foreach=False)
    if cfg.optimizer == "nadamw":
        return torch.optim.NAdam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay,
                                 momentum_decay=cfg.momentum_decay, decoupled_weight_decay=True, foreach=False)
    assert cfg.optimizer == "adam", cfg.optimizer
    return torch.optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, foreach=False)


class TorchReference:
    """One process training ``model`` with a plain torch loop: ``step(inputs, targets, step)`` splits the batch
    into ``train_cfg.micro_batches`` with ``chunk``, sums the loss (:meth:`loss`) / m over them (every micro-batch
    starting from the random state the first one started from, so the sampled softmax draws alike), clips with
    ``clip_grad_norm_`` when ``clip > 0``, sets this step's LR on every group, steps and zeroes the gradients.

    ``optimizer``: the torch optimizer (hooks may be registered on it). ``activation_bytes``: the distinct
    storages, parameters left out, that the first micro-batch's forward saved for backward on the first step."""

    def __init__(self, model: torch.nn.Module, train_cfg, autocast: torch.dtype | None = None) -> None:
        self.model, self.cfg = model, train_cfg
        self.autocast = autocast  # mixed precision: every forward under torch.autocast to this dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch_optimizer(self.params, train_cfg)
        self.activation_bytes = None

    def _forward_counting_saved(self, x, y, m):
        skip = {p.untyped_storage().data_ptr() for p in self.params}
        seen = set()

        def pack(t):
            key = t.untyped_storage().data_ptr()
            if key not in skip and key not in seen and not t.is_meta:
                seen.add(key)
                self.activation_bytes += t.untyped_storage().nbytes()
            return t

        self.activation_bytes = 0
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return self.loss(x, y) / m

    def loss(self, x, y):
        """The model's mean loss; a full softmax's as F.cross_entropy over the whole logits, written here, so the
        models' fused head and loss (tessel.models.vocab_head) are checked by every comparison."""
        if getattr(self.model, "softmax", None) == "full":
            logits = self.model.logits(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return self.model(x, y)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int) -> RefResult:
        self.model.train()
        m = self.cfg.micro_batches
        first = self.params[0]
        inputs, targets = (t.to(first.device, first.dtype if t.is_floating_point() else t.dtype)
                           for t in (inputs, targets))
        cuda = first.device.type == "cuda"
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state() if cuda else None)
        total = 0.0
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m))):
            if i > 0:  # every micro-batch of the step draws what the first one drew
                torch.set_rng_state(rng[0])
                if cuda:
                    torch.cuda.set_rng_state(rng[1])
            with torch.autocast(first.device.type, dtype=self.autocast or torch.bfloat16,
                                enabled=self.autocast is not None):
                if self.activation_bytes is None:
                    loss = self._forward_counting_saved(x, y, m)
                else:
                    loss = self.loss(x, y) / m
            loss.backward()
            total += float(loss.detach())
        if self.cfg.clip > 0:  # returns the total norm before clipping
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        lr = reference_lr(step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return RefResult(loss=total, grad_norm=float(norm), lr=lr)
