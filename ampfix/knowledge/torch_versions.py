"""torch versions ampfix reasons about (import-light: the warm path reads it)."""

#: The oldest torch a project supports when its configuration does not say (`min-torch-version`):
#: the first release with every `torch.amp` spelling the migrations write (`custom_fwd(device_type=)`).
DEFAULT_MIN_TORCH = (2, 4)
