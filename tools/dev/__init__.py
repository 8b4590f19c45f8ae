"""Development tools run from a checkout (GPU probes, kernel checks, one-off measurements); not shipped in the
wheel (pyproject.toml lists the packages it ships, and this one is not among them)."""
