"""The pipeline scenario's cut (pp4, one 32-row micro-batch of the classifier, one 8-sequence micro-batch of the
Transformer) as `tessel train` makes it on rank 0 (partition.profile, 5 repeats a layer, then balance), with
equal layers pooled and not, alternating, 10 rounds each; counts the cuts each gave."""
import collections, sys, torch
from tessel.config import load_config
from tessel.resolve import job_of
from tessel.chain import chain_of
from tessel.pipeline.partition import balance, profile, split_text
torch.set_num_threads(1)
models = {"classifier": ["model.name=classifier", "model.layers=8", "model.hidden=1024", "model.in_features=1024",
                         "train.global_batch=128", "train.micro_batches=4"],
          "transformer_lm": ["model.name=transformer_lm", "model.layers=12", "model.dim=128", "data.vocab_size=4096",
                             "data.seq_len=32", "train.global_batch=32", "train.micro_batches=4"]}
for name, over in models.items():
    job = job_of(load_config(None, over))
    torch.manual_seed(0)
    model = job.build(); chain = chain_of(model)
    x, y = job.batch(job.settings.global_batch // 4, 1)
    got = {False: collections.Counter(), True: collections.Counter()}
    for rd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        for pool in ((False, True) if rd % 2 == 0 else (True, False)):
            costs = profile(model, chain, x, y, pool=pool)
            got[pool][split_text(balance([c.seconds for c in costs], 4))] += 1
    print(name, "unpooled", dict(got[False]), "pooled", dict(got[True]), flush=True)
