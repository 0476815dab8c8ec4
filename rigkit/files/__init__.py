"""Files uploaded to the rig as they are and run there by its own python3: standard library only, never
an import of rigkit (the rig has none). A package so that the deploy and validation import the constants
they share with a file (e.g. l2_janitor's unit, status file and states) from that file itself."""
