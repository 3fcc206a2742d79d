"""The peer: torch's own 1-D tensor parallelism (``parallelize_module``) on the plain model, at its best.

The plan is the one torch's TP tutorial and torchtitan give a Llama-style model: q/k/v and fc_in
column-wise, out_proj and fc_out row-wise, the token table cut by vocabulary (row-wise), and the head
column-wise with its logits left sharded by vocabulary (B, T, V/tp): the cross-entropy runs on those shards
(``loss_parallel``) instead of gathering the logits. Norms and positions stay replicated.

With ``sequence_parallel`` (torchtitan's default) the row-wise outputs are reduce-scattered over the sequence
(B, T/tp, dim), the norms run on sequence shards, and attention and MLP all-gather their input. The token
table's output stays whole, because the model adds positions to whole sequences, and the first block takes
its sequence shard locally.
"""

from __future__ import annotations

import contextlib

import torch

from .. import comm
from ..errors import PlanError
from ..train.tail import squares


def parallelize_native(model, mesh, sequence_parallel: bool = False) -> torch.nn.Module:
    """torch's plan on the Transformer LM, in place; ``mesh=None``: only check that the model can take it."""
    if getattr(model, "softmax", "full") != "full" or not hasattr(model, "blocks"):
        raise PlanError("tensor.mode 'torch-1d' applies to transformer_lm with softmax 'full'")
    if mesh is None:
        return model
    model.fused_loss = False  # loss_parallel takes the head's logits, sharded by vocabulary
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sequence_parallel else Replicate()  # the residual stream between blocks
    plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.blocks)):
        b = f"blocks.{i}"
        plan.update({f"{b}.attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{b}.mlp.fc_in": ColwiseParallel(), f"{b}.attn.out_proj": RowwiseParallel(output_layouts=seq),
                     f"{b}.mlp.fc_out": RowwiseParallel(output_layouts=seq)})
        if sequence_parallel:
            gather = lambda: PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate())  # noqa: E731
            plan.update({f"{b}.ln1": SequenceParallel(), f"{b}.ln2": SequenceParallel(),
                         f"{b}.attn": gather(), f"{b}.mlp": gather()})
    if sequence_parallel:
        # (B, T, dim) whole -> this rank's (B, T/tp, dim): a local slice, no traffic
        plan.update({"blocks.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=seq,
                                                    use_local_output=True),
                     "ln_f": SequenceParallel()})
    return parallelize_module(model, mesh["tp"], plan)


class NativeTP:
    """What the engine needs from torch's TP: the global gradient norm (DTensor gradients, each counted once).

    DTensor has already reduced what needs reducing inside backward, and torch's state dicts hold DTensors, so
    there is nothing else to do; checkpoints take torch's model as it is."""

    def __init__(self, model: torch.nn.Module, mesh) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.group = mesh.get_group("tp")

    @staticmethod
    def loss_context() -> contextlib.AbstractContextManager:
        """Forward and backward of a step run inside torch's ``loss_parallel`` (cross-entropy on vocab shards)."""
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def finish_backward(self) -> torch.Tensor:
        """The squared global gradient norm."""
        from torch.distributed.tensor import DTensor, Partial, Replicate

        device = self.params[0].device if self.params else comm.device(self.group)
        split = torch.zeros(1, dtype=torch.float64, device=device)
        whole = torch.zeros((), dtype=torch.float64, device=device)
        for p in self.params:
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor) and any(isinstance(pl, Partial) for pl in g.placements):
                # norms under sequence parallelism: each rank holds its sequence shard's share
                g = p.grad = g.redistribute(placements=[Replicate()] * len(g.placements))
            if isinstance(g, DTensor):
                local = squares(g.to_local())
                if all(isinstance(pl, Replicate) for pl in g.placements):
                    whole += local
                else:
                    split += local
            else:
                whole += squares(g)
        comm.all_reduce(split, "tp.grads", group=self.group)
        return whole + split[0]
