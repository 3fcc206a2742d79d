"""Stage 0 of the pipeline scenario at pp4 m4 under async-predict v1, as the engine runs it, in one process and
thread: per step 4 micro-batches, the first 3 predicted one update ahead (one weight version), the 4th on the live
weights, then SGD (momentum 0.9). Prints the median CPU ms of 10 steps after 3. argv[1]: classifier | transformer
(step0.py imports ``Stage`` to run the same step with the sharing defeated). The forward and backward mirror
PipelineEngine._forward and _backward (tessel/pipeline/runtime.py) on purpose."""
import statistics, sys, time, torch
from torch.func import functional_call
from tessel.pipeline.predict import StageWeights


class Stage:
    def __init__(self, model: str) -> None:
        torch.set_num_threads(1); torch.manual_seed(0)
        if model == "classifier":  # stage 0: 2 layers of 1024 x 1024, 32 rows a micro-batch
            self.net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                           torch.nn.ReLU())
            shape = (32, 1024)
        else:  # 4 blocks of width 128, 8 sequences of 32 tokens a micro-batch
            from tessel.config import load_config
            from tessel.resolve import job_of
            job = job_of(load_config(None, ["model.name=transformer_lm", "model.layers=12", "model.dim=128",
                                            "data.vocab_size=4096", "data.seq_len=32"]))
            self.net = torch.nn.Sequential(*job.build().blocks[:4])
            shape = (8, 32, 128)
        self.params = dict(self.net.named_parameters())
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        self.xs = [torch.randn(*shape) for _ in range(4)]
        self.gs = [torch.randn(*shape) for _ in range(4)]
        self.sw = StageWeights(self.params, self.opt, "predict", stage=0, stages=4, variant="v1", micro=4)

    def step(self, share: bool = True) -> None:
        for i in range(4):
            if not share:
                self.sw._copy = None
            made = self.sw.make(1 if i < 3 else 0)
            x = self.xs[i].clone().requires_grad_(True)
            if made is None:
                out = self.net(x)
            else:
                weights, leaves, ctx, _ = made
                with ctx:
                    out = functional_call(self.net, weights, (x,))
                del weights
            torch.autograd.backward(out, self.gs[i])
            if made is not None:
                for n, leaf in leaves.items():
                    p = self.params[n]
                    if leaf.grad is not None:
                        p.grad = leaf.grad if p.grad is None else p.grad.add_(leaf.grad)
        self.opt.step(); self.opt.zero_grad(); self.sw.updates += 1


if __name__ == "__main__":
    stage, ts = Stage(sys.argv[1]), []
    for _ in range(13):
        c = time.thread_time(); stage.step(); ts.append(time.thread_time() - c)
    print(round(statistics.median(ts[3:]) * 1e3, 2))
