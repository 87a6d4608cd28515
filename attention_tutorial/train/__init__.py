"""A small GPT-style language model trained with any differentiable attention implementation of the registry.

``data`` reads the corpus (the Python standard library's own source, byte-level tokens), ``model`` is the flax
GPT whose attention is a registry implementation, ``loop`` trains it and returns result records.
"""

# suffix of a twin run's implementation name: the first implementation again, from weights nudged by one rounding
# step (train.loop.perturb_params); the yardstick site.claims reads loss curves against
TWIN = "_twin"
