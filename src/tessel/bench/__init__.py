"""Side-by-side benchmarks on the emulated cluster: scenarios, the runner, and the report."""
