"""Helpers several benchmarks share: `jsonl` (official JSON-lines files read with exact error locations),
`records` (the one checker of data records), `official` (local task files and generation caps), `haystack` (the
bundled haystack texts), `text_metrics` (normalisation, token F1, ROUGE) and `fetching` (downloading a
benchmark's data sources safely)."""
