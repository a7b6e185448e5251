"""What ampfix knows about the libraries it checks: the torch.cuda.amp API and its
torch.amp spellings, NVIDIA apex's API and its torch replacements.
"""
