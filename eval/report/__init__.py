"""Reports over finished runs: one tidy table of every run, and the paper's figures and tables drawn from it."""
