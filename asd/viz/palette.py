"""One palette for every coloring figure, so a color means the same product across plots."""

PALETTE = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
]


def color_of(c: int) -> str:
    """The face color of color class ``c`` (negative: neutral, white)."""
    return "white" if c < 0 else PALETTE[c % len(PALETTE)]
