"""Tiny model settings that the tasks' end-to-end tests share (importable as `tiny`, like
`pcn_layout`)."""

# An encoder-decoder of width 16 with two heads (head dim 8), one layer each side.
ENCODER_DECODER = ["model.d_model=16", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
                   "model.d_ff=32"]
ATTENTIONS = ("softmax", "lavo", "gsa", "local")


def attention_args(name: str, window: int, slots: int) -> list[str]:
    """Small settings of attention `name` for a head dim of 8: `window` for lavo and local,
    `slots` for gsa; local keeps softmax at the cross site, a pattern it does not have."""
    if name == "lavo":
        return [f"attention.window={window}", "attention.rank=4"]
    if name == "gsa":
        return [f"attention.slots={slots}"]
    if name == "local":
        return [f"attention.window={window}", "model.cross_attention=softmax"]
    return []
