"""The model: which architectures are supported (families), loading checkpoints (Hub id, folder, GGUF, the built-in
default) and the built-in model."""
