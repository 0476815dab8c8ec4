"""A fleet: its inventory as pyinfra reads it, the hosts a command targets, pyinfra run over them, what the run did
to each rig, and the summary table."""
