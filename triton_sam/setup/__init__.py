"""Building a model repository: checkpoint -> export -> repository (``pipeline``), the hydra
settings the CLI reads (``settings``) and Paintera's bundle (``paintera``)."""
