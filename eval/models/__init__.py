"""The model a run names and the project's own files: `spec` (the ``model`` config and its checks before any
work), `loading` (hub id or local folder, onto its devices), `placement` (one device or every GPU),
`fingerprint` (the identity of a local folder's bytes), `hub` (is the hub reachable; dataset files from it)
and `paths` (where the configs, bundled models and relative data paths are)."""
