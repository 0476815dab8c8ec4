"""A trivial deploy for the lab tests: one file, so a second run must report no change."""

from io import StringIO

from pyinfra.operations import files

PROBE_PATH = "/etc/rigkit-lab-probe"
PROBE_CONTENT = "rigkit lab probe\n"

files.put(
    name="rigkit lab probe file",
    src=StringIO(PROBE_CONTENT),
    dest=PROBE_PATH,
    mode="644",
)
