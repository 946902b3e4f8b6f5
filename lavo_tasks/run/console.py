"""Notes to the user on stderr, from the first process only."""

import sys

from lightning.fabric.utilities.rank_zero import rank_zero_only


def notice(message: str) -> None:
    """One line on stderr, `note: <message>`, from the first process only."""
    if rank_zero_only.rank == 0:
        print(f"note: {message}", file=sys.stderr, flush=True)
