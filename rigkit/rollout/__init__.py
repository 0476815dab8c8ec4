"""Rollouts through canaries and batches, drained from the router rig by rig, and rolling rollbacks: plan, state,
record, the stage skeleton, the canary proof, the summary."""
