"""Batch job scripts for the systems the suite targets, rendered from site descriptions (docs/jobs.md).

    python -m jobs render --site SITE --bench cosmoflow --nodes 128 [--runs N | --instances M]
        [--config PATH] [--time hh:mm:ss] [--out FILE] [--chain K [--stop-margin S]] [section.key=value ...]
    python -m jobs render --site SITE --bench cosmoflow --nodes 128 --instances M --separate-jobs [--start-at WHEN]
        --out STEM.sh ...
    python -m jobs render --site SITE --bench cosmoflow --nodes 4 --hpo SPACE.yaml --trials T [--study-dir DIR] ...
    python -m jobs sites

SITE: the name of an example in jobs/sites/ or a path to your own YAML.
"""
