"""lavo-tasks: LAVO and GSA attention blocks and the CAB tasks built on them."""

__version__ = "0.1.0"
