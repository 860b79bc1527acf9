"""Networks written as aps.torch modules, each a short file naming its paper, trainable by name
(``--model deepfm --model-arg meta=DATA/meta.json``) and meant to be copied as the template of a
user's own: a ``torch.nn.Module`` whose sparse columns go through :class:`aps.torch.Embedding`,
and a ``build`` function whose keyword arguments are its ``--model-arg`` settings."""
