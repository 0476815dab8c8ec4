"""Rollouts through canaries and batches, drained from the router rig by rig, and rolling rollbacks: plan, state, record, stages, the canary proof, the summary."""
