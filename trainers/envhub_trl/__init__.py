"""envhub-trl: model-backed generators, a tiny test model, and the ``eval``/``export-sft`` commands for envhub."""
