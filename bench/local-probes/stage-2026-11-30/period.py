"""pp4 GPipe m8 against dp4 m1 on 4 emulated hosts at 1 Gbit/s, 0.5 core each, CFS period 10 ms against 2 ms;
rounds in alternating order; prints each run's median step and the planner's price."""
import json, sys, itertools
from pathlib import Path
from tessel.cluster.emulate import EmulatedCluster

MODEL = ["--model", "transformer_lm", "--model.layers", "4", "--model.dim", "128", "--data.vocab_size", "4096",
         "--seq-len", "32", "--batch", "32", "--sparse", "dense", "--optimizer", "sgd", "--lr", "0.01",
         "--timeout", "120", "--metrics.progress", "log", "--metrics.plot", "false", "--checkpoint.enabled", "false",
         "--metrics.heldout", "false", "--metrics.memory", "false", "--steps", "12"]
PLANS = {"pp4-gpipe-m8": ["--pp", "4", "--pipeline.schedule", "gpipe", "--micro-batches", "8", "--pipeline.split", "2,1,1,2"],
         "dp4-m1": ["--dp", "4"]}
if __name__ == "__main__":
  rounds = int(sys.argv[1]); out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
  res = []
  for r in range(rounds):
      periods = [10000, 2000] if r % 2 == 0 else [2000, 10000]
      for period in periods:
          names = list(PLANS) if r % 2 == 0 else list(PLANS)[::-1]
          with EmulatedCluster(4, "1gbit", cpus=0.5, prefix="tsper", period_us=period) as c:
              for name in names:
                  where = out / f"r{r}-{period}-{name}"
                  c.run(c.torchrun_commands(["-m", "tessel", "train", *MODEL, *PLANS[name], "--out", str(where.resolve())]), timeout=600)
                  s = json.loads((where / "summary.json").read_text())
                  rec = {"round": r, "period_us": period, "plan": name, "step_ms": s["median_step_time"] * 1e3}
                  res.append(rec); print(json.dumps(rec), flush=True)
  (out / "results.json").write_text(json.dumps(res, indent=1))
