"""`turnout bench`: a load generator in the spirit of Triton's perf_analyzer, for any
server that speaks the v2 protocol."""
