"""Model weights as a pinned, staged, verified artifact: the source and its revision, the hub fetch onto the
controller, staging into each rig's model store once per fleet, and pinning a revision."""
