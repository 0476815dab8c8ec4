"""`rigkit status`: what each rig runs against what today's data renders: the probe script, drift, one rig judged,
the fleet asked, the report."""
