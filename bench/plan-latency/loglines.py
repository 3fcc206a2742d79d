"""The JSON objects a bench script prints after a tag (``where {...}``, ``bytes {...}``) in a combined log, where
the hosts' lines can interleave: each one that parses, in order."""
import json
import re


def tagged(text: str, tag: str) -> list[dict]:
    dec, out = json.JSONDecoder(), []
    for m in re.finditer(re.escape(tag) + r" (\{)", text):
        try:
            out.append(dec.raw_decode(text, m.start(1))[0])
        except ValueError:  # (a line another host's output cut into)
            pass
    return out
