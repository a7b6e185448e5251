"""API migrations: torch.cuda.amp to torch.amp (the bookkeeping of a name migrated with its
import) and NVIDIA apex to native AMP.
"""
