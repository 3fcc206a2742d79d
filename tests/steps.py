"""Train a distributed model and its single-process reference side by side, checking every step."""

import torch

from tessel import comm


def step_side_by_side(engine, ref_engine, loader, ref_loader, steps: int, world: int, atol: float):
    """``steps`` engine steps on both; the global norm and mean loss must agree each step. Returns the last
    reference result."""
    for step in range(steps):
        x, y = loader.next_batch()
        rx, ry = ref_loader.next_batch()
        rng = torch.get_rng_state()
        upcoming = loader.peek()[0] if step + 1 < steps else None  # scheduled sparse tables fetch ahead
        res = engine.step(x, y, step, upcoming)
        torch.set_rng_state(rng)  # the sampled softmax draws the same candidates in the reference
        ref_res = ref_engine.step(rx, ry, step)
        assert abs(res.grad_norm - ref_res.grad_norm) < atol, (res.grad_norm, ref_res.grad_norm)
        mean = torch.tensor([res.loss], dtype=torch.float64)
        comm.all_reduce(mean, "meta")
        assert abs(float(mean) / world - ref_res.loss) < atol
    return ref_res


def engine_for(model, train_cfg, tp=None, tables=None):
    """An unpipelined engine over ``model`` with its own optimizer and the shared step tail."""
    from tessel.train.engine import Engine
    from tessel.train.optim import build_optimizer
    from tessel.train.tail import StepTail

    optimizer = build_optimizer(model.parameters(), train_cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    return Engine(model, StepTail(params, optimizer, train_cfg, tp=tp, tables=tables), tables)
