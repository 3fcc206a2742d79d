"""The peer: torch's own 1-D tensor parallelism (``parallelize_module`` with Colwise/Rowwise) on the plain model.

The plan is the one torch's TP tutorial gives a Llama-style model: q/k/v and fc_in column-wise, out_proj
and fc_out row-wise, the token table cut by vocabulary (row-wise, replicated input), the head column-wise
with its logits gathered (``output_layouts=Replicate()``) so the model's own cross-entropy runs unchanged.
Norms and positions stay replicated; their gradients are equal on every rank, so they need no reduction.
"""

from __future__ import annotations

import torch

from .. import comm
from ..errors import PlanError


def parallelize_native(model, mesh) -> torch.nn.Module:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if getattr(model, "softmax", "full") != "full" or not hasattr(model, "blocks"):
        raise PlanError("tensor.mode 'torch-1d' applies to transformer_lm with softmax 'full'")
    tp_mesh = mesh["tp"]
    plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")})
        plan[f"blocks.{i}.attn.out_proj"] = RowwiseParallel()
        plan[f"blocks.{i}.mlp.fc_in"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.fc_out"] = RowwiseParallel()
    return parallelize_module(model, tp_mesh, plan)


class NativeTP:
    """What the engine needs from torch's TP: the global gradient norm (DTensor gradients, each counted once).

    DTensor has already reduced what needs reducing inside backward, and torch's state dicts hold DTensors, so
    there is nothing else to do; checkpoints take torch's model as it is."""

    def __init__(self, model: torch.nn.Module, mesh) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.group = mesh.get_group("tp")

    def finish_backward(self) -> torch.Tensor:
        """The squared global gradient norm."""
        from torch.distributed.tensor import DTensor, Replicate

        split = torch.zeros(1, dtype=torch.float64)
        whole = torch.zeros((), dtype=torch.float64)
        for p in self.params:
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                local = g.to_local().double().pow(2).sum()
                if all(isinstance(pl, Replicate) for pl in g.placements):
                    whole += local
                else:
                    split += local
            else:
                whole += g.double().pow(2).sum()
        comm.all_reduce(split, "tp.grads", group=self.group)
        return whole + split[0]
