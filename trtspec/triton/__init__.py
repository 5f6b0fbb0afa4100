"""Triton deployment of the torch flavour: model repository, orchestration model, launcher, client."""
