"""Hugging Face decoder families, registered with tessel by class: their layer chain (pipeline stages) and their
tensor-parallel plan, so ``tessel.prepare`` cuts and shards a ``transformers`` model as it does tessel's own.

Imported by :mod:`tessel.registry` the first time a model from the ``transformers`` package is asked about
(``transformers`` is an optional extra: ``pip install 'tessel[hf]'``). Registered:

- ``LlamaForCausalLM`` and the families with its layout (``MistralForCausalLM``, ``Qwen2ForCausalLM``): chain
  embed_tokens → decoder layers → final norm and lm_head, the loss the model computes from ``labels`` (shifted
  cross-entropy; transformers' own is computed fused with lm_head, a block of rows at a time, so the whole
  logits are never made; a ``loss_function`` the user set runs on whole logits). Each decoder layer recomputes
  its rotary embedding and causal mask from the sequence (what ``LlamaModel.forward`` hands every layer), so only
  the hidden states cross a stage boundary. 1-D tensor parallelism: q/k/v and gate/up by columns, o and down by
  rows, query heads split with their key/value heads (grouped-query attention keeps its grouping on every rank);
  embedding, norms and lm_head whole on every rank.
- ``GPT2LMHeadModel``: chain wte + wpe → blocks → ln_f and the tied lm_head (the token table and the head are one
  weight on two stages: their gradients are summed between the stages, see :func:`tessel.pipeline.ties`). Its
  fused ``Conv1D`` attention has no tensor-parallel plan here (refused with the reason).

A stage runs causal attention on whole sequences: a batch whose ``attention_mask`` masks tokens is refused under
pp or tp (see :func:`tessel.prepare_axes.pair`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .chain import Chain, Layer
from .errors import PlanError
from .models.vocab_head import IGNORE, linear_cross_entropy
from .registry import register_model
from .tensor.grid import Grid
from .tensor.layers import TPLinear
from .tensor.layout import Plan
from .tensor.model import replicated, tp_chain


def _positions(h: torch.Tensor) -> torch.Tensor:
    return torch.arange(h.shape[1], device=h.device).unsqueeze(0)


def _mask(config, h: torch.Tensor, pos: torch.Tensor):
    """The causal mask the model's own forward builds for a batch without padding (None where its attention
    kernel is causal by itself)."""
    from transformers.masking_utils import create_causal_mask

    # positional: the cache argument was named past_key_values before transformers 5
    return create_causal_mask(config, h, None, None, pos)


def _stock_loss(model: nn.Module) -> bool:
    """Whether ``model`` computes transformers' own causal-LM loss (not one its user set in its place)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    return model.loss_function is ForCausalLMLoss


def _fused_loss(model: nn.Module):
    """transformers' causal-LM loss (token t predicts label t + 1, -100 ignored, the mean over counted tokens, the
    softmax in fp32) computed in blocks from the final norm's hidden states (B, T, dim) and lm_head's weight
    (:func:`tessel.models.vocab_head.linear_cross_entropy`): the (B·T, vocab) logits are never made whole."""
    def loss(h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:]  # (B, T)
        head = model.lm_head
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), head.weight, head.bias, shifted.reshape(-1))
    return loss


def _own_loss(model: nn.Module):
    """The loss a user set as ``model.loss_function``, from the last layer's whole logits."""
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size)
    return loss


def _head(m: nn.Module, norm: str, run_norm: Callable) -> tuple[Layer, Callable]:
    """The last layer and the chain's loss: the final norm, then the stock loss fused with lm_head, or lm_head's
    logits for a loss of the user's."""
    if _stock_loss(m):
        return Layer("head", (norm, "lm_head"), lambda r, h: run_norm(r)(h)), _fused_loss(m)
    return Layer("head", (norm, "lm_head"), lambda r, h: r.lm_head(run_norm(r)(h))), _own_loss(m)


def _decoder_layer(i: int):
    def run(r: nn.Module, h: torch.Tensor) -> torch.Tensor:
        pos = _positions(h)
        return r.model.layers[i](h, attention_mask=_mask(r.config, h, pos), position_ids=pos,
                                 position_embeddings=r.model.rotary_emb(h, pos))
    return run


def llama_chain(m: nn.Module) -> Chain:
    """embed_tokens → each decoder layer (with the rotary embedding it needs) → norm and lm_head."""
    layers = [Layer("embed", ("model.embed_tokens",), lambda r, x: r.model.embed_tokens(x))]
    for i in range(len(m.model.layers)):
        layers.append(Layer(f"layers.{i}", (f"model.layers.{i}", "model.rotary_emb"), _decoder_layer(i)))
    head, loss = _head(m, "model.norm", lambda r: r.model.norm)
    return Chain([*layers, head], loss)


def _gpt2_embed(r: nn.Module, x: torch.Tensor) -> torch.Tensor:
    t = r.transformer
    return t.drop(t.wte(x) + t.wpe(_positions(x)))


def _gpt2_block(i: int):
    def run(r: nn.Module, h: torch.Tensor) -> torch.Tensor:
        pos = _positions(h)
        return r.transformer.h[i](h, attention_mask=_mask(r.config, h, pos), position_ids=pos)
    return run


def gpt2_chain(m: nn.Module) -> Chain:
    """wte + wpe → each block → ln_f and lm_head (tied to wte: one weight on the first and the last stage)."""
    layers = [Layer("embed", ("transformer.wte", "transformer.wpe", "transformer.drop"), _gpt2_embed)]
    for i in range(len(m.transformer.h)):
        layers.append(Layer(f"h.{i}", (f"transformer.h.{i}",), _gpt2_block(i)))
    head, loss = _head(m, "transformer.ln_f", lambda r: r.transformer.ln_f)
    return Chain([*layers, head], loss)


def llama_tensor(root: nn.Module, chain: Chain, grid: Grid, plan: Plan, regather: bool = False) -> Chain:
    """1-D tensor parallelism on the decoder layers this stage holds, in place (parameter names kept)."""
    if grid.spec.mode.needs_grid:
        raise PlanError(f"{type(root).__name__} has a 1-D tensor-parallel plan only (Megatron's column and row "
                        f"linears); tp-mode {grid.spec.mode.name} has none here: use --tp-mode 1d")
    cfg, parts = root.config, grid.size(plan.up.out.cols)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if heads % parts or kv % parts:
        raise PlanError(f"{heads} attention heads and {kv} key/value heads do not both split over {parts} ranks; "
                        f"use tp dividing {kv}")
    if getattr(cfg, "tie_word_embeddings", False):
        raise PlanError("tensor parallelism does not support tie_word_embeddings (the table and the head are cut "
                        "differently); untie them")
    for name, module in root.named_modules():
        # a pipeline stage holds some decoder layers; the others are parameter-free Identities
        if name.startswith("model.layers.") and name.count(".") == 2 and not isinstance(module, nn.Identity):
            attn, mlp = module.self_attn, module.mlp
            for proj in ("q_proj", "k_proj", "v_proj"):
                setattr(attn, proj, TPLinear(getattr(attn, proj), plan.up, grid, regather, f"{name}.self_attn.{proj}"))
            attn.o_proj = TPLinear(attn.o_proj, plan.down, grid, regather, f"{name}.self_attn.o_proj")
            mlp.gate_proj = TPLinear(mlp.gate_proj, plan.up, grid, regather, f"{name}.mlp.gate_proj")
            mlp.up_proj = TPLinear(mlp.up_proj, plan.up, grid, regather, f"{name}.mlp.up_proj")
            mlp.down_proj = TPLinear(mlp.down_proj, plan.down, grid, regather, f"{name}.mlp.down_proj")
            for norm in (module.input_layernorm, module.post_attention_layernorm):
                replicated(norm)
    for path in ("model.embed_tokens", "model.norm", "lm_head"):
        replicated(root.get_submodule(path))  # whole on every rank (an Identity on stages that do not hold it)
    # every layer hands on whole hidden states (the head's logits too, where the user's own loss needs them)
    return tp_chain(chain, grid, [plan.residual] * len(chain.layers), loss=chain.loss)


def gpt2_tensor(root: nn.Module, chain: Chain, grid: Grid, plan: Plan, regather: bool = False) -> Chain:
    raise PlanError("GPT-2's attention is one fused Conv1D (q, k and v in one transposed weight), which has no "
                    "tensor-parallel plan here; use dp and pp for GPT2LMHeadModel")


# (module, class) of each family that shares Llama's layout, and GPT-2
LLAMA_LIKE = (("transformers.models.llama.modeling_llama", "LlamaForCausalLM"),
              ("transformers.models.mistral.modeling_mistral", "MistralForCausalLM"),
              ("transformers.models.qwen2.modeling_qwen2", "Qwen2ForCausalLM"))


def register() -> None:
    for module, name in LLAMA_LIKE:
        register_model(getattr(importlib.import_module(module), name), chain=llama_chain, tensor=llama_tensor)
    gpt2 = importlib.import_module("transformers.models.gpt2.modeling_gpt2")
    register_model(gpt2.GPT2LMHeadModel, chain=gpt2_chain, tensor=gpt2_tensor)


register()
