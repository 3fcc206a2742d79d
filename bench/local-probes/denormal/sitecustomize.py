import os
if "LOCAL_RANK" in os.environ and os.environ.get("FLUSH") == "1":
    import torch
    torch.set_flush_denormal(True)
