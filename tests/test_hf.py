"""Hugging Face models through ``tessel.prepare``: equal to the model's own single-process loop, and handed back.

A tiny Llama (2 layers, grouped-query attention: 4 heads over 2 key/value heads) and a tiny GPT-2 (tied head),
built from configs in fp64, trained 5 steps the way their users train them (``model(**batch).loss`` with
``labels``, clipping, an LR schedule) once in one process and once prepared on this world's ranks; the loss of
every step and every weight after ``tessel.unwrap`` compared at 1e-10. Layouts: pp2 (1F1B), tp2 1-D,
dp2 x pp2 x tp2 with AdamW and weight decay; dp2 with the token table served by ps and alltoall (Adagrad and
plain SGD: the optimizers whose row updates are exact); GPT-2 under dp2 and pp2 (its table and head one weight
on two stages). Plus every ``torch.optim`` class under pp2, the batches users write, and the trained model
saved with ``save_pretrained`` and loaded with ``from_pretrained``.
"""

import copy
import inspect

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")  # the 'hf' extra, installed by the 'test' extra

import tessel  # noqa: E402
from tessel import ParallelPlan, TesselError  # noqa: E402
from tessel.data.prepared import slice_batch  # noqa: E402

STEPS, BATCH, SEQ, VOCAB, CLIP, ATOL = 5, 8, 8, 64, 0.5, 1e-10


def causal_lm_loss_fp64(logits, labels, vocab_size, ignore_index=-100, **kwargs):
    """transformers' ForCausalLMLoss (labels shifted, mean over the tokens not ignored) without its cast of the
    logits to float32: that cast rounds an fp64 model's loss to 7 digits, per micro-batch, so a split batch could
    only agree to ~1e-7. Both sides of every test run this one."""
    shift = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), shift, ignore_index=ignore_index)


def _fp64(model, stock=False):
    """``model`` in fp64; ``stock``: with transformers' own loss (which tessel's chain fuses with lm_head; the
    reference then computes causal_lm_loss_fp64 from the model's logits itself), else with causal_lm_loss_fp64 set
    as the model's loss (which tessel's chain runs on whole logits)."""
    if not stock:
        model._loss_function = causal_lm_loss_fp64
    return model.double()


def llama(stock=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return _fp64(LlamaForCausalLM(cfg), stock)


def gpt2(stock=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return _fp64(GPT2LMHeadModel(cfg), stock)


MODELS = {"llama": llama, "gpt2": gpt2}
OPTIMIZERS = {"adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
              "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
              "sgd": lambda p: torch.optim.SGD(p, lr=0.5)}


def batches(n=STEPS):
    """Global batches as a Hugging Face loader yields them."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def _setup(name, opt_name, stock=False):
    model = MODELS[name](stock)
    opt = OPTIMIZERS[opt_name](model.parameters())
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))


def reference(name, opt_name, stock=False):
    """The model's own single-process loop: (losses, weights after STEPS steps); ``stock``: the loss written here
    from the model's logits."""
    model, opt, sched = _setup(name, opt_name, stock)
    losses = []
    for batch in batches():
        if stock:
            loss = causal_lm_loss_fp64(model(input_ids=batch["input_ids"]).logits, batch["labels"], VOCAB)
        else:
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(float(loss))
    return losses, model.state_dict()


def run(name, opt_name, plan, save_to=None, stock=False):
    """The same loop prepared on this world: (losses, the unwrapped model's weights, its held-out loss and that of
    the folder save_pretrained wrote, loaded with from_pretrained)."""
    model, opt, sched = _setup(name, opt_name, stock)
    axes = isinstance(plan, ParallelPlan) and (plan.pp > 1 or plan.tp > 1)
    model, opt, loader = tessel.prepare(model, opt, batches(), plan=plan, max_norm=CLIP if axes else 0.0,
                                        lazy=False, verbose=False)
    losses = []
    for batch in loader:
        if axes:
            loss = model.step(batch)
        else:
            loss = model(**batch).loss
            loss.backward()
            tessel.clip_grad_norm_(model, CLIP)
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            tessel.comm.all_reduce(mean, "meta")
            loss = mean / dist.get_world_size()
        sched.step()
        losses.append(float(loss))
    held = batches(STEPS + 1)[-1]
    # the dict batch's forwards alone (through the stages and blocks under pp/tp), its mean loss on every rank
    evaluated = [float(model.evaluate(b)) for b in loader.sliced([held])]
    plain = tessel.unwrap(model)
    # transformers' own loss upcasts the logits to fp32; the stock cases' loop loss is fp64 on them (as reference's)
    loss = (causal_lm_loss_fp64(plain(input_ids=held["input_ids"]).logits, held["labels"], VOCAB) if stock
            else plain(**held).loss)
    out = {"losses": losses, "state": plain.state_dict(), "held": float(loss), "evaluated": evaluated}
    if save_to is not None and dist.get_rank() == 0:
        plain.save_pretrained(save_to)
        out["loaded"] = float(_fp64(type(plain).from_pretrained(save_to, dtype=torch.float64))(**held).loss)
    return out


def _compare(got, want):
    losses, state = want
    assert max(abs(a - b) for a, b in zip(got["losses"], losses)) < ATOL, (got["losses"], losses)
    assert set(got["state"]) == set(state)
    for n, w in state.items():
        torch.testing.assert_close(got["state"][n], w, rtol=0, atol=ATOL, msg=n)


CASES = {  # id -> (model, optimizer, plan, world[, transformers' own loss: fused with lm_head by tessel's chain])
    "llama-pp2": ("llama", "adamw", ParallelPlan(dp=1, pp=2, micro_batches=2), 2),
    "llama-tp2": ("llama", "adamw", ParallelPlan(dp=1, tp=2, tp_grid=(2,)), 2),
    "llama-dp2-ps-adagrad": ("llama", "adagrad", "ps", 2),
    "llama-dp2-ps-sgd": ("llama", "sgd", "ps", 2),
    "llama-dp2-alltoall-adagrad": ("llama", "adagrad", "alltoall", 2),
    "llama-dp2-alltoall-sgd": ("llama", "sgd", "alltoall", 2),
    "gpt2-dp2": ("gpt2", "adamw", "auto", 2),
    "gpt2-pp2": ("gpt2", "adamw", ParallelPlan(dp=1, pp=2, micro_batches=2), 2),
    "llama-dp2-pp2-tp2": ("llama", "adamw", ParallelPlan(dp=2, pp=2, tp=2, tp_grid=(2,), micro_batches=2), 8),
    "llama-pp2-fused": ("llama", "adamw", ParallelPlan(dp=1, pp=2, micro_batches=2), 2, True),
    "llama-tp2-fused": ("llama", "adamw", ParallelPlan(dp=1, tp=2, tp_grid=(2,)), 2, True),
    "gpt2-pp2-fused": ("gpt2", "adamw", ParallelPlan(dp=1, pp=2, micro_batches=2), 2, True),
}


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][3] == 2])
def test_hf_model_under_prepare_equals_its_own_loop(world2, case):
    name, opt_name, plan, _, *stock = CASES[case]
    want = reference(name, opt_name, *stock)
    for got in world2.run(run, name, opt_name, plan, None, *stock):
        _compare(got, want)
        # model.evaluate equals the unwrapped model's own loss on the batch
        assert abs(got["evaluated"][0] - got["held"]) < ATOL, (got["evaluated"], got["held"])


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_own_loss_is_fused_with_the_head_and_a_users_runs_on_logits(name):
    """The chain's last layer hands on the final norm's hidden states where the model computes transformers' own
    loss (the loss then runs lm_head a block at a time), and the logits where the user set a loss of their own;
    both give the loss and gradients of the cross-entropy written here, with ignored labels."""
    from tessel.registry import spec_of

    batch = batches(1)[0]
    batch["labels"][:, :3] = -100
    for stock in (True, False):
        model = MODELS[name](stock)
        chain = spec_of(model).chain(model)
        h = batch["input_ids"]
        for layer in chain.layers:
            h = layer.run(model, h)
        assert h.shape == (BATCH, SEQ, 16 if stock else VOCAB), (stock, h.shape)
        loss = chain.loss(h, batch["labels"])
        loss.backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        want = causal_lm_loss_fp64(model(input_ids=batch["input_ids"]).logits, batch["labels"], VOCAB)
        want.backward()
        assert abs(float(loss) - float(want)) < 1e-12, (stock, float(loss), float(want))
        for n, p in model.named_parameters():
            torch.testing.assert_close(got[n], p.grad, rtol=0, atol=1e-12, msg=n)


def test_llama_on_dp2_pp2_tp2_equals_its_own_loop_and_saves_as_a_hf_model(world8, tmp_path):
    name, opt_name, plan, _ = CASES["llama-dp2-pp2-tp2"]
    want = reference(name, opt_name)
    got = world8.run(run, name, opt_name, plan, str(tmp_path / "saved"))
    for g in got:
        _compare(g, want)
        assert abs(g["evaluated"][0] - g["held"]) < ATOL, (g["evaluated"], g["held"])  # dp2 x pp2 x tp2's forwards
    # save_pretrained -> from_pretrained gives the model that was trained: the same held-out loss
    assert abs(got[0]["loaded"] - got[0]["held"]) < ATOL and (tmp_path / "saved" / "config.json").is_file()


def every_optimizer():
    """Each torch.optim class through prepare with a pp2 plan on the tiny Llama, 2 steps: (name, max weight error
    against one process) or (name, the one-line refusal)."""
    out = {}
    classes = [getattr(torch.optim, n) for n in dir(torch.optim)]
    for cls in sorted({c for c in classes if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
                       and c is not torch.optim.Optimizer}, key=lambda c: c.__name__):
        kwargs = {"lr": 0.01} if "lr" in inspect.signature(cls.__init__).parameters else {}

        def make(params, cls=cls, kwargs=kwargs):
            params = list(params)
            return cls([p for p in params if p.dim() == 2], **kwargs) if cls.__name__ == "Muon" else cls(params,
                                                                                                       **kwargs)
        torch.manual_seed(3)
        ref = llama()
        model = copy.deepcopy(ref)
        try:
            prepared, _, loader = tessel.prepare(model, make(model.parameters()), batches(2),
                                                 plan=ParallelPlan(dp=1, pp=2), verbose=False)
        except TesselError as e:
            out[cls.__name__] = ("refused", str(e))
            continue
        for batch in loader:
            prepared.step(batch)
        opt = make(ref.parameters())
        for batch in batches(2):
            ref(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        state, plain = ref.state_dict(), tessel.unwrap(prepared).state_dict()
        out[cls.__name__] = ("ran", max(float((plain[n] - w).abs().max()) for n, w in state.items()))
    return out


def test_every_torch_optimizer_under_pp2_matches_one_process_or_is_refused_in_one_line(world2):
    got = world2.run(every_optimizer)[0]
    assert {"SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "LBFGS"} <= set(got)
    ran = {n for n, (how, _) in got.items() if how == "ran"}
    assert {"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop",
            "Rprop"} <= ran, got
    for name, (how, what) in got.items():
        if how == "ran":
            assert what < ATOL, (name, what)
        else:
            assert "\n" not in what and name in what, (name, what)
    assert "closure" in got["LBFGS"][1]


def test_batches_as_users_write_them():
    d = {"input_ids": torch.arange(8).view(4, 2), "labels": torch.arange(8).view(4, 2)}
    assert slice_batch(d, 1, 2)["input_ids"].tolist() == [[4, 5], [6, 7]]
    assert slice_batch((torch.arange(4), torch.arange(4)), 0, 2)[1].tolist() == [0, 1]
    with pytest.raises(TesselError, match="cannot be split over 2 ranks") as e:
        slice_batch({"input_ids": torch.zeros(4, 2), "labels": torch.zeros(3, 2)}, 0, 2)
    assert "\n" not in str(e.value)
    with pytest.raises(TesselError, match="a tensor, a tuple/list or a dict of tensors"):
        slice_batch({"input_ids": torch.zeros(4, 2), "note": "text"}, 0, 2)
    from tessel.prepare_axes import pair

    with pytest.raises(TesselError, match="lacks labels"):
        pair({"input_ids": torch.zeros(4, 2)})
    with pytest.raises(TesselError, match="masks tokens"):
        pair({"input_ids": torch.zeros(4, 2), "labels": torch.zeros(4, 2), "attention_mask": torch.zeros(4, 2)})


@pytest.mark.parametrize("plan,size", [("dp2-pp2", 4), ("auto", 2)])
def test_hf_llama_example_runs_and_its_folder_loads(tmp_path, plan, size, request):
    """The example's loop on the ranks of a test world (the processes ``tessel run --nproc`` would start; the
    launch itself is test_prepare's)."""
    import re

    import trained

    world = request.getfixturevalue(f"world{size}")
    argv = ["--plan", plan, "--steps", "4", "--out", str(tmp_path / "out")]
    printed = world.run(trained.run_example, "hf_llama", argv, timeout=300)[0]
    found = re.search(r"held-out loss ([0-9.]+) trained, ([0-9.]+) loaded with from_pretrained", printed)
    assert found and found.group(1) == found.group(2), printed
    evaluated = re.search(r"held-out loss ([0-9.]+) by model.evaluate", printed)
    assert evaluated and abs(float(evaluated.group(1)) - float(found.group(1))) < 2e-4, printed  # fp32, 4 places
    assert (tmp_path / "out" / "config.json").is_file()
