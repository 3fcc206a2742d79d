"""The 14 saved 3-round planner cells of docs/benchmarks.md "Where every cell stands": (model, hosts, rate) ->
the bench/ folder holding the run."""

CELLS = {("classifier", 4, "1gbit"): "plan", ("lstm_lm", 4, "1gbit"): "plan-lstm-again",
         ("transformer_lm", 4, "1gbit"): "plan", ("classifier", 4, "200mbit"): "plan",
         ("lstm_lm", 4, "200mbit"): "plan", ("transformer_lm", 4, "200mbit"): "plan",
         ("classifier", 6, "500mbit"): "plan-unseen", ("transformer_lm", 6, "500mbit"): "plan-unseen",
         ("classifier", 8, "1gbit"): "plan-8h", ("transformer_lm", 8, "1gbit"): "plan-8h",
         ("lstm_lm", 8, "1gbit"): "plan-lstm-8h", ("lstm_lm", 8, "200mbit"): "plan-lstm-8h",
         ("transformer_lm", 8, "200mbit"): "plan-tf-8h-200", ("classifier", 8, "200mbit"): "plan-cls-8h-200"}
