"""Data generators (ListOps, Pathfinder) that write the official file layouts."""
