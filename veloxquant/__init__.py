"""The `veloxquant` distribution namespace: its subpackages are the repository's top-level folders,
veloxquant.spec, .reference, .accelerated, .conformance, .tools, .golden.

Installed (a wheel, `pip install .`), pyproject.toml's package-dir mapping puts each folder under veloxquant/.
In a source checkout the same names are ordinary packages too: each is a relative symlink in this folder
(veloxquant/spec -> ../spec, ...), so `python -m veloxquant.tools.cli` with PYTHONPATH=<checkout>, an IDE, a
type checker and an import-graph tool all follow `veloxquant.X` to the file without running anything.
"""
