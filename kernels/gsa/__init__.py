"""GSA (gated slot attention, docs/design.md §2.3 and §2.6): `gsa_attn` for whole
sequences, `gsa_decode_step` for one decode step on a constant-size state; the state
type `GsaState`."""

from .attn import gsa_attn
from .decode import gsa_decode_step
from .state import GsaState

__all__ = ["GsaState", "gsa_attn", "gsa_decode_step"]
